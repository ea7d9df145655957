"""``view``: one archive as one self-contained HTML page a person can look at.

tlparse is liked because it turns a log into pages; an archive deserves the same. The page
holds the failure (with the compiler's own error lines), the graph drawn as a picture (nodes
coloured by kind, inputs and outputs marked, the failing node or the minified region
highlighted, each node's code line on hover and click), the op histogram, the inputs, the
config changes and the machine; for a minified archive whose parent is at hand, the parent's
graph with the kept region highlighted beside the minified one. A higher-order operator
(``cond``, ``while_loop``, ``flex_attention``, checkpointing ...) is drawn as a frame holding
its subgraphs, so a failure inside a branch is seen where it is (``graph_hops``).

Everything is computed here, from the index (and the small ``graph.py``); the page only draws.
Layout runs per page of at most ``PAGE_OPS`` ops, so a graph of thousands of nodes becomes a
set of pages that each open instantly (``graph_layout``). The data goes into the page as JSON
with every ``<``, ``>`` and ``&`` escaped and is only ever set as text by the script, and a
Content-Security-Policy forbids every network request: an archive from someone else cannot
make the page run anything or fetch anything.
"""

from __future__ import annotations

import json
import os
import re
from importlib import resources
from pathlib import Path

from reproarchive.archive.graph_code import node_line, node_lines, printable, stored_or_rendered_code
from reproarchive.archive.inspection import InputRow, input_rows, shape_policy_lines, system_summary
from reproarchive.archive.job_report import job_summary
from reproarchive.context.failure import compiler_diagnostics, failure_kind
from reproarchive.errors import ArchiveError, ViewError
from reproarchive.format import layout
from reproarchive.format.atomic import atomic_file
from reproarchive.format.plain import to_plain
from reproarchive.format.reader import ContainerReader
from reproarchive.format.schema import COMPUTE_OPS, GraphRecord, Index, NodeRecord
from reproarchive.format.schema.rules.graph import iter_arg_refs
from reproarchive.triage import graph_folding, graph_hops, graph_layout, graph_subgraphs

#: Ops per page of a large graph; a graph with at most ``SINGLE_PAGE_NODES`` nodes is one page.
PAGE_OPS = 200
SINGLE_PAGE_NODES = 400
#: Archives next to this one whose indexes are read to find its parent or minified child.
MAX_SIBLINGS = 64
MAX_MESSAGE_CHARS = 20000

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


