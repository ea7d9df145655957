"""The outcome of one replay, and the rule that judges it (exit codes included).

"reproduced" (exit 1) only when the observed failure has the recorded signature; any other
failure is "different failure" (3), no failure is "passed" (0). No failure where the replay
could not honour what the archive records of the failing run is "inconclusive" (125, spec
§12): the recording was symbolic but its shape policy is unknown (the replay compiled static
shapes), or the graph draws random numbers and the RNG state is unknown (it drew other
numbers); a pass there says nothing about the recorded failure. ``git bisect run`` reads these
codes: 0 good, 1-127 bad, 125 skip (inconclusive, or cannot run here, raised as an error
elsewhere).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from reproarchive.context import failure as _failure
from reproarchive.format.plain import from_plain, to_plain
from reproarchive.format.schema import AccuracyReport, FailureRecord
from reproarchive.package_version import torch_release
from reproarchive.replay.verdict_rule import (  # noqa: F401 - the verdicts and their codes, re-exported
    DIFFERENT,
    EXIT_DIFFERENT,
    EXIT_INCONCLUSIVE,
    EXIT_PASSED,
    EXIT_REPRODUCED,
    INCONCLUSIVE,
    PASSED,
    REPRODUCED,
)

#: Passed, but only compiled (``replay.compile_only``): the compile that failed now succeeds for
#: the recorded device, which was not here; nothing ran, so it is not "good" (0).
EXIT_COMPILED_ONLY = 6


@dataclasses.dataclass
class Outcome:
    """What one replay found; ``to_dict()`` is what ``reproarchive run --json`` prints.

    status: "passed", "reproduced", "different failure" or "inconclusive" (no failure, but not
    under the recorded conditions: ``unfaithful`` says which); exit_code: 0 (6 when it only
    compiled), 1, 3 or 125 to match.
    observed / recorded: failure records (None when it passed / when nothing was recorded).
    accuracy: the compiled-vs-eager comparison with per-output figures, when it was checked.
    differences: what differs between the recording machine and this one that could explain
    a different outcome (system, config, environment), as {"what", "name", "recorded", "current"}.
    device / recorded_device: where it ran and where the archive was recorded;
    same_device_type: False when the caller moved a recorded device to another device type
    (``--device cpu`` for a CUDA archive): then a pass is no evidence about the recorded device.
    shapes: the dynamic-shape policy the replay used: ``policy`` ("recorded" or "not
    recorded"), ``symbolic``, the symbolic dimensions and unbacked symbols, and the recorded
    and replayed guards with ``guards_match`` (None: not compared; see ``replay.shape_policy``).
    stand_ins: custom ops this process did not have, replayed from their recorded outputs.
    randomness: whether the graph draws random numbers and whether the recorded RNG state was
    restored (or is unknown); accuracy_rule: the rule accuracy was judged under, when checked.
    torch / recorded_torch: the torch version that replayed it and the one that recorded it
    (None: not recorded); ``across_versions`` when their releases differ, and then a verdict
    is about this torch, not the recorded one ("PASSED on torch X (recorded on Y)").
    compile_only: the replay compiled the graph and ran nothing, and for what (``compiled for
    cuda:0 sm_90 (NVIDIA H200) without the device``); a pass then exits 6, not 0.
    """

    status: str
    exit_code: int
    observed: FailureRecord | None
    recorded: FailureRecord | None
    accuracy: AccuracyReport | None = None
    differences: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    device: str = "cpu"
    recorded_device: str | None = None
    same_device_type: bool = True
    backend: str = ""
    warnings: list[str] = dataclasses.field(default_factory=list)
    ran_backward: bool = False
    config: str = "recorded"
    isolated: bool = False
    archive: str | None = None
    digest: str | None = None
    shapes: dict[str, Any] | None = None
    stand_ins: list[str] = dataclasses.field(default_factory=list)  # custom ops replayed from recorded outputs
    randomness: str | None = None
    accuracy_rule: str | None = None
    torch: str | None = None
    recorded_torch: str | None = None
    unfaithful: list[str] = dataclasses.field(default_factory=list)  # what the replay could not honour
    compile_only: str | None = None  # compiled and launched nothing: for what (``replay.compile_only``)

    @property
    def across_versions(self) -> bool:
        return across_versions(self.torch, self.recorded_torch)

    @property
    def kind(self) -> str:
        """passed, compile error, runtime error (forward/backward), accuracy failure or crash."""
        return _failure.failure_kind(self.observed)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (what ``run --json`` prints); the records in their archive form."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for key in ("observed", "recorded", "accuracy"):
            if data[key] is not None:
                data[key] = to_plain(data[key])
        data["kind"] = self.kind
        data["across_versions"] = self.across_versions
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Outcome":
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        for key, record in (("observed", FailureRecord), ("recorded", FailureRecord), ("accuracy", AccuracyReport)):
            if values.get(key) is not None:
                values[key] = from_plain(record, values[key])
        return cls(**values)


def across_versions(here: str | None, recorded: str | None) -> bool:
    """Whether a replay on torch ``here`` of an archive recorded on ``recorded`` crossed torch
    releases (both known, releases differ)."""
    return bool(here and recorded) and torch_release(here) != torch_release(recorded)


def judged(recorded: FailureRecord | None, observed: FailureRecord | None, **facts: Any) -> "Outcome":
    """The outcome of a replay that observed ``observed`` where ``recorded`` was recorded."""
    status, exit_code = judge(recorded, observed)
    return Outcome(status=status, exit_code=exit_code, observed=observed, recorded=recorded, **facts)


def unless_faithful(outcome: Outcome, unfaithful: list[str]) -> Outcome:
    """``outcome``, made inconclusive (125) where it passed without honouring what the archive
    records of the failing run (``unfaithful``: what was not honoured, in words). An archive
    that records no failure (``pack`` of a graph that ran, a dump packed without its replay)
    has no failing run to be unfaithful to: a pass there says only that it runs."""
    recorded = outcome.recorded
    if recorded is None or recorded.stage == "unknown":
        return outcome
    outcome.unfaithful = list(unfaithful)
    if outcome.status == PASSED and unfaithful:
        outcome.status, outcome.exit_code = INCONCLUSIVE, EXIT_INCONCLUSIVE
    return outcome


def with_stand_ins(outcome: Outcome, names: list[str]) -> Outcome:
    """``outcome`` of a replay in which the custom ops (or Triton kernels, ``triton:NAME``)
    ``names`` were stood in for: their recorded outputs replaced code that did not run here, so a
    pass is no evidence that the failure is gone (``unless_faithful``: inconclusive, 125). A
    replay that failed because a stand-in was called with inputs no recorded call had could not
    run the op at all: that failure is the replay's, not another of the program's, and is
    inconclusive too (a "different failure", 3, would read as bad to ``git bisect``)."""
    outcome.stand_ins = list(names)
    said = [f"{'Triton kernel ' + n.removeprefix('triton:') if n.startswith('triton:') else 'custom op ' + n} "
            "was stood in: its recorded outputs replaced its implementation, which did not run here "
            "(bring it with --import or --load-library)" for n in names]
    if said and _failure.is_stand_in_miss(outcome.observed) and outcome.status != REPRODUCED:
        outcome.unfaithful = [*outcome.unfaithful, "a stand-in was called with inputs no recorded call had, so the "
                              "replay could not run the op", *said]
        outcome.status, outcome.exit_code = INCONCLUSIVE, EXIT_INCONCLUSIVE
        return outcome
    return unless_faithful(outcome, [*outcome.unfaithful, *said]) if said else outcome


def judge(recorded: FailureRecord | None, observed: FailureRecord | None) -> tuple[str, int]:
    if observed is None:
        return PASSED, EXIT_PASSED
    if _failure.same_failure(recorded, observed):
        return REPRODUCED, EXIT_REPRODUCED
    return DIFFERENT, EXIT_DIFFERENT
