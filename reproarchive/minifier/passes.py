"""The moves. Each is a small function over the current candidate that proposes smaller ones.

A pass never edits a graph: it proposes a kept node set (and for ``bypass`` a substitution), the
candidate module turns that into a valid graph, and the oracle judges it once. A proposal that
still fails becomes the current candidate at once, so a pass that is interrupted has already
banked its progress. Passes are listed in ``PASSES`` in the order the fixpoint loop runs them.
"""

from __future__ import annotations

from typing import Callable

from .candidate import Candidate, Recording
from .oracle import Oracle


class Shrinker:
    """What a pass sees: the current candidate and a way to test proposals."""

    def __init__(self, rec: Recording, oracle: Oracle, start: Candidate):
        self.rec = rec
        self.oracle = oracle
        self.start = start

    @property
    def current(self) -> Candidate:
        return self.oracle.best if self.oracle.best is not None else self.start

    @property
    def live(self) -> list[int]:
        return list(self.current.live)

    @property
    def subst(self) -> dict[int, int]:
        return dict(self.current.redirects)

    def test(self, keep, subst: dict[int, int] | None = None) -> bool:
        """Judge the candidate keeping ``keep``; True if it fails (it is then current if smaller)."""
        cand = self.rec.normalise(frozenset(keep), self.subst if subst is None else subst)
        if cand.size >= self.current.size:
            # Not smaller (normal form re-added what was removed): nothing to learn that
            # the acceptance rule could use, so do not spend a call on it.
            return cand.key == self.current.key
        return self.oracle.judge(cand)


def prune(sh: Shrinker) -> None:
    """Dead code and unused inputs: the original graph in normal form, same outputs."""
    if sh.oracle.best is None and sh.start.size < sh.rec.original_size:
        sh.oracle.judge(sh.start)


def bisect_culprits(sh: Shrinker) -> None:
    """Delta debugging by bisection: find the needed nodes one at a time, latest first.

    With R the nodes found necessary and C the candidates before them (topological order), the
    smallest failing R + C[:i] is found by binary search; C[i-1] is needed, and the search
    continues on C[:i-1] only -- nothing is revisited and granularity never restarts. The first
    round (R empty) is truncation with every frontier node as an output. For k culprit nodes among
    n this costs about k * (log2 n + 1) calls; for a non-monotone predicate it still only adopts
    candidates that were judged failing.
    """
    needed: set[int] = set()
    rest = sh.live
    while rest:
        if sh.test(needed):
            return
        lo, hi = 0, len(rest)  # R + rest[:lo] passes, R + rest[:hi] fails (invariant)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if sh.test(needed | set(rest[:mid])):
                hi = mid
            else:
                lo = mid
        needed.add(rest[hi - 1])
        rest = rest[: hi - 1]


def ddmin(sh: Shrinker) -> None:
    """Complement-only delta debugging over the live set, without restarts or revisits.

    After a chunk is removed the scan continues at the same position and granularity (QRS'18);
    it only halves the chunk size when a whole sweep removed nothing. Single nodes are left to
    ``hoist_outputs`` and ``cut_nodes``.
    """
    size = len(sh.live) // 2
    while size >= 2:
        i = 0
        while i < len(sh.live):
            live = sh.live
            chunk = set(live[i : i + size])
            if not sh.test(set(live) - chunk):
                i += size
        size //= 2


def hoist_outputs(sh: Shrinker) -> None:
    """Move an output upstream: drop an output node so its arguments become the outputs."""
    for v in reversed(sh.live):
        cur = sh.current
        if v in cur.outputs and v in cur.live:
            sh.test(set(cur.live) - {v})


def cut_nodes(sh: Shrinker) -> None:
    """Turn one interior node into a graph input holding its real eager value (any value kind)."""
    for v in reversed(sh.live):
        cur = sh.current
        if v in cur.live and v not in cur.outputs:
            sh.test(set(cur.live) - {v})


def bypass(sh: Shrinker) -> None:
    """Skip a node: its readers read one of its own computed arguments of equal shape/dtype.

    This removes a node in the middle of a dependency chain while keeping both ends connected,
    which no cut can do (llvm-reduce's operands-skip).
    """
    rec = sh.rec
    for v in reversed(sh.live):
        cur = sh.current
        if v not in cur.live or rec.effectful[v] or rec.tensor_meta[v] is None:
            continue
        subst = sh.subst
        for a in rec.args[v]:
            a = _resolve(subst, a)
            if a in cur.live and rec.tensor_meta[a] == rec.tensor_meta[v]:
                if sh.test(set(cur.live) - {v}, {**subst, v: a}):
                    break


def _resolve(subst: dict[int, int], i: int) -> int:
    while i in subst:
        i = subst[i]
    return i


PASSES: list[tuple[str, Callable[[Shrinker], None]]] = [
    ("bisect_culprits", bisect_culprits),
    ("ddmin", ddmin),
    ("hoist_outputs", hoist_outputs),
    ("cut_nodes", cut_nodes),
    ("bypass", bypass),
]
