"""What a bisection found, as typed records: the ``--json`` document of ``bisect compiler`` and
``bisect torch``, and the sidecar file (``ARCHIVE.bisect.json``) that keeps the compiler's
answer next to the archive it is about.

A sidecar is read back through the same declarations (``read_bisection``), so a tool that opens
it gets a checked record, never a raw dict; ``spec/json/reports.schema.json`` describes it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
from pathlib import Path

from reproarchive.bisect.config_flags import FlagSearch
from reproarchive.format.atomic import atomic_file
from reproarchive.format.plain import PlainRecord, from_plain

# verdicts of one replay, from the point of view of the recorded failure
GOOD = "good"  # it passed: the recorded failure did not appear
BAD = "bad"  # the recorded failure (its strict signature) appeared
OTHER = "different failure"  # a failure with another signature: not "bad", reported as such
SKIPPED = "skipped"  # cannot run or load here (git bisect's 125)

SIDECAR_SUFFIX = ".bisect.json"


@dataclasses.dataclass(frozen=True)
class Trial:
    """Settings under which one replay ran: the backend, the ``TORCH_BISECT_*`` variables that
    PyTorch's bisector reads, and inductor config values. ``command`` is the same as a shell
    line that replays the archive so, for a person to paste."""

    backend: str
    env: dict[str, str]
    config: dict[str, str]  # torch config name -> Python literal of the value

    def command(self, archive: str) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        line = f"reproarchive run {shlex.quote(archive)} --backend {shlex.quote(self.backend)}"
        return f"{env} {line}".strip()


@dataclasses.dataclass(frozen=True)
class BisectStep:
    """One replay of the bisection: what PyTorch's bisector asked for and what it saw."""

    backend: str  # the bisector's backend stage
    subsystem: str | None
    state: str | None  # the bisector's run state: test_disable, find_max_bounds, bisect
    bisect_range: tuple[int, ...] | None  # bisect: (low, high); applications past the middle are off
    trial: Trial
    verdict: str  # good, bad, different failure, skipped
    observed: str | None  # the observed failure's signature, if any
    seconds: float
    replayed: bool  # False: a stage before --from, taken as good without a replay


@dataclasses.dataclass(frozen=True)
class CompilerBisection(PlainRecord):
    """What ``bisect compiler`` found; ``to_plain()`` is its ``--json`` and the sidecar.

    status: "found" (a backend, and where PyTorch could tell, a subsystem and the application
    that makes the failure appear), "not reproduced" (no backend, the archive's included, shows
    the recorded failure here), or "incomplete" (--max-time or Ctrl-C ended it first).
    ``appear`` / ``disappear``: the settings that make the recorded failure appear and
    disappear (the last bad and first good trial around the culprit).
    """

    archive: str
    digest: str
    torch: str
    status: str
    backend: str | None
    subsystem: str | None
    bisect_number: int | None
    debug_info: str | None
    replayed_backend: str  # what replays at the "inductor" stage: the archive's or --backend
    appear: Trial | None
    disappear: Trial | None
    steps: tuple[BisectStep, ...]
    replays: int
    other_failures: int
    seconds: float
    pytorch_log: tuple[str, ...]  # what torch._inductor.compiler_bisector printed, in order
    # which recorded non-default Inductor settings the failure needs (``config_flags``); None
    # where the stage search did not end at inductor
    config_flags: FlagSearch | None = None

    COMPUTED = ("summary",)

    @property
    def culprit_backend(self) -> str | None:
        """The backend to blame: the stage PyTorch's bisector named, except at its last stage
        ("inductor"), where the archive's own backend replayed (a custom compiler, PyTorch's
        debugging backends): the failure is in that one, which need not be Inductor."""
        if self.backend == "inductor" and self.replayed_backend not in (None, "inductor"):
            return self.replayed_backend
        return self.backend

    @property
    def summary(self) -> str:
        """One line: where the failure is, or why nothing was named; and the settings it needs."""
        flags = f"; {self.config_flags.text}" if self.config_flags is not None else ""
        if self.status == "found" and self.backend is None and self.config_flags is not None:  # --config-only
            return f"the failure {self.config_flags.text.removeprefix('it ')}"
        if self.status != "found" or self.backend is None:
            return f"bisect compiler: {self.status}{flags}"
        parts = [f"backend {self.culprit_backend}"]
        if self.subsystem:
            parts.append(f"subsystem {self.subsystem}")
        if self.bisect_number is not None:
            parts.append(f"bisect number {self.bisect_number}")
        if self.debug_info:
            parts.append(f"({self.debug_info})")
        return "the failure is in " + ", ".join(parts) + flags


