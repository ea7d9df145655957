"""Which environments ``bisect torch`` replays in: all of them in order, or a binary search.

Environments given in order (oldest torch first) are good up to some point and bad after it,
if the failure came once and stayed. A linear walk replays (and, for ``--torch``, builds)
every one; a month of nightlies is thirty builds of a gigabyte each. A binary search, as
``git bisect`` runs, replays about log2(n) + 2 of them:

1. the newest environment first: when it does not fail as recorded there is nothing to look
   for; then the oldest, which must be good. An end that cannot say (skipped: it cannot load
   the archive, or a different failure) is replaced by its nearest neighbour inward that can;
2. then the middle of the range still open (last good, first bad), narrowing it, until the two
   are neighbours. A middle that cannot say is set aside (``git bisect skip``), and the next
   probe is the untried environment nearest the middle; when every one between the two is set
   aside the search stops there, and the answer names the range with the skipped ones in it.

The answer is read from the verdicts reached, in the given order, exactly as a linear walk's
(``environments._result``): the first bad environment and the last good one before it.
"""

from __future__ import annotations

from typing import Callable

from reproarchive.bisect.results import BAD, GOOD, EnvVerdict

LINEAR, BINARY = "linear", "binary"

Judge = Callable[[int], "EnvVerdict | None"]


def searched(count: int, judge: Judge, how: str) -> dict[int, EnvVerdict]:
    """The verdicts reached, by position; ``judge(i)`` replays the i-th environment (None: out
    of time, which ends the search)."""
    judged: dict[int, EnvVerdict] = {}

    def at(i: int) -> EnvVerdict | None:
        if i not in judged:
            verdict = judge(i)
            if verdict is None:
                raise _OutOfTime
            judged[i] = verdict
        return judged[i]

    try:
        if how == LINEAR:
            for i in range(count):
                at(i)
        else:
            _binary(count, at, judged)
    except _OutOfTime:
        pass
    return judged


class _OutOfTime(Exception):
    pass


def _binary(count: int, at: Callable[[int], EnvVerdict], judged: dict[int, EnvVerdict]) -> None:
    hi = next((i for i in range(count - 1, -1, -1) if at(i).verdict in (GOOD, BAD)), None)
    if hi is None or at(hi).verdict != BAD:
        return  # the newest usable environment passes: nothing to look for
    lo = next((i for i in range(hi) if at(i).verdict in (GOOD, BAD)), None)
    if lo is None or at(lo).verdict != GOOD:
        return  # the oldest usable one already fails: no good one to start from
    while hi - lo > 1:
        untried = [i for i in range(lo + 1, hi) if i not in judged]
        if not untried:
            return  # every environment between the two was set aside
        middle = (lo + hi) / 2
        probe = min(untried, key=lambda i: (abs(i - middle), i))
        verdict = at(probe).verdict
        if verdict == BAD:
            hi = probe
        elif verdict == GOOD:
            lo = probe

