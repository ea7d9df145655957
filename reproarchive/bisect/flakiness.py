"""``bisect torch``'s default number of replays, chosen from the flakiness it measures.

One replay per environment is enough for a failure that always shows, and wrong for one that
shows one time in three: an environment before the first bad one that passed once may be bad
too, and the bisection then names a culprit too late. A fixed ``--repeat`` makes every bisection
pay for the worst failure. So by default the bisection measures the failure it is bisecting:

1. every environment is replayed once, as before;
2. when the first bad environment has a good one before it (only then can a missed failure move
   the answer), it is replayed until ``MEASURE`` replays in all, and its failure rate ``p`` is
   the share of them that failed as recorded (a replay that could not run does not count);
3. if every replay failed, the failure is stable and nothing more is replayed. Otherwise each
   good environment before it is replayed until ``repeat_for(p)`` replays in all: the fewest
   that would miss a failure of rate ``p`` with a chance under ``MISS`` (capped at ``CAP``). A
   failure seen there makes that environment bad (syzkaller's rule) and the answer moves.

The result says what was measured (``Flakiness``); ``--repeat N`` replaces all of this by N
replays everywhere.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

from reproarchive.bisect.results import BAD, GOOD, EnvVerdict, Flakiness, failed_of

#: Replays of the first bad environment that measure its failure rate.
MEASURE = 4
#: The chance of calling a bad environment good that ``repeat_for`` accepts.
MISS = 0.01
#: The most replays one environment gets.
CAP = 20


def repeat_for(failed: int, replays: int) -> int:
    """The fewest replays that miss a failure of rate ``failed / replays`` with a chance under
    ``MISS``, capped at ``CAP``; 1 for a failure that never passed."""
    if replays == 0 or failed >= replays:
        return 1
    rate = failed / replays
    return min(CAP, max(2, math.ceil(math.log(MISS) / math.log(1.0 - rate))))


def combined(first: EnvVerdict, more: EnvVerdict) -> EnvVerdict:
    """One environment's verdict from its replays so far and ``more`` of them: bad when any
    replay was bad, flaky when some passed too."""
    replays = first.replays + more.replays
    if BAD not in replays:
        return dataclasses.replace(first, replays=replays, seconds=round(first.seconds + more.seconds, 3))
    source = first if first.verdict == BAD else more
    reason = f"flaky: {failed_of(replays)}" if GOOD in replays else source.reason
    return dataclasses.replace(source, verdict=BAD, reason=reason, replays=replays,
                               seconds=round(first.seconds + more.seconds, 3))


def measured(verdicts: list[EnvVerdict], replay_more: Callable[[EnvVerdict, int], EnvVerdict | None],
             ) -> tuple[list[EnvVerdict], Flakiness | None]:
    """The verdicts after the module docstring's steps 2 and 3; ``replay_more(verdict, n)`` replays
    that environment ``n`` more times (None: no time left)."""
    first_bad = next((i for i, v in enumerate(verdicts) if v.verdict == BAD), None)
    if first_bad is None or not any(v.verdict == GOOD for v in verdicts[:first_bad]):
        return verdicts, None
    out = list(verdicts)
    bad = out[first_bad]
    more = replay_more(bad, MEASURE - len(bad.replays)) if len(bad.replays) < MEASURE else None
    if more is not None:
        bad = out[first_bad] = combined(bad, more)
    judged = [r for r in bad.replays if r in (GOOD, BAD)]
    repeat = repeat_for(judged.count(BAD), len(judged))
    flakiness = Flakiness(environment=bad.python, failed=judged.count(BAD), replays=len(judged), repeat=repeat)
    for i in range(first_bad - 1, -1, -1):  # nearest first: the answer moves one step at a time
        v = out[i]
        if v.verdict != GOOD or len(v.replays) >= repeat:
            continue
        more = replay_more(v, repeat - len(v.replays))
        if more is None:
            break
        out[i] = combined(v, more)
    return out, flakiness