def sidecar_path(archive: str | os.PathLike) -> Path:
    return Path(os.fspath(archive) + SIDECAR_SUFFIX)


def write_bisection(result: CompilerBisection, archive: str | os.PathLike) -> Path:
    """``ARCHIVE.bisect.json``, written whole or not at all."""
    path = sidecar_path(archive)
    with atomic_file(path) as f:
        f.write((json.dumps(result.to_plain(), indent=1, sort_keys=True) + "\n").encode())
    return path


def read_bisection(archive: str | os.PathLike) -> CompilerBisection:
    """The bisection stored next to ``archive``, checked against its declaration."""
    return from_plain(CompilerBisection, json.loads(sidecar_path(archive).read_text(encoding="utf-8")))


def failed_of(replays: tuple[str, ...]) -> str:
    """``1 of 3 replays failed``: of the replays that passed or failed as recorded, one count for
    the verdict's reason and the summary."""
    judged = [r for r in replays if r in (GOOD, BAD)]
    return f"{judged.count(BAD)} of {len(judged)} replays failed"


@dataclasses.dataclass(frozen=True)
class EnvVerdict:
    """One environment's replay: who read the archive there, and what it found."""

    python: str  # the interpreter, as given
    python_version: str | None
    torch: str | None
    git_version: str | None  # torch.version.git_version: the commit torch was built from
    reader: str  # "installed reproarchive V (path)", "bundled: ...", or "none"
    verdict: str  # good, bad, different failure, skipped (cannot load here)
    exit_code: int | None
    reason: str | None  # why it was skipped, or the different failure's signature
    seconds: float
    #: each replay's own verdict, in order (``--repeat``): the verdict above is bad when any was
    #: bad, so a flaky failure is counted, and ``flaky`` says the replays disagreed
    replays: tuple[str, ...] = ()
    built_from: str | None = None  # the --torch spec the environment was built for

    COMPUTED = ("flaky", "label")

    @property
    def label(self) -> str:
        """How a person names the environment: ``torch 2.13.0 (<python>)`` for one built from a
        --torch spec, else its interpreter."""
        if self.built_from is None:
            return self.python
        return f"torch {self.built_from}" + (f" ({self.python})" if self.python != self.built_from else "")

    @property
    def flaky(self) -> bool:
        """Some replays passed and others failed (the recorded failure or another); a replay that
        could not run (a timeout, no verdict) is neither."""
        return GOOD in self.replays and bool({BAD, OTHER} & set(self.replays))


@dataclasses.dataclass(frozen=True)
class Flakiness:
    """What ``bisect torch`` measured at its first bad environment, and the replays it chose
    for the good ones before it (``bisect.flakiness``)."""

    environment: str  # the interpreter measured
    failed: int  # replays that failed as recorded
    replays: int  # replays that passed or failed as recorded
    repeat: int  # replays given to each good environment before it (1: the failure is stable)


@dataclasses.dataclass(frozen=True)
class TorchBisection(PlainRecord):
    """What ``bisect torch`` found; ``to_plain()`` is its ``--json``.

    status: "found" (a first bad environment after a good one), "no bad environment", "no good
    environment before the first bad one" (nothing was compared: no culprit), or "incomplete"
    (--max-time).
    ``commit_range``: ``GOOD..BAD`` torch commits, from the last good environment before the
    first bad one, when both report a git version.
    """

    archive: str
    status: str
    verdicts: tuple[EnvVerdict, ...]
    first_bad: str | None
    last_good: str | None
    commit_range: str | None
    seconds: float
    python: str  # the interpreter that ran the bisection
    #: what the default --repeat measured at the first bad environment (None: --repeat was given,
    #: or no good environment came before it)
    flakiness: Flakiness | None = None

    COMPUTED = ("summary",)

    @property
    def summary(self) -> str:
        if self.first_bad is None:
            return f"bisect torch: {self.status}"
        bad = next(v for v in self.verdicts if v.python == self.first_bad and v.verdict == BAD)
        if self.last_good is None:
            return (f"bisect torch: {bad.label} is bad, but no environment before it is good: nothing was "
                    "compared, so no torch is to blame (put an environment that passes before it)")
        good = next(v for v in self.verdicts if v.python == self.last_good and v.verdict == GOOD)
        flaky = f"; flaky there: {failed_of(bad.replays)}" if bad.flaky else ""
        if self.flakiness is not None and self.flakiness.repeat > 1:
            flaky += f" (each good environment before it was replayed {self.flakiness.repeat} times)"
        return f"the first bad environment is {bad.label} (the last good one before it: {good.label}){flaky}"
