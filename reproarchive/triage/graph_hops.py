"""Higher-order operators drawn as what they run: ``cond`` as a frame holding its true and false
branches side by side, ``while_loop`` its condition and body, ``flex_attention`` its score and
mask mods, each a laid-out graph of its own, nested operators nested.

The operator's node becomes a compound box: its own small box (the header) on top, the frame of
each subgraph below it, and dashed edges from the header into each subgraph input, whose box
says what it receives (``← x`` for an operand, ``score (given by the operator)``). The outer
layout sees the compound as one box of its size, so any engine ``graph_layout`` picks draws it
without knowing about clusters. A subgraph drawn for an earlier call (``invoke_subgraph`` calls
one subgraph many times) is a box naming that call; one with more than ``INLINE_NODES`` drawn
nodes is a box too, and is drawn as a paged graph of its own below the main one -- the way a
big graph is folded, never one unreadable frame.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from reproarchive.format.schema import GraphRecord, NodeRecord
from reproarchive.format.schema.rules.graph import iter_arg_refs
from reproarchive.triage import graph_folding, graph_layout
from reproarchive.triage.graph_subgraphs import (
    HopCall,
    SubgraphUse,
    hop_calls,
    nodes_in,
    ops_in,
    subgraph_attributes,
)

#: A subgraph with more drawn nodes than this is drawn as a graph of its own, below the main one.
INLINE_NODES = 120
PAD, TITLE, GAP = 10.0, 16.0, 14.0
FLAG_HIGHLIGHT = 1
FLAG_INSIDE = 4  # an operator whose subgraphs hold a highlighted node


@dataclass
class Drawing:
    """Things laid out around the origin: ``boxes`` ``(gid, cx, cy, w, h)``, ``edges``
    ``(gid_a, gid_b, kind, points, dashed)``, ``frames`` ``(label, x0, y0, x1, y1, depth, flag)``."""

    w: float = 0.0
    h: float = 0.0
    header: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    boxes: list[tuple] = field(default_factory=list)
    edges: list[tuple] = field(default_factory=list)
    frames: list[tuple] = field(default_factory=list)
    highlighted: bool = False
    hops: list[dict] = field(default_factory=list)  # summaries of the operators drawn inside

    def merge(self, other: Drawing, dx: float, dy: float) -> None:
        self.boxes += [(g, x + dx, y + dy, w, h) for g, x, y, w, h in other.boxes]
        self.edges += [(a, b, k, [c + (dx if q % 2 == 0 else dy) for q, c in enumerate(pts)], dashed)
                       for a, b, k, pts, dashed in other.edges]
        self.frames += [(label, x0 + dx, y0 + dy, x1 + dx, y1 + dy, depth, flag)
                        for label, x0, y0, x1, y1, depth, flag in other.frames]
        self.highlighted = self.highlighted or other.highlighted


def inline_nodes(call: HopCall) -> int:
    """About how many nodes drawing ``call`` puts inside its frame: what it weighs on a page."""
    return sum(min(nodes_in(use.graph), INLINE_NODES) for use in call.subgraphs)


#: entry(node, value text, flags, inputs, page, scope, folded, into) -> the page's node record
Entry = Callable[[NodeRecord, str, int, list[int], int, str, list[int], int], dict]


class HopDrawer:
    """Draws the operators of one page graph, adding their subgraphs' nodes to ``nodes`` (the
    page's node records, whose indices are the gids), and keeps a summary for ``--json``."""

    def __init__(self, nodes: list[dict], entry: Entry, box: Callable[..., tuple[float, float]],
                 flags_of: Callable[[GraphRecord], dict[str, int]],
                 own_graph: Callable[[str, SubgraphUse], tuple[str, bool]]):
        self.nodes, self.entry, self.box, self.flags_of, self.own_graph = nodes, entry, box, flags_of, own_graph
        self.first_drawn: dict[int, str] = {}  # id of a subgraph's record -> the scope it was drawn in

    def draw(self, call: HopCall, gid: int, env: dict[str, int], page: int, scope: str,
             depth: int = 0) -> tuple[Drawing | None, dict]:
        """The compound box of operator node ``gid`` (``env``: outer node name -> gid), None for
        an operator without subgraphs, and its summary (``node``, ``operator``, ``calls``,
        ``subgraphs``)."""
        header = self.nodes[gid]
        header["l"] = call.label
        summary = {"node": call.node, "operator": call.operator, "calls": call.calls, "subgraphs": []}
        if not call.subgraphs:
            return None, summary
        hw, hh = self.box(header["l"], header["n"], len(header["w"]))
        parts: list[tuple[str, Drawing, list[int]]] = []
        for use in call.subgraphs:
            label = f"{call.operator}: {use.role}"
            where = f"{scope} › {call.node}: {use.role}" if scope else f"{call.node}: {use.role}"
            inner, inputs, how = self._use(use, where, env, page, depth)
            parts.append((label, inner, inputs))
            summary["subgraphs"].append({"role": use.role, "path": use.path, "nodes": len(use.graph.nodes),
                                         "ops": ops_in(use.graph), "drawn": how, "highlighted": inner.highlighted,
                                         "hops": inner.hops})
        d = Drawing()
        widths = [max(inner.w + 2 * PAD, 6.6 * len(label) + 16.0) for label, inner, _ in parts]
        frames_w = sum(widths) + GAP * max(0, len(parts) - 1)
        d.w = max(hw, frames_w) + 2 * PAD
        top = PAD + hh + GAP
        d.h = top + max((p[1].h + TITLE + PAD for p in parts), default=0.0) + PAD
        d.header = (d.w / 2, PAD + hh / 2, hw, hh)
        d.boxes.append((gid, *d.header))
        x = (d.w - frames_w) / 2
        for (label, inner, inputs), fw in zip(parts, widths):
            fh = inner.h + TITLE + PAD
            d.frames.append((label, x, top, x + fw, top + fh, depth + 1, FLAG_HIGHLIGHT if inner.highlighted else 0))
            d.merge(inner, x + (fw - inner.w) / 2, top + TITLE)
            for g in inputs:  # the operator hands each subgraph input its value
                _, cx, cy, _, bh = next(b for b in d.boxes if b[0] == g)
                d.edges.append((gid, g, "l", [d.header[0], d.header[1] + hh / 2, cx, cy - bh / 2], True))
            x += fw + GAP
        d.frames.insert(0, ("", 0.0, 0.0, d.w, d.h, depth, FLAG_HIGHLIGHT if d.highlighted else 0))
        if d.highlighted:
            header["f"] |= FLAG_INSIDE
        return d, summary

    def _use(self, use: SubgraphUse, where: str, env: dict[str, int], page: int,
             depth: int) -> tuple[Drawing, list[int], str]:
        """One subgraph drawn for its frame: (drawing, gids of its drawn inputs, how it was drawn)."""
        first = self.first_drawn.get(id(use.graph))
        hidden = subgraph_attributes(use.graph)
        drawn = sum(1 for n in use.graph.nodes if n.name not in hidden)
        if first is None:
            self.first_drawn[id(use.graph)] = where
        if first is None and drawn <= INLINE_NODES:
            d, inputs = self._graph(use, where, env, page, depth + 1)
            return d, inputs, "inline"
        highlighted = False
        if first is not None:
            text, how = f"the subgraph drawn in {first}", "same as " + first
        else:  # too big for a frame: a graph of its own (``own_graph`` says whether it highlights a node)
            key, highlighted = self.own_graph(where, use)
            text, how = f"{drawn} nodes: drawn below as a graph of its own", f"own graph {key}"
        node = NodeRecord(op="get_attr", name=use.path, target=use.path)
        gid = len(self.nodes)
        self.nodes.append(self.entry(node, text, FLAG_INSIDE if highlighted else 0, [], page, where, [], -1))
        self.nodes[gid].update(k="subgraph", l=f"{ops_in(use.graph)} ops")
        w, h = self.box(text[:40], use.path)
        d = Drawing(w=w, h=h, boxes=[(gid, w / 2, h / 2, w, h)], highlighted=highlighted)
        return d, [], how

    def _graph(self, use: SubgraphUse, where: str, env: dict[str, int], page: int,
               depth: int) -> tuple[Drawing, list[int]]:
        graph = use.graph
        nodes = graph.nodes
        hidden = subgraph_attributes(graph)
        local = {n.name: i for i, n in enumerate(nodes)}
        inputs_of = [sorted({local[r] for r in iter_arg_refs([n.args, list(n.kwargs.values())])
                             if r in local and r not in hidden}) for n in nodes]
        flags = self.flags_of(graph)
        folding = graph_folding.fold(graph, inputs_of, {}, flags)
        calls = hop_calls(graph)
        shown = [i for i, n in enumerate(nodes) if n.name not in hidden and folding.drawn(i)]
        placeholders = [i for i, n in enumerate(nodes) if n.op == "placeholder"]
        gid_of = self._entries(use, placeholders, env, page, where, hidden, inputs_of, flags, folding)
        scope = {n.name: gid_of[i] for i, n in enumerate(nodes) if i in gid_of}
        inner: dict[int, Drawing] = {}
        hops = []
        sizes = []
        for i in shown:
            drawing = None
            if nodes[i].name in calls:
                drawing, summary = self.draw(calls[nodes[i].name], gid_of[i], scope, page, where, depth)
                hops.append(summary)
            if drawing is not None:
                inner[i] = drawing
                sizes.append((drawing.w, drawing.h))
            else:
                n = self.nodes[gid_of[i]]
                sizes.append(self.box(n["v"] if n["k"] == "input" else n["l"], "▶ " + n["n"], len(n["w"])))
        pos = {i: k for k, i in enumerate(shown)}
        edges = [(pos[j], pos[i]) for i in shown for j in inputs_of[i] if j in pos]
        lay = graph_layout.layout(sizes, edges)
        d = Drawing(w=lay.width, h=lay.height)
        for k, i in enumerate(shown):
            (cx, cy), (w, h) = lay.centres[k], sizes[k]
            if i in inner:
                d.merge(inner[i], cx - w / 2, cy - h / 2)
            else:
                d.boxes.append((gid_of[i], cx, cy, w, h))
        d.edges += [(gid_of[shown[a]], gid_of[shown[b]], kind[0], pts, False)
                    for (a, b), (kind, pts) in zip(edges, lay.paths)]
        d.highlighted = d.highlighted or any(flags.get(nodes[i].name, 0) & FLAG_HIGHLIGHT for i in gid_of)
        d.hops = hops
        return d, [gid_of[i] for i in placeholders if i in gid_of and i in pos]

    def _entries(self, use: SubgraphUse, placeholders: list[int], env: dict[str, int], page: int, where: str,
                 hidden: set[str], inputs_of: list[list[int]], flags: dict[str, int],
                 folding: graph_folding.Folding) -> dict[int, int]:
        """Each drawn node's entry (node index -> its gid); a placeholder reads the outer value
        bound to it, so the edge crosses into the subgraph."""
        nodes = use.graph.nodes
        gid_of: dict[int, int] = {}
        for i, n in enumerate(nodes):
            if n.name in hidden:
                continue
            value, ins = "", [gid_of[j] for j in inputs_of[i] if j in gid_of]
            if n.op == "placeholder":
                k = placeholders.index(i)
                binding = use.bindings[k] if k < len(use.bindings) else None
                if binding is not None:
                    value = f"← {binding.text}"
                    if binding.node in env:
                        ins = [env[binding.node]]
            folded = [w for w in folding.folded.get(i, []) if nodes[w].name not in hidden]
            gid_of[i] = len(self.nodes)
            self.nodes.append(self.entry(n, value, flags.get(n.name, 0), ins, page, where,
                                         folded, folding.into.get(i, -1)))
        for w in folding.into:  # a folded constant points at the gid of the op it is drawn in
            if w in gid_of:
                self.nodes[gid_of[w]]["into"] = gid_of.get(folding.into[w], -1)
        for g in gid_of.values():
            folded = self.nodes[g]["w"] = [gid_of[w] for w in self.nodes[g]["w"] if w in gid_of]
            self.nodes[g]["ws"] = graph_folding.folded_text([self.nodes[w]["n"] for w in folded]) if folded else ""
        return gid_of
