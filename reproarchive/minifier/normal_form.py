"""The steps of ``Recording.normalise``, each one rule of candidate.py's docstring.

They live apart from candidate.py so that module stays readable in one sitting; each takes the
``Recording`` whose indexed graph it reads (typed ``Any``: naming the class here would import
candidate.py, which imports this module), and ``res``, which follows a node through the
substitution map to the node whose value replaces it.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from . import inputs as _inputs
from .inputs import IDENTITY, Transform

Resolve = Callable[[int], int]


def resolver(subst: dict[int, int]) -> Resolve:
    """Bypasses chain (a bypassed node may be replaced by one bypassed itself)."""
    def res(i: int) -> int:
        while i in subst:
            i = subst[i]
        return i
    return res


def kept_ops(rec: Any, keep: Sequence[int] | frozenset[int], subst: dict[int, int],
             res: Resolve) -> set[int]:
    """The kept op nodes once uncuttable values are computed again and items of tuples no
    longer computed are read as inputs; one rule can undo the other, so to a fixed point."""
    S = {i for i in keep if rec.is_op[i] and i not in subst}
    changed = True
    while changed:
        changed = False
        for v in list(S):
            src = rec.getitem_source[v]
            if src is not None and res(src) not in S and rec.cuttable[v]:
                S.discard(v)  # an item of a tuple we do not compute is an input instead
                changed = True
        for v in list(S):
            for a in rec.args[v]:
                a = res(a)
                if rec.is_op[a] and a not in S and not rec.cuttable[a]:
                    S.add(a)
                    changed = True
    return S


def frontier(rec: Any, S: set[int], subst: dict[int, int], res: Resolve) -> list[int]:
    """The outputs when the caller names none; adds to ``S`` the tensor items a kept tuple
    outputs, since an output must be a node the graph computes."""
    read = {res(a) for v in S for a in rec.args[v]}
    outs = []
    for v in sorted(S):
        if v in read:
            continue
        if rec.is_tensor[v]:
            outs.append(v)
        elif rec.is_tuple[v]:
            items = [u for u in rec.users[v] if rec.getitem_source[u] == v and rec.is_tensor[u]
                     and u not in subst]
            outs.extend(items)
            S.update(items)
    kept = {res(o) for o in rec.original_outputs} & S  # returned by the original: stays returned
    outs.extend(sorted(o for o in kept - set(outs) if rec.is_tensor[o]))
    return outs


def _closure(rec: Any, S: set[int], seeds: set[int], res: Resolve) -> set[int]:
    live = set()
    stack = list(seeds)
    while stack:
        v = stack.pop()
        if v in live:
            continue
        live.add(v)
        for a in rec.args[v]:
            a = res(a)
            if a in S and a not in live:
                stack.append(a)
    return live


def live_nodes(rec: Any, S: set[int], roots: set[int], subst: dict[int, int], res: Resolve) -> set[int]:
    """What the roots need, plus every mutation a kept later reader of its target depends on
    (keeping one can make another needed, so to a fixed point); grows ``S`` and ``roots``."""
    live = _closure(rec, S, roots, res)
    if rec.mutates:
        while True:
            forced = set()
            for m, b in rec.mutates.items():
                if m in live or m in subst:
                    continue
                b = res(b)
                if any(r > m and b in {res(a) for a in rec.args[r]} for r in live):
                    forced.add(m)
            if not forced:
                break
            S |= forced
            roots |= forced
            live = _closure(rec, S, roots, res)
    return live


def normal_fields(rec: Any, live: set[int], outs: list[int], xforms: dict[int, Transform],
                  res: Resolve) -> tuple[Any, ...]:
    """``Candidate``'s fields, in its order, from the live set: sorted, so equal graphs get equal
    memo keys however the moves reached them."""
    order = tuple(sorted(live))
    outs_t = tuple(sorted(set(outs) & live))
    ins: set[int] = set()
    redirects = []
    for v in order:
        for a in rec.args[v]:
            r = res(a)
            if r != a:
                redirects.append((a, r))
            if r not in live and rec.nodes[r].op != "get_attr":
                ins.add(r)
    ins_t = tuple(sorted(ins))
    redirects_t = tuple(sorted(set(redirects)))
    xf = tuple((i, xforms[i]) for i in ins_t if xforms.get(i, IDENTITY) != IDENTITY)
    tx = dict(xf)
    metas = tuple(rec.meta_key[i] if i not in tx else _inputs.meta(rec.value[i], tx[i]) for i in ins_t)
    costs = [_inputs.cost(rec.value[i], tx.get(i, IDENTITY)) for i in ins_t]
    key = (order, outs_t, redirects_t, ins_t, metas)
    return (order, outs_t, ins_t, redirects_t, key, xf,
            (sum(c[0] for c in costs), sum(c[1] for c in costs)))
