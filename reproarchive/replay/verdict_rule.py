"""A replay's verdicts and exit codes, and the rule that gives a job one verdict from its ranks'.

Standard library only: the exported scripts carry this text (``standalone.shared_blocks.BUNDLED``),
so a job's ``repro.py`` reaches its verdict by the code ``reproarchive run`` uses, and the two
cannot disagree. ``git bisect run`` reads the codes: 0 good, 1-127 bad, 125 skip.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

EXIT_PASSED = 0
EXIT_REPRODUCED = 1
EXIT_DIFFERENT = 3
EXIT_INCONCLUSIVE = 125

PASSED = "passed"
REPRODUCED = "reproduced"
DIFFERENT = "different failure"
INCONCLUSIVE = "inconclusive"
# what only a rank of a job can be: killed by a signal (not the recorded one), ended by the
# launcher or by a peer that went away once another rank failed, or given no result in time
CRASHED, STOPPED, HUNG = "crashed", "stopped", "hung"


def job_verdict(outcomes: Sequence[Any], recorded_rank: int | None) -> tuple[str, int, int | None]:
    """(status, exit code, the rank it is about) over ``outcomes`` (each with ``rank`` and
    ``status``, in rank order). The job follows the rank that failed when recorded: reproduced
    when that rank reproduced (with none recorded, when any rank did); else a different failure
    where a rank failed otherwise, or where the recorded rank was stopped before it could fail;
    else inconclusive where a rank could not run as recorded; else passed. When the recorded
    failing rank ran elsewhere (another node's launch), the verdict is over the ranks here."""

    by_rank = {o.rank: o for o in outcomes}
    if recorded_rank is not None and recorded_rank not in by_rank:
        recorded_rank = None
    if recorded_rank is not None and by_rank[recorded_rank].status == REPRODUCED:
        return REPRODUCED, EXIT_REPRODUCED, recorded_rank
    if recorded_rank is None:
        hit = next((o for o in outcomes if o.status == REPRODUCED), None)
        if hit is not None:
            return REPRODUCED, EXIT_REPRODUCED, hit.rank
    bad = [o for o in outcomes if o.status not in (PASSED, STOPPED, REPRODUCED, INCONCLUSIVE)]
    if bad:
        return DIFFERENT, EXIT_DIFFERENT, bad[0].rank
    if recorded_rank is not None and by_rank[recorded_rank].status == STOPPED:
        return DIFFERENT, EXIT_DIFFERENT, recorded_rank
    unsure = next((o for o in outcomes if o.status == INCONCLUSIVE), None)
    if unsure is not None:  # no rank failed, but one could not run as recorded: no evidence of a fix
        return INCONCLUSIVE, EXIT_INCONCLUSIVE, unsure.rank
    return PASSED, EXIT_PASSED, recorded_rank


def first_failure(endings: Mapping[int, tuple[bool, float]]) -> int | None:
    """The rank that ended first by its own failure, from the ranks the launcher reported
    (rank -> (ended by the launcher's SIGTERM or SIGKILL, when)): the others were stopped
    because of it. Where every rank was ended so, the first of them."""
    own = {r: e for r, e in endings.items() if not e[0]} or endings
    return min(own, key=lambda r: (own[r][1], r)) if own else None
