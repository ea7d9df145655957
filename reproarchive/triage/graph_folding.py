"""What a drawn graph folds away and how it groups the rest, so a real model's graph reads like
the model.

A 12-layer transformer as Dynamo hands it to a backend has 147 placeholders, 145 of them
weights. Drawn as nodes of their own they all sit on the top rank of a layered layout: the page
opened on one row of tiny boxes with no op in sight. A weight is not a step of the computation;
it belongs to the op that uses it. So weights (parameters and buffers, and ``get_attr``
constants) are folded into their consumers, which list them; and ops are grouped by the module
they were traced in (``meta.module``, spec §7.1, or the module path Dynamo spells into a
weight's placeholder name), so pages are cut, and frames drawn, along the model's own
hierarchy.
"""

from __future__ import annotations

import dataclasses
import re

from reproarchive.format.schema import COMPUTE_OPS, GraphRecord

#: A graph with more inputs than this folds every placeholder that requires grad (after
#: AOTAutograd, parameters are ``primals_N`` with nothing in the name to tell them apart).
MANY_INPUTS = 16
#: Deepest module level drawn as a frame (``layers.0.attn.q`` is level 4).
MAX_GROUP_DEPTH = 3

# Dynamo's placeholder names for module state: l_self_modules_layers_modules_0_modules_qkv_parameters_weight_
_STATE_NAME = re.compile(r"^[lg]_\w*?_?(?:(modules_\w+?)_)?(parameters|buffers)_(\w+?)_*$")


@dataclasses.dataclass(frozen=True)
class Folding:
    """Per node of a graph: the inputs folded into it, whether it is drawn, and its module."""

    folded: dict[int, list[int]]  # consumer -> the weights folded into it
    into: dict[int, int]  # folded weight -> the consumer it is shown in (its first user)
    module: list[str | None]

    def drawn(self, i: int) -> bool:
        return i not in self.into


def state_path(name: str) -> tuple[str, str] | None:
    """(module path, attribute) of a placeholder Dynamo named after module state, e.g.
    ``l_self_modules_layers_modules_0_modules_qkv_parameters_weight_`` -> ("layers.0.qkv", "weight")."""
    m = _STATE_NAME.match(name)
    if m is None:
        return None
    parts = (m.group(1) or "").removeprefix("modules_").split("_modules_")
    return ".".join(p for p in parts if p), m.group(3)


def fold(graph: GraphRecord, inputs_of: list[list[int]], requires_grad: dict[int, bool],
         flags: dict[str, int]) -> Folding:
    """Which inputs to fold and each node's module. ``requires_grad`` maps placeholder index ->
    whether its tensor requires grad. A flagged (highlighted) input is never folded away."""
    nodes = graph.nodes
    users: list[list[int]] = [[] for _ in nodes]
    for i, ins in enumerate(inputs_of):
        for j in ins:
            users[j].append(i)
    placeholders = sum(1 for n in nodes if n.op == "placeholder")
    module: list[str | None] = [None] * len(nodes)
    weights = []
    for i, n in enumerate(nodes):
        meta = n.meta if isinstance(n.meta, dict) else {}
        if isinstance(meta.get("module"), str):
            module[i] = meta["module"]
        state = state_path(n.name) if n.op == "placeholder" else None
        if state is not None:
            module[i] = state[0] or None
        is_weight = (n.op == "get_attr" or state is not None
                     or (n.op == "placeholder" and placeholders > MANY_INPUTS and requires_grad.get(i, False)))
        if is_weight and users[i] and not flags.get(n.name):
            weights.append(i)
    folded: dict[int, list[int]] = {}
    into: dict[int, int] = {}
    for w in weights:
        into[w] = users[w][0]
        for u in users[w]:
            folded.setdefault(u, []).append(w)
    # An op traced without module metadata (an older archive) belongs to the module whose weights it uses.
    for u, ws in folded.items():
        if module[u] is None and nodes[u].op in COMPUTE_OPS:
            owners = {module[w] for w in ws if module[w] is not None}
            if len(owners) == 1:
                module[u] = owners.pop()
    return Folding(folded, into, module)


def top_block(path: str | None) -> str | None:
    """The unit pages are cut along: ``layers.3`` of ``layers.3.attn.q``, ``head`` of ``head``."""
    if not path:
        return None
    parts = path.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and parts[1].isdigit() else parts[0]


def groups(members: list[int], module: list[str | None]) -> list[tuple[str, list[int]]]:
    """(module path, positions in ``members``) for every module prefix, up to
    ``MAX_GROUP_DEPTH`` levels, that holds at least two of the drawn nodes."""
    found: dict[str, list[int]] = {}
    for k, i in enumerate(members):
        path = module[i]
        if not path:
            continue
        parts = path.split(".")
        depth = 0
        for cut in range(1, len(parts) + 1):
            if cut < len(parts) and parts[cut].isdigit():
                continue  # ``layers`` alone is not a frame; ``layers.0`` is
            depth += 1
            if depth > MAX_GROUP_DEPTH:
                break
            found.setdefault(".".join(parts[:cut]), []).append(k)
    return sorted(((p, ks) for p, ks in found.items() if len(ks) >= 2), key=lambda item: (item[0].count("."), item[0]))


def folded_text(names: list[str]) -> str:
    """``+ weight, bias`` for the weights folded into an op: their attribute names, short."""
    short = []
    for name in names:
        state = state_path(name)
        short.append(state[1] if state else name)
    return "+ " + ", ".join(short)
