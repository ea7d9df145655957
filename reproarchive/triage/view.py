"""``view``: one archive as one self-contained HTML page a person can look at.

tlparse is liked because it turns a log into pages; an archive deserves the same. The page
holds the failure (with the compiler's own error lines), the graph drawn as a picture (nodes
coloured by kind, inputs and outputs marked, the failing node or the minified region
highlighted, each node's code line on hover and click), the op histogram, the inputs, the
config changes and the machine; for a minified archive whose parent is at hand, the parent's
graph with the kept region highlighted beside the minified one.

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

from reproarchive.archive.graph_code import node_lines, printable, stored_or_rendered_code
from reproarchive.archive.inspection import InputRow, input_rows, system_summary
from reproarchive.archive.job_report import job_summary
from reproarchive.context.failure import compiler_diagnostics, failure_kind
from reproarchive.errors import ArchiveError, ViewError
from reproarchive.format import layout
from reproarchive.format.atomic import atomic_file
from reproarchive.format.index_rules import iter_arg_refs
from reproarchive.format.plain import to_plain
from reproarchive.format.reader import ContainerReader
from reproarchive.format.schema import COMPUTE_OPS, GraphRecord, Index
from reproarchive.triage import graph_layout

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

    highlight = _failure_named(index)
    if child_side is not None:
        highlight.update(_kept_region(index.graph, child_side[2]))
    main = _graph_view("graph", f"{archive.name}", index, code, highlight)
    graphs = [main]
    if parent_side is not None:
        region = _kept_region(parent_side[2].graph, index)
        graphs.append(_graph_view("parent", f"before: {parent_side[0].name} (parent)", parent_side[2],
                                  parent_side[3], region))
    data = {
        "archive": _header(archive, digest, index),
        "failure": _failure(index),
        "graphs": graphs,
        "histogram": list(index.graph.op_histogram().items()),
        "inputs": [row.to_plain() for row in input_rows(index)],
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
    }


def _failure(index: Index) -> dict | None:
    f = index.records.failure
    if f is None:
        return None
    # issue 18 may give the record the compiler's error lines; older records have only the message
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


def _failure_named(index: Index) -> dict[str, int]:
    """Nodes the error names: inductor's LoweringException says ``target: aten.<op>.<overload>``."""
    f = index.records.failure
    if f is None:
        return {}
    named = set(_TARGET_IN_MESSAGE.findall(f.message))
    if not named:
        return {}
    return {n.name: FLAG_HIGHLIGHT for n in index.graph.nodes
            if n.op in COMPUTE_OPS and any(n.target == t or n.target.endswith("." + t) for t in named)}


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
        label = f"{parts[0]}.{parts[1]}"
    else:
        base = parts[-1]
        label = short
    if op == "call_method":
        base, label = target, f".{target}()"
    if _MATMUL.match(base):
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


def _pages(graph: GraphRecord, inputs_of: list[list[int]]) -> list[list[int]]:
    """Node indices per page. Ops are cut in graph order, PAGE_OPS a page; an input or
    attribute goes on the page of its first user, the output on the last page."""
    nodes = graph.nodes
    if len(nodes) <= SINGLE_PAGE_NODES:
        return [list(range(len(nodes)))]
    page_of: list[int | None] = [None] * len(nodes)
    count = 0
    for i, n in enumerate(nodes):
        if n.op in COMPUTE_OPS:
            page_of[i] = count // PAGE_OPS
            count += 1
    last = max(0, (count - 1) // PAGE_OPS)
    for i, n in enumerate(nodes):
        if n.op == "output":
            page_of[i] = last
    for i in range(len(nodes)):
        for j in inputs_of[i]:
            if page_of[j] is None and page_of[i] is not None:
                page_of[j] = page_of[i]
    pages: list[list[int]] = [[] for _ in range(last + 1)]
    for i, p in enumerate(page_of):
        pages[p if p is not None else 0].append(i)
    return [p for p in pages if p]


def _box(label: str, name: str) -> tuple[float, float]:
    return (max(56.0, min(240.0, 7.0 * max(len(label), len(name)) + 16.0)), 34.0)


def _graph_view(key: str, title: str, index: Index, code: str, flags: dict[str, int]) -> dict:
    """The graph as the page draws it: nodes (name, op, kind, label, code line, value, flags,
    inputs) and pages, each with its layout and the producers from other pages it draws as
    small "from page N" boxes."""
    graph = index.graph
    nodes = graph.nodes
    index_of = {n.name: i for i, n in enumerate(nodes)}
    placeholders = [i for i, n in enumerate(nodes) if n.op == "placeholder"]
    input_text = {i: _input_text(row) for i, row in zip(placeholders, input_rows(index))}
    inputs_of = [sorted({index_of[r] for r in iter_arg_refs([n.args, list(n.kwargs.values())]) if r in index_of})
                 for n in nodes]
    lines = node_lines(code, graph)
    pages = _pages(graph, inputs_of)
    page_of = {i: p for p, members in enumerate(pages) for i in members}
    out_nodes = []
    for i, n in enumerate(nodes):
        kind, label = classify(n.op, n.target)
        out_nodes.append({"n": n.name, "o": n.op, "t": n.target, "k": kind, "l": label, "c": lines.get(n.name, ""),
                          "v": input_text.get(i) or _value_text(n), "f": flags.get(n.name, 0), "i": inputs_of[i],
                          "p": page_of[i]})
    jobs = []
    page_items = []
    for members in pages:
        here = set(members)
        ghosts = sorted({j for i in members for j in inputs_of[i] if j not in here})
        items = members + ghosts
        local = {g: k for k, g in enumerate(items)}
        sizes = [_box(out_nodes[i]["l"], out_nodes[i]["n"]) for i in members]
        sizes += [(max(48.0, min(200.0, 6.2 * len(nodes[g].name) + 14.0)), 18.0) for g in ghosts]
        edges = [(local[j], local[i]) for i in members for j in inputs_of[i]]
        jobs.append((sizes, edges))
        page_items.append((members, ghosts, sizes, edges))
    layouts = graph_layout.layout_all(jobs)
    out_pages = []
    for (members, ghosts, sizes, edges), lay in zip(page_items, layouts):
        out_pages.append({
            "nodes": members, "ghosts": ghosts,
            "boxes": [[round(x, 1), round(y, 1), round(w, 1), round(h, 1)]
                      for (x, y), (w, h) in zip(lay.centres, sizes)],
            "edges": [[a, b, kind[0], [round(c, 1) for c in pts]] for (a, b), (kind, pts) in zip(edges, lay.paths)],
            "w": round(lay.width, 1), "h": round(lay.height, 1),
        })
    start = next((page_of[i] for i, n in enumerate(out_nodes) if n["f"] & FLAG_HIGHLIGHT), 0)
    return {"key": key, "title": printable(title), "nodes": out_nodes, "pages": out_pages, "start": start,
            "highlighted": sum(1 for n in out_nodes if n["f"] & FLAG_HIGHLIGHT)}
