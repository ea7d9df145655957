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
set of pages that each open instantly (``graph_drawing``, ``graph_layout``). The data goes into
the page as JSON with every ``<``, ``>`` and ``&`` escaped and is only ever set as text by the
script, and a Content-Security-Policy forbids every network request: an archive from someone
else cannot make the page run anything or fetch anything.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path

from reproarchive.archive.graph_code import printable, stored_or_rendered_code
from reproarchive.archive.inspection import input_rows, shape_policy_lines, system_summary
from reproarchive.archive.job_report import job_summary
from reproarchive.context.failure import compiler_diagnostics, failure_kind
from reproarchive.errors import ArchiveError, ViewError
from reproarchive.format import layout
from reproarchive.format.atomic import atomic_file
from reproarchive.format.plain import to_plain
from reproarchive.format.reader import ContainerReader
from reproarchive.format.schema import COMPUTE_OPS, GraphRecord, Index
from reproarchive.triage import graph_layout, graph_subgraphs
from reproarchive.triage.graph_drawing import FLAG_BOUNDARY, FLAG_HIGHLIGHT, Marks, draw_graph

#: Archives next to this one whose indexes are read to find its parent or minified child.
MAX_SIBLINGS = 64
MAX_MESSAGE_CHARS = 20000


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
    parent_side, child_side = _related(archive, parent, digest, index, limits, warnings)
    marks = Marks(index.records.failure, child_side[2] if child_side else None)
    highlight = Marks(index.records.failure)(index.graph)
    if child_side is not None:
        highlight.update(_kept_region(index.graph, child_side[2]))
    graphs, subgraphs = draw_graph("graph", f"{archive.name}", index, code, highlight, marks)
    main = graphs[0]
    if parent_side is not None:
        region = _kept_region(parent_side[2].graph, index)
        graphs += draw_graph("parent", f"before: {parent_side[0].name} (parent)", parent_side[2],
                             parent_side[3], region, Marks(None, index))[0]
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
        "job": job_summary(index.job, index.records).to_plain() if index.job is not None else None,  # spec §8 job
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


def _related(archive: Path, parent: str | os.PathLike | None, digest: str, index: Index, limits,
             warnings: list[str]):
    """(parent, minified child) of ``archive``, each (path, digest, index, code) or None: the
    ``parent`` given (warning when the archive does not record it), else the archives next to it."""
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
    return parent_side, child_side


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
