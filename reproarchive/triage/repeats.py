"""A group's replay, repeated: one verdict from several replays, and whether they agreed.

One replay says what one run of a compiler did. A failure that shows one time in two (a race in
a compile worker, an uninitialised buffer, an autotuner's pick) is called fixed by one lucky
replay, and a group marked fixed is closed: the bug is lost. syzkaller replays each crash many
times and calls it gone only when no replay shows it. Triage does the same for each group's
representative: by default ``MEASURE`` replays, each in a fresh process (a process's caches must
not carry one replay's luck into the next), run side by side on the executor.

The replays become one verdict (``combined``):

- ``status``: reproduced when any replay reproduced the recorded failure (one failure is the
  bug), else a different failure when any saw one, else passed; the rest of the record is that
  replay's. Replays that could not run (crashed, timed out, error) count only when none could.
- ``replays``: every replay's status, so ``measured`` can say "stable" (all that ran agree) or
  "flaky" (they disagree) and how often it failed.

A cached verdict with fewer replays than asked for is topped up: only the missing replays run.
A flaky group is minified with each candidate judged by several replays (``judging_repeat``):
one lucky pass would otherwise throw the failing op away.
"""

from __future__ import annotations

import dataclasses

from reproarchive.bisect.flakiness import MEASURE, repeat_for
from reproarchive.format.plain import PlainRecord
from reproarchive.replay.outcome import DIFFERENT, PASSED, REPRODUCED
from reproarchive.triage.verdicts import Verdict

STABLE, FLAKY = "stable", "flaky"


def replays_wanted(repeat: int | None) -> int:
    """How many replays a representative gets: ``repeat``, or ``MEASURE`` by default."""
    return MEASURE if repeat is None else repeat


def combined(verdicts: list[Verdict]) -> Verdict:
    """One replay verdict from ``verdicts`` (each one replay, or an earlier combination of
    several, e.g. a cached one being topped up); the module docstring's rule."""
    statuses = tuple(s for v in verdicts for s in (v.replays or (v.status,)))
    if len(statuses) == 1:
        return verdicts[0]
    ran = [v for v in verdicts if not v.failed_to_run]
    chosen = next((v for status in (REPRODUCED, DIFFERENT, PASSED) for v in ran if v.status == status), None)
    if chosen is None:  # none reproduced, differed or passed: inconclusive, or none could run
        chosen = ran[0] if ran else verdicts[0]
    return dataclasses.replace(chosen, replays=statuses,
                               elapsed_s=round(sum(v.elapsed_s for v in verdicts), 3),
                               finished=max(v.finished for v in verdicts))


@dataclasses.dataclass(frozen=True)
class Repeats(PlainRecord):
    """What a group's repeated replay measured: ``kind`` STABLE (every replay that ran agreed) or
    FLAKY; ``failed`` of ``replays`` replays (those that ran) reproduced the recorded failure."""

    kind: str
    failed: int
    replays: int
    status: str  # the combined verdict's status
    COMPUTED = ("text",)

    @property
    def text(self) -> str:
        """``flaky: reproduced 2 of 4`` / ``stable: reproduced 4 of 4`` / ``stable: passed 4 of 4``."""
        if self.kind == STABLE and self.failed == 0:
            return f"{STABLE}: {self.status} {self.replays} of {self.replays}"
        return f"{self.kind}: reproduced {self.failed} of {self.replays}"


def measured(verdict: Verdict | None) -> Repeats | None:
    """What ``verdict``'s replays measured; None for one replay, or fewer than two that ran
    (nothing to compare)."""
    if verdict is None or not verdict.replays:
        return None
    ran = [s for s in verdict.replays if s in (REPRODUCED, DIFFERENT, PASSED)]
    if len(ran) < 2:
        return None
    return Repeats(kind=STABLE if len(set(ran)) == 1 else FLAKY, failed=sum(s == REPRODUCED for s in ran),
                   replays=len(ran), status=verdict.status)


def judging_repeat(replay: Verdict | None) -> int | None:
    """How many replays judge each candidate when a group is minified: for a flaky group, as
    many as miss its measured failure rate under 1% of the time (``bisect.flakiness``'s rule,
    capped); None (one) for a stable one, one that never reproduced, or none measured."""
    seen = measured(replay)
    if seen is None or seen.kind != FLAKY or seen.failed == 0:
        return None
    return repeat_for(seen.failed, seen.replays)
