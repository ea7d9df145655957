"""The moves. Each is a small function over the current candidate that proposes smaller ones.

A pass never edits a graph: it proposes a kept node set (for ``bypass`` also a substitution,
for input moves a transform of some inputs), the candidate module turns that into a valid
graph, and the oracle judges it once. A proposal that still fails becomes the current candidate
at once, so a pass that is interrupted has already banked its progress.

Node passes (``NODE_PASSES``) run first, to a fixpoint; input passes (``INPUT_PASSES``) run on
the smallest graph afterwards: they change shapes, so the recorded intermediate values a node
pass would cut to no longer fit.

Localisation passes open the search, in an order the caller chooses (``localize``):

* ``bisect_inputs`` cuts the longest prefix of the graph into inputs that still fails. Its
  candidates keep the original outputs, so a judge whose verdict depends on how many outputs
  there are (PyTorch's ``same_two_models`` averages every output into one loss before the
  backward; a backward-only error shrinks with each extra output) sees the failure as recorded.
  It finds the op that makes the *recorded outputs* wrong.
* ``bisect_culprits`` truncates: the shortest prefix that still fails, every frontier value an
  output. It finds the *first* op whose value diverges anywhere -- what a strict accuracy check
  ("any divergence counts", bool masks included) asks for.
* ``bisect_outputs`` moves a single output upstream (the earliest node whose cone alone still
  fails), as PyTorch's truncation does, starting from the first output (last node first, then
  the original outputs latest first) whose cone alone fails. With a backward, a judge compares
  input gradients of one loss averaged over all outputs, and where the leaves are decides what
  it sees: a single output is the clearest view (``localize="cone"``, chosen by ``auto`` when
  an input requires grad).

Outputs that are intermediate values. An AOT forward graph returns the activations its
backward saves, so a miscomputed op's value is often returned *and* read further on, where
saturating ops can wash the error out of the final value. Until candidates kept the original
outputs (``candidate.py``: a kept node the original returns stays an output), every cut that
kept the culprit also kept a reader of it, the culprit fell off the frontier, and the judge
compared the final value only. Counted on the benchmark's ``accuracy_saved_100`` (one
``sigmoid`` 1% off, its value also returned; PyTorch's ``backend_accuracy_fails``): 436 calls,
435 of them in ``bisect_inputs``, 434 judged "not failing" -- every prefix cut that keeps the
sigmoid, and every needed-set the bisection then built one node at a time -- with 5 memo hits:
the memo answers repeated questions, and each rejected cut was a different node set, so none
repeated; the judge rejected them because the question itself had lost the output. (The
backward-only variant, ``accuracy_saved_bwd_100``: 437 calls, 435 rejected; at 500 ops see
search.py.)
Two moves use those outputs directly: ``bisect_inputs`` first tries the output ops alone
(``_outputs_alone``: one call, then halving), and ``bisect_outputs`` tries each original
output's cone, not only the last node's.

With ``jobs > 1`` the bisections probe several points at once and the one-node-at-a-time scans
judge several proposals at once (speculatively; the first success in order is taken).
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch

from reproarchive.compat.tensor_internals import is_traceable_wrapper_subclass

from . import inputs as _inputs
from .candidate import Candidate, Recording
from .inputs import IDENTITY, NARROWER, Transform
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

    @property
    def jobs(self) -> int:
        return self.oracle.jobs

    def propose(self, keep, subst: dict[int, int] | None = None,
                xforms: dict[int, Transform] | None = None) -> Candidate:
        cur = self.current
        return self.rec.normalise(frozenset(keep), self.subst if subst is None else subst,
                                  xforms=cur.transforms if xforms is None else xforms)

    def judge(self, cands: list[Candidate]) -> list[bool]:
        """Judge proposals (concurrently up to ``jobs``). One that is not smaller than the
        current candidate (normal form re-added what was removed) is not worth a call: it
        counts as failing only if it *is* the current candidate."""
        cur = self.current
        worth = [c for c in cands if c.size < cur.size and self.rec.stores(c)]
        verdict = dict(zip((c.key for c in worth), self.oracle.judge_many(worth))) if worth else {}
        return [verdict[c.key] if c.key in verdict else c.key == cur.key for c in cands]

    def test(self, keep, subst: dict[int, int] | None = None, xforms: dict[int, Transform] | None = None) -> bool:
        """Judge the candidate keeping ``keep``; True if it fails (it is then current if smaller)."""
        return self.judge([self.propose(keep, subst, xforms)])[0]

    def first_success(self, proposals: Iterable[Callable[[], Candidate | None]]) -> int:
        """Judge proposals in order, ``jobs`` at a time; each is built from the then-current
        candidate. Returns how many succeeded (each success was adopted when it was smaller)."""
        successes = 0
        pending = list(proposals)
        while pending:
            batch, pending = pending[: self.jobs], pending[self.jobs:]
            cands = [c for c in (make() for make in batch) if c is not None]
            if cands:
                successes += sum(self.judge(cands))
        return successes


def _search(sh: Shrinker, lo: int, hi: int, fails_at: Callable[[int], Candidate], lo_fails: bool) -> tuple[int, int]:
    """Narrow ``lo < hi`` to adjacent points with ``fails_at(lo) == lo_fails != fails_at(hi)``,
    probing ``jobs`` points per step (binary search when ``jobs == 1``)."""
    while hi - lo > 1:
        k = min(sh.jobs, hi - lo - 1)
        points = sorted({lo + (hi - lo) * (i + 1) // (k + 1) for i in range(k)} - {lo, hi})
        verdicts = sh.judge([fails_at(p) for p in points])
        new_lo, new_hi = lo, hi
        for p, failed in zip(points, verdicts):
            if failed == lo_fails:
                new_lo = p
            else:
                new_hi = p
                break
        lo, hi = new_lo, new_hi
    return lo, hi


def prune(sh: Shrinker) -> None:
    """Dead code and unused inputs: the original graph in normal form, same outputs."""
    if sh.oracle.best is None and sh.start.size < sh.rec.original_size:
        sh.oracle.judge(sh.start)


def bisect_inputs(sh: Shrinker) -> None:
    """Find the needed nodes one at a time, earliest first, by cutting prefixes into inputs.

    With R the nodes found necessary and C the nodes after the last of them (topological
    order), the largest i with R + C[i:] still failing is found by bisection: C[i] is needed
    (cutting it into an input -- its eager value -- makes the failure go away), and the search
    continues on C[i+1:]. The first round keeps the original outputs exactly (everything after
    a cut is kept, and a kept node the original returns stays returned). About
    k * (log2 n + 2) calls for k needed nodes among n. With several original outputs, their own
    ops alone are tried first (``_outputs_alone``).
    """
    if _outputs_alone(sh):
        return
    needed: set[int] = set()
    rest = sh.live
    while rest:
        if sh.test(needed):
            return
        # needed + rest[lo:] fails, needed + rest[hi:] (= needed alone) does not
        make = lambda i, rest=rest: sh.propose(needed | set(rest[i:]))  # noqa: E731
        lo, hi = 0, len(rest)
        if hi > 2:
            # the last node first: when the output's own op is the bug, one call settles it
            # (and an accuracy judge that sees the error only near its leaves (a backward)
            # may pass every suffix in between, which no bisection could get across)
            if sh.judge([make(hi - 1)])[0]:
                lo = hi - 1
            else:
                hi -= 1
        lo, _ = _search(sh, lo, hi, make, lo_fails=True)
        needed.add(rest[lo])
        if _alone(sh, needed, rest[lo]):
            return
        rest = rest[lo + 1:]


def _outputs_alone(sh: Shrinker) -> bool:
    """With several of the original outputs kept: do their ops alone (their arguments cut into
    inputs) fail? If so, halve that set while a half still fails; True if that adopted
    something. One call when they do not; about 2 log2(k) + 1 for k outputs when they do.

    The prefix cuts below keep every kept output, and the last node alone is their first probe;
    an output that is an intermediate value (an AOT forward's saved activation) is in the
    middle of the graph, where a bisection over prefixes needs log2(n) calls to reach it. When
    the error is in such an output's own op (the judge sees it right there), this finds it in
    a handful of calls whatever the graph's size.
    """
    before = sh.current
    outs = [o for o in before.outputs if o in sh.rec.original_outputs and sh.rec.is_tensor[o]]
    if len(outs) < 2 or not sh.test(set(outs)):
        return False
    while len(outs) > 1:
        half = len(outs) // 2
        for part in (outs[:half], outs[half:]):
            if sh.test(set(part)):
                outs = part
                break
        else:
            break
    return sh.current.key != before.key


def bisect_culprits(sh: Shrinker) -> None:
    """Delta debugging by truncation: find the needed nodes one at a time, latest first.

    With R the nodes found necessary and C the candidates before them (topological order), the
    smallest failing R + C[:i] is found by bisection; C[i-1] is needed, and the search
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
        # needed + rest[:lo] does not fail, needed + rest[:hi] does
        _, hi = _search(sh, 0, len(rest), lambda i, rest=rest: sh.propose(needed | set(rest[:i])), lo_fails=False)
        needed.add(rest[hi - 1])
        if _alone(sh, needed, rest[hi - 1]):
            return
        rest = rest[: hi - 1]


def _alone(sh: Shrinker, needed: set[int], newest: int) -> bool:
    """Does the node just found fail on its own? One call that saves the remaining rounds when
    the earlier "needed" nodes were artefacts of a judge that is not monotone: accuracy judges
    that average all outputs into one loss (PyTorch's ``same_two_models`` before a backward) see
    less of the error in a candidate with more outputs, so a needed set can keep growing while
    its newest node alone already fails."""
    return len(needed) > 1 and sh.test({newest})


def bisect_outputs(sh: Shrinker) -> None:
    """Move the one output upstream: the earliest node whose cone (the node and what it needs,
    the node the only output) still fails, found by bisection over the topological order and
    repeated inside that cone until it stops moving. The first cone is the last node's, or
    else the first original output's (latest first) that fails alone.

    PyTorch's truncation keeps a single output too; a single output is what an accuracy judge
    that averages all outputs into one loss sees best. Not monotone (a position may hold a node
    of another branch), so each step only narrows to a failing cone; about log2 n calls a step.
    """
    rec = sh.rec

    def cone(v: int, within: set[int]) -> set[int]:
        seen, stack = set(), [v]
        while stack:
            u = stack.pop()
            if u in seen or u not in within:
                continue
            seen.add(u)
            stack.extend(_resolve(sh.subst, a) for a in rec.args[u])
        return seen

    def single(v: int, within: set[int]) -> Candidate:
        return sh.rec.normalise(frozenset(cone(v, within)), sh.subst, outputs=[v], xforms=sh.current.transforms)

    while True:
        within = set(sh.live)
        live = [v for v in sh.live if rec.is_tensor[v]]  # a tuple or an int is no graph output
        if len(live) < 2:
            return
        # the last node's cone first (it fails if it is the only output); then every other
        # original output's, latest first: an output that is an intermediate value (an AOT
        # forward's saved activation) may be the only place the judge sees the error
        outs = [live[-1]] + [o for o in reversed(sh.current.outputs)
                             if o != live[-1] and o in rec.original_outputs and rec.is_tensor[o]]
        top = next((o for o in outs if sh.judge([single(o, within)])[0]), None)
        if top is None:
            return
        _, hi = _search(sh, -1, live.index(top), lambda i, live=live, within=within: single(live[i], within),
                        lo_fails=False)
        if set(sh.current.live) == within:  # nothing smaller was adopted: the cone is the graph
            return


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


def _without(sh: Shrinker, v: int, only_outputs: bool) -> Callable[[], Candidate | None]:
    def make() -> Candidate | None:
        cur = sh.current
        if v not in cur.live or (v in cur.outputs) != only_outputs:
            return None
        return sh.propose(set(cur.live) - {v})
    return make


def hoist_outputs(sh: Shrinker) -> None:
    """Move an output upstream: drop an output node so its arguments become the outputs."""
    sh.first_success(_without(sh, v, True) for v in reversed(sh.live))


def cut_nodes(sh: Shrinker) -> None:
    """Turn one interior node into a graph input holding its real eager value (any value kind)."""
    sh.first_success(_without(sh, v, False) for v in reversed(sh.live))


def bypass(sh: Shrinker) -> None:
    """Skip a node: its readers read one of its own computed arguments of equal shape/dtype.

    This removes a node in the middle of a dependency chain while keeping both ends connected,
    which no cut can do (llvm-reduce's operands-skip).
    """
    rec = sh.rec

    def proposals(v: int):
        def make() -> Candidate | None:
            cur = sh.current
            if v not in cur.live or rec.effectful[v] or rec.tensor_meta[v] is None:
                return None
            subst = sh.subst
            for a in rec.args[v]:
                a = _resolve(subst, a)
                if a in cur.live and rec.tensor_meta[a] == rec.tensor_meta[v]:
                    return sh.propose(set(cur.live) - {v}, {**subst, v: a})
            return None
        return make

    sh.first_success(proposals(v) for v in reversed(sh.live))


def _resolve(subst: dict[int, int], i: int) -> int:
    while i in subst:
        i = subst[i]
    return i


# -- input moves ---------------------------------------------------------------------------


def _tensor_inputs(sh: Shrinker) -> list[int]:
    """The plain tensor inputs: a tensor subclass (a nested jagged tensor) keeps its values."""
    return [i for i in sh.current.inputs if isinstance(sh.rec.value[i], torch.Tensor)
            and not is_traceable_wrapper_subclass(sh.rec.value[i])]


def _shape_now(sh: Shrinker, i: int) -> tuple[int, ...]:
    t = sh.current.transforms.get(i, IDENTITY)
    return tuple(sh.rec.value[i].shape) if t.shape is None else tuple(t.shape)


def shrink_shapes(sh: Shrinker) -> None:
    """Halve dimensions while the failure holds: all dimensions of one size at once, across
    every tensor input (so broadcasting and matching matmul dimensions stay consistent), the
    largest size first; the smallest size in s/2, s/4, ..., 1 that still fails is found by
    bisection. Values are the leading block of the recorded ones, strides keep the recorded
    dimension order (``inputs.apply``)."""
    tried: set[int] = set()
    while True:
        shapes = {i: _shape_now(sh, i) for i in _tensor_inputs(sh)}
        sizes = sorted({d for shape in shapes.values() for d in shape if d > 1} - tried, reverse=True)
        if not sizes:
            return
        size = sizes[0]
        ladder = [size]
        while ladder[-1] > 1:
            ladder.append(ladder[-1] // 2)
        tried.update(ladder)
        base, live = dict(sh.current.transforms), sh.current.live

        def with_size(k: int, size=size, ladder=ladder, shapes=shapes, base=base, live=live) -> Candidate:
            xf = dict(base)
            for i, shape in shapes.items():
                if size in shape:
                    new = tuple(ladder[k] if d == size else d for d in shape)
                    xf[i] = xf.get(i, IDENTITY).merged(shape=new)
            return sh.propose(live, xforms=xf)

        # rung 0 is the current size (fails); past the last rung counts as passing
        _search(sh, 0, len(ladder), with_size, lo_fails=True)


def narrow_dtypes(sh: Shrinker) -> None:
    """One dtype step narrower (float64 -> float32 -> float16, int64 -> int32) for every tensor
    input of that dtype at once, while the failure holds."""
    refused: set[torch.dtype] = set()
    while True:
        groups: dict[torch.dtype, list[int]] = {}
        for i in _tensor_inputs(sh):
            t = sh.current.transforms.get(i, IDENTITY)
            dtype = sh.rec.value[i].dtype if t.dtype is None else _inputs.dtype_of(t.dtype)
            if dtype in NARROWER and dtype not in refused:
                groups.setdefault(dtype, []).append(i)
        if not groups:
            return
        dtype = max(groups, key=lambda d: d.itemsize)
        xf = dict(sh.current.transforms)
        for i in groups[dtype]:
            xf[i] = xf.get(i, IDENTITY).merged(dtype=_inputs.dtype_name(NARROWER[dtype]))
        if not sh.test(sh.current.live, xforms=xf):
            refused.add(dtype)


def fill_inputs(sh: Shrinker) -> None:
    """Replace input values with zeros (then ones) where the failure does not need them: first
    every tensor input at once, then one input at a time."""
    inputs = [i for i in _tensor_inputs(sh) if sh.current.transforms.get(i, IDENTITY).fill is None]
    if not inputs:
        return

    def filled(members: list[int], value: int) -> Callable[[], Candidate | None]:
        def make() -> Candidate | None:
            xf = dict(sh.current.transforms)
            todo = [i for i in members if xf.get(i, IDENTITY).fill is None or xf[i].fill > value]
            if not todo:
                return None
            for i in todo:
                xf[i] = xf.get(i, IDENTITY).merged(fill=value)
            return sh.propose(sh.current.live, xforms=xf)
        return make

    if len(inputs) > 1 and sh.test(sh.current.live, xforms={
            **sh.current.transforms, **{i: sh.current.transforms.get(i, IDENTITY).merged(fill=0) for i in inputs}}):
        return
    sh.first_success(filled([i], 0) for i in inputs)
    sh.first_success(filled([i], 1) for i in inputs)


NODE_PASSES: dict[str, Callable[[Shrinker], None]] = {
    "bisect_inputs": bisect_inputs,
    "bisect_outputs": bisect_outputs,
    "bisect_culprits": bisect_culprits,
    "ddmin": ddmin,
    "hoist_outputs": hoist_outputs,
    "cut_nodes": cut_nodes,
    "bypass": bypass,
}

INPUT_PASSES: dict[str, Callable[[Shrinker], None]] = {
    "shrink_shapes": shrink_shapes,
    "narrow_dtypes": narrow_dtypes,
    "fill_inputs": fill_inputs,
}

LOCALIZE = {
    # which localisation pass opens the search (see the module docstring)
    "cut": ["bisect_inputs", "bisect_culprits"],
    "truncate": ["bisect_culprits", "bisect_inputs"],
    "cone": ["bisect_outputs", "bisect_inputs", "bisect_culprits"],
}


def choose_localize(localize: str, example_inputs) -> str:
    """``auto``: ``cone`` when an input requires grad (a backward runs, and a judge that compares
    gradients sees the error averaged over every output), else ``cut``."""
    if localize != "auto":
        return localize
    wants_grad = any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)
    return "cone" if wants_grad else "cut"