def default_output(archive: str | os.PathLike) -> Path:
    """``repro.tar.zst`` -> ``repro.html`` next to it."""
    path = Path(archive)
    name = path.name
    for suffix in (".tar.zst", ".zst", ".tar"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return path.with_name(f"{name}.html")


def view(archive: str | os.PathLike, output: str | os.PathLike | None = None, *,
         parent: str | os.PathLike | None = None, limits: layout.Limits = layout.DEFAULT_LIMITS) -> dict:
    """Write ARCHIVE as a self-contained HTML page (``output``, default next to the archive).

    ``parent``: for a minified archive, the archive it was minified from, to show before and
    after; by default it is looked for among the archives next to this one, and so is a
    minified child of this archive, whose kept region is then highlighted. Returns what was
    written (``output``, ``nodes``, ``pages``, ``layout``, ``parent``, ``warnings``)."""
    archive = Path(archive)
    out = Path(output) if output is not None else default_output(archive)
    warnings: list[str] = []
    with ContainerReader(archive, limits=limits) as reader:
        index, digest = reader.index, reader.index_digest
        code = stored_or_rendered_code(reader)
    parent_side = child_side = None
    if parent is not None:
        parent_side = _open_related(Path(parent), limits)
        if index.records.parent is None:
            warnings.append(f"{archive.name} records no parent; showing {Path(parent).name} beside it anyway")
        elif parent_side[1] != index.records.parent:
            warnings.append(f"{Path(parent).name} is not the archive {archive.name} was minified from")
    else:
        parent_side, child_side = _find_related(archive, digest, index, limits)
    if index.records.parent is not None and parent_side is None:
        warnings.append(f"minified from {index.records.parent[:19]}..., which is not next to it "
                        "(--parent shows before and after)")

    marks = _Marks(index.records.failure, child_side[2] if child_side else None)
    highlight = _Marks(index.records.failure)(index.graph)
    if child_side is not None:
        highlight.update(_kept_region(index.graph, child_side[2]))
    graphs, subgraphs = _graph_view("graph", f"{archive.name}", index, code, highlight, marks)
    main = graphs[0]
    if parent_side is not None:
        region = _kept_region(parent_side[2].graph, index)
        graphs += _graph_view("parent", f"before: {parent_side[0].name} (parent)", parent_side[2],
                              parent_side[3], region, _Marks(None, index))[0]
    data = {
        "archive": _header(archive, digest, index),
        "failure": _failure(index),
        "graphs": graphs,
        "histogram": list(index.graph.op_histogram().items()),
        "inputs": [row.to_plain() for row in input_rows(index)],
        "shapes": shape_policy_lines(index.records.shapes),
        "config": _config(index),
        "system": system_summary(index.records.system).to_plain() if index.records.system else None,
        "environment": dict(index.records.environment.variables) if index.records.environment else {},
        "related": {"parent": str(parent_side[0]) if parent_side else None,
                    "child": str(child_side[0]) if child_side else None},
        "layout": graph_layout.engine(),
        "job": job_summary(index.job).to_plain() if index.job is not None else None,  # spec §8 job
    }
    page = render_page(data)
    try:
        with atomic_file(out, fsync=False) as f:
            f.write(page.encode("utf-8"))
    except OSError as exc:
        raise ViewError(f"cannot write {out}: {exc.strerror or exc}", "choose another -o") from None
    return {"archive": str(archive), "output": str(out), "nodes": len(index.graph.nodes), "pages": len(main["pages"]),
            "layout": data["layout"], "parent": data["related"]["parent"], "child": data["related"]["child"],
            "subgraphs": subgraphs,
            "bytes": len(page.encode("utf-8")), "warnings": warnings}


def render_page(data: dict) -> str:
    """The page: the template with the report as inert JSON (``<``, ``>``, ``&`` escaped, so no
    string from an archive can close the script element)."""
    payload = json.dumps(data, separators=(",", ":"), default=str, ensure_ascii=False)
    for ch, esc in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        payload = payload.replace(ch, esc)
    template = resources.files("reproarchive.triage").joinpath("page.html").read_text(encoding="utf-8")
    title = data["archive"]["name"].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return template.replace("__TITLE__", title).replace("__REPORT_JSON__", payload)


# --------------------------------------------------------------------------------------------
# the archive around the graph


def _header(path: Path, digest: str, index: Index) -> dict:
    minify = index.records.minify
    return {
        "name": printable(path.name), "digest": digest, "format": index.version, "backend": index.records.backend,
        "accuracy": bool(index.records.accuracy), "source": index.records.source.kind if index.records.source else None,
        "graph_kind": index.records.graph_kind, "parent": index.records.parent,
        "created_by": to_plain(index.records.created_by) if index.records.created_by else None,
        "minify": ({"initial_ops": minify.initial_ops, "final_ops": minify.final_ops, "calls": minify.calls,
                    "stop_reason": minify.stop_reason} if minify else None),
        "nodes": len(index.graph.nodes), "ops": index.graph.op_count(),
        "subgraph_ops": graph_subgraphs.ops_in(index.graph) - index.graph.op_count(),
    }


def _failure(index: Index) -> dict | None:
    f = index.records.failure
    if f is None:
        return None
    # a newer record may carry the compiler's error lines; older records have only the message
    diagnostics = list(getattr(f, "diagnostics", None) or ()) or compiler_diagnostics(f.message) \
        or compiler_diagnostics(f.traceback)
    accuracy = None
    if f.accuracy is not None:
        accuracy = {"tolerance": f.accuracy.tolerance, "summary": f.accuracy.summary,
                    "outputs": [to_plain(o) for o in f.accuracy.outputs if not o.passed]}
    return {"kind": failure_kind(f), "stage": f.stage, "exception_type": f.exception_type,
            "message": printable(f.message[:MAX_MESSAGE_CHARS]), "signature": f.signature, "backend": f.backend,
            "diagnostics": [printable(d) for d in diagnostics], "accuracy": accuracy}


def _config(index: Index) -> list[dict]:
    c = index.records.config
    if c is None:
        return []
    rows = [{"name": f"{module}.{key}", "value": value, "default": c.defaults.get(module, {}).get(key)}
            for module, values in sorted(c.changed.items()) for key, value in sorted(values.items())]
    rows += [{"name": f"{u.module}.{u.key}", "value": u.repr, "default": None, "unrepresentable": u.reason}
             for u in c.unrepresentable if u.changed]
    return rows


# --------------------------------------------------------------------------------------------
# related archives: the parent of a minified archive, or this archive's minified child


def _open_related(path: Path, limits) -> tuple[Path, str, Index, str]:
    with ContainerReader(path, limits=limits) as reader:
        return path, reader.index_digest, reader.index, stored_or_rendered_code(reader)


def _find_related(archive: Path, digest: str, index: Index, limits):
    """(parent, minified child) among the archives in the same folder, each (path, digest,
    index, code) or None. Unreadable neighbours are not related, not errors."""
    parent = child = None
    try:
        siblings = sorted(p for p in archive.resolve().parent.glob("*.tar.zst") if p.resolve() != archive.resolve())
    except OSError:
        return None, None
    for path in siblings[:MAX_SIBLINGS]:
        try:
            with ContainerReader(path, limits=limits) as reader:
                if index.records.parent is not None and parent is None and reader.index_digest == index.records.parent:
                    parent = (path, reader.index_digest, reader.index, stored_or_rendered_code(reader))
                elif reader.index.records.parent == digest and (child is None or len(reader.index.graph.nodes)
                                                        < len(child[2].graph.nodes)):
                    child = (path, reader.index_digest, reader.index, "")
        except (ArchiveError, OSError):
            continue
    return parent, child


def _kept_region(parent_graph: GraphRecord, child: Index) -> dict[str, int]:
    """Nodes of the parent's graph the minified child kept (same name and target: the minifier
    keeps names), and the values it takes as inputs instead of computing them."""
    parent_nodes = {n.name: n for n in parent_graph.nodes}
    region = {n.name: FLAG_HIGHLIGHT for n in child.graph.nodes
              if n.op in COMPUTE_OPS and n.name in parent_nodes and parent_nodes[n.name].target == n.target}
    minify = child.records.minify
    for origin in (minify.input_origins if minify and minify.input_origins else ()):
        kind, _, name = origin.partition(":")
        if kind == "node" and name in parent_nodes:
            region.setdefault(name, FLAG_BOUNDARY)
    return region


_TARGET_IN_MESSAGE = re.compile(r"\btarget: ([\w.]+)")


class _Marks:
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


def _graph_view(key: str, title: str, index: Index, code: str, flags: dict[str, int],
                marks: _Marks | None = None) -> tuple[list[dict], list[dict]]:
    """The archive's graph as the page draws it, then the subgraphs too big to draw inside their
    operator's frame (each a graph of its own); and the summary of its higher-order operators."""
    graph = index.graph
    placeholders = [i for i, n in enumerate(graph.nodes) if n.op == "placeholder"]
    rows = dict(zip(placeholders, input_rows(index)))
    more: list = []
    summary: list[dict] = []
    main = _draw(key, title, graph, node_lines(code, graph), {i: _input_text(row) for i, row in rows.items()},
                 {i: bool(r.requires_grad) for i, r in rows.items()}, flags, marks or _Marks(None), more, summary)
    return [main, *more], summary


def _draw(key: str, title: str, graph: GraphRecord, lines: dict[str, str], input_text: dict[int, str],
          requires_grad: dict[int, bool], flags: dict[str, int], marks: _Marks, more: list,
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
    out_nodes = []
    for i, n in enumerate(nodes):
        kind, label = classify(n.op, n.target)
        folded = [w for w in folding.folded.get(i, []) if nodes[w].name not in passed]
        out_nodes.append({"n": n.name, "o": n.op, "t": n.target, "k": kind, "l": label, "c": lines.get(n.name, ""),
                          "v": input_text.get(i) or _value_text(n), "f": flags.get(n.name, 0), "i": inputs_of[i],
                          "p": page_of[i], "m": folding.module[i] or "", "w": folded,
                          "ws": graph_folding.folded_text([nodes[w].name for w in folded]) if folded else "",
                          "into": folding.into.get(i, -1)})

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
        sizes = [(hops[i].w, hops[i].h) if i in hops else _box(out_nodes[i]["l"], out_nodes[i]["n"],
                                                                  len(out_nodes[i]["w"])) for i in members]
        sizes += [(max(48.0, min(200.0, 6.2 * len(nodes[g].name) + 14.0)), 18.0) for g in ghosts]
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
