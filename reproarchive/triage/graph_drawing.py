"""The graph of ``view``'s page: each node's kind, label, code line and value, the pages a large
graph is cut into, each page's layout with its module frames, and the frames of higher-order
operators holding their subgraphs (``graph_hops``).

It lives apart from ``triage.view`` (which reads the archive and the archives next to it, and
writes the page) because turning a ``GraphRecord`` into what the page draws is a piece of its own,
and the largest: ``view`` calls ``draw_graph`` and names what to highlight (``Marks``). Like
``view`` it reads the archive's own ``NodeRecord.meta``, never an FX node's, and imports no torch.
"""

from __future__ import annotations

import re

from reproarchive.archive.graph_code import node_line, node_lines, printable, source_line
from reproarchive.archive.inspection import InputRow, input_rows
from reproarchive.format.schema import COMPUTE_OPS, GraphRecord, Index, NodeRecord
from reproarchive.format.schema.rules.graph import iter_arg_refs
from reproarchive.triage import graph_folding, graph_hops, graph_layout, graph_subgraphs

#: Ops per page of a large graph; a graph with at most ``SINGLE_PAGE_NODES`` nodes is one page.
PAGE_OPS = 200
SINGLE_PAGE_NODES = 400

FLAG_HIGHLIGHT = 1  # the failing node, or the region a minified archive kept
FLAG_BOUNDARY = 2  # a value the minified archive takes as an input instead of computing it

_MATMUL = re.compile(r"^(mm|bmm|addmm|baddbmm|addbmm|matmul|linear|conv\w*|convolution\w*|einsum|"
                     r"_?scaled_dot_product\w*|_?flash_attention\w*|_?efficient_attention\w*|addmv|mv|dot)$")
_REDUCTION = re.compile(r"^(sum|mean|amax|amin|max|min|var|std|var_mean|prod|_?softmax|_?log_softmax|logsumexp|"
                        r"argmax|argmin|cumsum|cumprod|norm|linalg_vector_norm|any|all|native_layer_norm|layer_norm|"
                        r"native_batch_norm|_native_batch_norm_legit\w*|batch_norm|group_norm|native_group_norm|"
                        r"rms_norm|_fused_rms_norm)$")
_VIEW = re.compile(r"^(view|_unsafe_view|reshape|permute|transpose|t|expand|expand_as|squeeze|unsqueeze|slice|select|"
                   r"as_strided|flatten|unflatten|split|split_with_sizes|chunk|cat|stack|getitem|contiguous|clone|"
                   r"alias|narrow|unbind|view_as|_reshape_alias|index_select|gather|repeat|copy|_to_copy|to|"
                   r"detach|lift_fresh_copy|type_as|float|half|bfloat16|int|long|size|sym_size|stride)$")
_TARGET_IN_MESSAGE = re.compile(r"\btarget: ([\w.]+)")


class Marks:
    """What to highlight in the graph or any subgraph: the nodes the failure names (inductor's
    LoweringException says ``target: aten.<op>.<overload>``; a compute node whose name the first
    line says as a word, as ``triage`` finds the failing node: "the graph calls relu") and, in a
    parent's subgraphs, the nodes a minified child kept (same name and target: inlining an
    operator keeps its subgraph's names)."""

    def __init__(self, failure, kept: Index | None = None):
        message = failure.message if failure is not None else ""
        self.targets = set(_TARGET_IN_MESSAGE.findall(message))
        first = next((ln for ln in message.splitlines() if ln.strip()), "")
        self.words = set(re.findall(r"[A-Za-z_]\w*", first))
        self.kept = {(n.name, n.target) for n in kept.graph.nodes if n.op in COMPUTE_OPS} if kept else set()

    def __call__(self, graph: GraphRecord) -> dict[str, int]:
        return {n.name: FLAG_HIGHLIGHT for n in graph.nodes if n.op in COMPUTE_OPS and (
            n.name in self.words or (n.name, n.target) in self.kept
            or any(n.target == t or n.target.endswith("." + t) for t in self.targets))}


# --------------------------------------------------------------------------------------------
# the graph


def classify(op: str, target: str) -> tuple[str, str]:
    """(kind, short label) of a node: the kind picks its colour, the label is drawn in its box."""
    if op == "placeholder":
        return "input", "input"
    if op == "output":
        return "output", "output"
    if op == "get_attr":
        return "attribute", target.rsplit(".", 1)[-1]
    if op == "call_module":
        return "module", target
    short = target
    for prefix in ("torch.ops.", "torch.nn.functional.", "torch._C._nn.", "torch._C._VariableFunctions.",
                   "torch.", "operator.", "_operator."):
        if short.startswith(prefix):
            short = short[len(prefix):]
            break
    parts = short.split(".")
    if parts[0] in ("aten", "prims", "quantized", "_c10d_functional", "higher_order") and len(parts) >= 2:
        base = parts[1]
        label = parts[1] if parts[0] == "higher_order" else f"{parts[0]}.{parts[1]}"
    else:
        base = parts[-1]
        label = short
    if op == "call_method":
        base, label = target, f".{target}()"
    if parts[0] == "higher_order":
        kind = "hop"
    elif _MATMUL.match(base):
        kind = "matmul"
    elif _REDUCTION.match(base):
        kind = "reduction"
    elif _VIEW.match(base):
        kind = "view"
    else:
        kind = "compute"
    return kind, label


def _value_text(node) -> str:
    val = node.meta.get("val") if isinstance(node.meta, dict) else None
    if isinstance(val, dict):
        if "dtype" in val:
            return f"{val['dtype']}{list(val.get('shape') or [])} {val.get('device') or ''}".strip()
        if "sym" in val:
            return str(val["sym"])
        if "value" in val:
            return repr(val["value"])
    if isinstance(val, list):
        return f"{len(val)} values"
    return ""


def _input_text(row: InputRow) -> str:
    if row.kind == "tensor":
        return f"{row.dtype}{list(row.shape or ())} {row.device}, {row.fidelity}"
    return f"{row.kind} {'' if row.value is None else row.value}".strip()


def _pages(graph: GraphRecord, inputs_of: list[list[int]], folding: graph_folding.Folding,
           inside: dict[int, int]) -> list[list[int]]:
    """Node indices per page. Ops are cut in graph order, at most PAGE_OPS a page (a
    higher-order operator counts the nodes it draws ``inside`` its frame too), and where the
    model's top-level block changes (``layers.3`` -> ``layers.4``) once a page is three quarters
    full; an input goes on the page of its first user, a folded weight on its consumer's, the
    output on the last page."""
    nodes = graph.nodes
    if sum(1 for i in range(len(nodes)) if folding.drawn(i)) + sum(inside.values()) <= SINGLE_PAGE_NODES:
        return [list(range(len(nodes)))]
    page_of: list[int | None] = [None] * len(nodes)
    page = count = 0
    block = None
    for i, n in enumerate(nodes):
        if n.op in COMPUTE_OPS:
            here = graph_folding.top_block(folding.module[i])
            if count >= PAGE_OPS or (count >= PAGE_OPS * 3 // 4 and here is not None and here != block):
                page, count = page + 1, 0
            block = here if here is not None else block
            page_of[i] = page
            count += 1 + inside.get(i, 0)
    for i, n in enumerate(nodes):
        if n.op == "output":
            page_of[i] = page
    for i in range(len(nodes)):
        for j in inputs_of[i]:
            if page_of[j] is None and page_of[i] is not None:
                page_of[j] = page_of[i]
    pages: list[list[int]] = [[] for _ in range(page + 1)]
    for i, p in enumerate(page_of):
        pages[p if p is not None else 0].append(i)
    return [p for p in pages if p]


def _box(label: str, name: str, folded: int = 0) -> tuple[float, float]:
    """A box wide enough for its label; taller when it lists the weights folded into it."""
    return (max(56.0, min(240.0, 7.0 * max(len(label), len(name)) + 16.0)), 46.0 if folded else 34.0)


def _entry(n: NodeRecord, value: str, flags: int, inputs: list[int], page: int, scope: str,
           folded: list[int], into: int) -> dict:
    """A node of a subgraph as the page draws it (``s``: the operator frame it is drawn in)."""
    kind, label = classify(n.op, n.target)
    return {"n": n.name, "o": n.op, "t": n.target, "k": kind, "l": label, "c": node_line(n),
            "v": value or _value_text(n), "f": flags, "i": inputs, "p": page, "m": "", "w": folded, "ws": "",
            "into": into, "s": scope}


def draw_graph(key: str, title: str, index: Index, code: str, flags: dict[str, int],
                marks: Marks | None = None) -> tuple[list[dict], list[dict]]:
    """The archive's graph as the page draws it, then the subgraphs too big to draw inside their
    operator's frame (each a graph of its own); and the summary of its higher-order operators."""
    graph = index.graph
    placeholders = [i for i, n in enumerate(graph.nodes) if n.op == "placeholder"]
    rows = dict(zip(placeholders, input_rows(index)))
    more: list = []
    summary: list[dict] = []
    main = _draw(key, title, graph, node_lines(code, graph), {i: _input_text(row) for i, row in rows.items()},
                 {i: bool(r.requires_grad) for i, r in rows.items()}, flags, marks or Marks(None), more, summary)
    return [main, *more], summary


def _draw(key: str, title: str, graph: GraphRecord, lines: dict[str, str], input_text: dict[int, str],
          requires_grad: dict[int, bool], flags: dict[str, int], marks: Marks, more: list,
          summary: list[dict]) -> dict:
    """One graph as the page draws it: nodes (name, op, kind, label, code line, value, flags,
    inputs) and pages, each with its layout, the producers from other pages it draws as small
    "from page N" boxes, and its higher-order operators drawn as frames holding their subgraphs."""
    nodes = graph.nodes
    index_of = {n.name: i for i, n in enumerate(nodes)}
    inputs_of = [sorted({index_of[r] for r in iter_arg_refs([n.args, list(n.kwargs.values())]) if r in index_of})
                 for n in nodes]
    folding = graph_folding.fold(graph, inputs_of, requires_grad, flags)
    calls = graph_subgraphs.hop_calls(graph)
    pages = _pages(graph, inputs_of, folding, {index_of[name]: graph_hops.inline_nodes(call)
                                               for name, call in calls.items()})
    page_of = {i: p for p, members in enumerate(pages) for i in members}
    for w, consumer in folding.into.items():
        page_of[w] = page_of[consumer]
    passed = graph_subgraphs.subgraph_attributes(graph)  # drawn as the operator's frames, not as weights
    out_nodes = _node_entries(graph, lines, input_text, flags, inputs_of, page_of, folding, passed)

    def own_graph(where: str, use: graph_subgraphs.SubgraphUse) -> tuple[str, bool]:
        more.append(None)
        slot = len(more) - 1
        sub_key = f"{key}-sub{slot + 1}"
        bound = {i: f"← {b.text}" for i, b in zip((k for k, n in enumerate(use.graph.nodes) if n.op == "placeholder"),
                                                  use.bindings)}
        more[slot] = _draw(sub_key, f"subgraph {where}", use.graph, node_lines("", use.graph), bound, {},
                           marks(use.graph), marks, more, [])
        more[slot]["heading"] = f"Subgraph {where} ({len(use.graph.nodes)} nodes)"
        return sub_key, more[slot]["highlighted"] > 0

    drawer = graph_hops.HopDrawer(out_nodes, _entry, _box, marks, own_graph)
    jobs = []
    page_items = []
    for members in pages:
        members = [i for i in members if folding.drawn(i)]
        here = set(members)
        ghosts = sorted({j for i in members for j in inputs_of[i] if j not in here and folding.drawn(j)})
        items = members + ghosts
        local = {g: k for k, g in enumerate(items)}
        hops = {}
        for i in members:
            if nodes[i].name in calls:
                drawing, hop_summary = drawer.draw(calls[nodes[i].name], i, index_of, page_of[i], "")
                summary.append(hop_summary)
                if drawing is not None:
                    hops[i] = drawing
        sizes = _sizes(members, ghosts, hops, out_nodes, nodes)
        edges = [(local[j], local[i]) for i in members for j in inputs_of[i] if j in local]
        jobs.append((sizes, edges))
        page_items.append((members, ghosts, sizes, edges, hops))
    layouts = graph_layout.layout_all(jobs)
    out_pages = [_page(members, ghosts, sizes, edges, hops, lay, folding.module)
                 for (members, ghosts, sizes, edges, hops), lay in zip(page_items, layouts)]
    start = next((n["p"] for n in out_nodes if n["f"] & FLAG_HIGHLIGHT), 0)
    return {"key": key, "title": printable(title), "nodes": out_nodes, "pages": out_pages, "start": start,
            "highlighted": sum(1 for n in out_nodes if n["f"] & FLAG_HIGHLIGHT),
            "folded": sum(1 for w in folding.into if nodes[w].name not in passed)}


def _node_entries(graph: GraphRecord, lines: dict[str, str], input_text: dict[int, str],
                  flags: dict[str, int], inputs_of: list[list[int]], page_of: dict[int, int],
                  folding: graph_folding.Folding, passed) -> list[dict]:
    """Each node of a graph as the page draws it (the weights folded into it, unless a
    higher-order operator takes them: ``passed``, drawn as the operator's frames), and (1.7) the
    model line each came from."""
    out_nodes, nodes = [], graph.nodes
    for i, n in enumerate(nodes):
        kind, label = classify(n.op, n.target)
        folded = [w for w in folding.folded.get(i, []) if nodes[w].name not in passed]
        out_nodes.append({"n": n.name, "o": n.op, "t": n.target, "k": kind, "l": label, "c": lines.get(n.name, ""),
                          "v": input_text.get(i) or _value_text(n), "f": flags.get(n.name, 0), "i": inputs_of[i],
                          "p": page_of[i], "m": folding.module[i] or "", "w": folded,
                          "ws": graph_folding.folded_text([nodes[w].name for w in folded]) if folded else "",
                          "into": folding.into.get(i, -1)})
        if n.stack is not None and (line := source_line(graph.stacks[n.stack])) is not None:
            out_nodes[-1]["src"] = line
    return out_nodes


def _sizes(members: list[int], ghosts: list[int], hops: dict, out_nodes: list[dict],
           nodes: tuple[NodeRecord, ...]) -> list[tuple[float, float]]:
    """The boxes of a page to lay out: each node's (an operator's compound box), then the ghosts'."""
    sizes = [(hops[i].w, hops[i].h) if i in hops else _box(out_nodes[i]["l"], out_nodes[i]["n"],
                                                              len(out_nodes[i]["w"])) for i in members]
    sizes += [(max(48.0, min(200.0, 6.2 * len(nodes[g].name) + 14.0)), 18.0) for g in ghosts]
    return sizes


def _page(members: list[int], ghosts: list[int], sizes, edges, hops: dict, lay, module) -> dict:
    """One laid-out page: each operator's compound box becomes its header box, its subgraphs'
    boxes (appended to the page's nodes, before the ghosts), their edges and their frames."""
    boxes, inner, inner_edges, frames = [], [], [], []
    for k, ((x, y), (w, h)) in enumerate(zip(lay.centres[:len(members)], sizes)):
        d = hops.get(members[k])
        if d is None:
            boxes.append((x, y, w, h))
            continue
        placed = graph_hops.Drawing()
        placed.merge(d, x - w / 2, y - h / 2)
        boxes.append(next(b[1:] for b in placed.boxes if b[0] == members[k]))
        inner += [b for b in placed.boxes if b[0] != members[k]]
        inner_edges += placed.edges
        frames += placed.frames
    drawn = members + [b[0] for b in inner]
    boxes += [b[1:] for b in inner]
    boxes += [(x, y, w, h) for (x, y), (w, h) in zip(lay.centres[len(members):], sizes[len(members):])]
    local = {g: k for k, g in enumerate(drawn)}
    shift = len(drawn) - len(members)  # ghosts come after the subgraphs' nodes

    def at(k: int) -> int:
        return k if k < len(members) else k + shift

    out_edges = [[at(a), at(b), kind[0], [round(c, 1) for c in pts]] for (a, b), (kind, pts) in zip(edges, lay.paths)]
    out_edges += [[local[a], local[b], kind, [round(c, 1) for c in pts], *([1] if dashed else [])]
                  for a, b, kind, pts, dashed in inner_edges]
    return {
        "nodes": drawn, "ghosts": ghosts,
        "boxes": [[round(x, 1), round(y, 1), round(w, 1), round(h, 1)] for x, y, w, h in boxes],
        "edges": out_edges,
        "groups": _frames(members, module, lay.centres, sizes),
        "hops": [[printable(label), round(x0, 1), round(y0, 1), round(x1, 1), round(y1, 1), depth, flag]
                 for label, x0, y0, x1, y1, depth, flag in frames],
        "w": round(lay.width, 1), "h": round(lay.height, 1),
    }


def _frames(members: list[int], module: list[str | None], centres, sizes) -> list[list]:
    """``[path, x0, y0, x1, y1, depth]`` around the drawn boxes of each module (at least two),
    outermost first, so the page draws the model's hierarchy behind the ops."""
    out = []
    for path, ks in graph_folding.groups(members, module):
        pad = max(4.0, 6.0 + 4.0 * (graph_folding.MAX_GROUP_DEPTH - path.count(".")))
        x0 = min(centres[k][0] - sizes[k][0] / 2 for k in ks) - pad
        x1 = max(centres[k][0] + sizes[k][0] / 2 for k in ks) + pad
        y0 = min(centres[k][1] - sizes[k][1] / 2 for k in ks) - pad - 10
        y1 = max(centres[k][1] + sizes[k][1] / 2 for k in ks) + pad
        out.append([printable(path), round(x0, 1), round(y0, 1), round(x1, 1), round(y1, 1), path.count(".")])
    return out
