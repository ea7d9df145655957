"""Where each node of a drawn graph goes: a layered (Sugiyama) layout, computed before the page
is written so the browser only draws.

An FX graph is a DAG read top to bottom, which is exactly what layered layout is for. Two
well-kept implementations are used, best first:

* Graphviz ``dot`` (network-simplex ranking and positioning, spline routing): the reference
  layered layout, when the ``dot`` program is installed. It is given only generated node ids
  and box sizes — never text from the archive — and pages are laid out concurrently, each
  under a time limit.
* grandalf's ``SugiyamaLayout``: pure Python, installed with reproarchive's ``view`` extra,
  so ``view`` works on any machine; about 2x slower and with straight edge segments.

Both take the same input (box sizes in pixels, edges as index pairs) and give the same
output (box centres, edge polylines or cubic Bézier control points, and the drawing's size),
so the page does not know which one ran.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import subprocess
from dataclasses import dataclass

from reproarchive.errors import ViewError

#: Seconds one page may take in ``dot`` before grandalf lays it out instead.
DOT_TIMEOUT_S = 60.0
_POINTS = 72.0  # dot measures in inches; the page in CSS pixels (1 px = 1 pt here)


@dataclass(frozen=True)
class Layout:
    """Box centres ``(x, y)`` in input order, one path per input edge, the drawing's size.
    A path is ``("bezier", [x0, y0, x1, y1, ...])`` (cubic control points: 3k+1 points) or
    ``("line", [...])`` (a polyline)."""

    centres: list[tuple[float, float]]
    paths: list[tuple[str, list[float]]]
    width: float
    height: float
    engine: str


def engine() -> str:
    """The layout engine ``layout`` uses here: ``dot`` or ``grandalf``; raises ViewError
    when neither is installed."""
    if shutil.which("dot"):
        return "dot"
    try:
        import grandalf  # noqa: F401
    except ImportError:
        raise ViewError("no graph layout engine is installed",
                        "install Graphviz (apt-get install graphviz) or pip install 'reproarchive[view]'") from None
    return "grandalf"


def layout_all(graphs: list[tuple[list[tuple[float, float]], list[tuple[int, int]]]]) -> list[Layout]:
    """Lay out several graphs (pages), each given as (box sizes, edges); concurrently with dot."""
    if engine() == "dot" and len(graphs) > 1:
        workers = max(1, min(len(graphs), os.cpu_count() or 1))
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            return list(pool.map(lambda g: layout(*g), graphs))
    return [layout(*g) for g in graphs]


def layout(sizes: list[tuple[float, float]], edges: list[tuple[int, int]]) -> Layout:
    """A layered top-to-bottom layout of boxes ``sizes`` (width, height in px) joined by
    ``edges`` (index pairs, from producer to user)."""
    if not sizes:
        return Layout([], [], 0.0, 0.0, "none")
    if engine() == "dot":
        try:
            return _dot(sizes, edges)
        except (subprocess.TimeoutExpired, subprocess.CalledProcessError, OSError, ValueError):
            pass  # a page dot cannot lay out in time is laid out by grandalf (when installed)
    try:
        return _grandalf(sizes, edges)
    except ImportError:
        raise ViewError("Graphviz dot failed on this graph and grandalf is not installed",
                        "pip install 'reproarchive[view]'") from None


def _dot(sizes, edges) -> Layout:
    lines = ["digraph G {", "graph [rankdir=TB nodesep=0.22 ranksep=0.32 splines=spline];",
             "node [shape=box fixedsize=true label=\"\"];", "edge [arrowhead=none];"]
    lines += [f"n{i} [width={w / _POINTS:.3f} height={h / _POINTS:.3f}];" for i, (w, h) in enumerate(sizes)]
    lines += [f"n{a} -> n{b};" for a, b in edges]
    lines.append("}")
    out = subprocess.run(["dot", "-Tplain"], input="\n".join(lines), capture_output=True, text=True,
                         timeout=DOT_TIMEOUT_S, check=True).stdout
    centres: list[tuple[float, float]] = [(0.0, 0.0)] * len(sizes)
    paths: dict[tuple[int, int], list[list[float]]] = {}
    height = width = 0.0
    for line in out.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "graph":
            width, height = float(parts[2]) * _POINTS, float(parts[3]) * _POINTS
        elif parts[0] == "node":
            centres[int(parts[1][1:])] = (float(parts[2]) * _POINTS, height - float(parts[3]) * _POINTS)
        elif parts[0] == "edge":
            n = int(parts[3])
            pts: list[float] = []
            for k in range(n):
                pts += [float(parts[4 + 2 * k]) * _POINTS, height - float(parts[5 + 2 * k]) * _POINTS]
            paths.setdefault((int(parts[1][1:]), int(parts[2][1:])), []).append(pts)
    if len(centres) != len(sizes):
        raise ValueError("dot returned another number of nodes")
    out_paths = []
    for a, b in edges:
        found = paths.get((a, b))
        out_paths.append(("bezier", found.pop()) if found else ("line", [*centres[a], *centres[b]]))
    return Layout(centres, out_paths, width, height, "dot")


class _Box:
    def __init__(self, w: float, h: float):
        self.w, self.h = w, h
        self.xy = (0.0, 0.0)


def _grandalf(sizes, edges) -> Layout:
    from grandalf.graphs import Edge, Graph, Vertex
    from grandalf.layouts import SugiyamaLayout
    from grandalf.routing import EdgeViewer, route_with_lines

    vertices = [Vertex(i) for i in range(len(sizes))]
    for v, (w, h) in zip(vertices, sizes):
        v.view = _Box(w, h)
    graph_edges = []
    for a, b in edges:
        e = Edge(vertices[a], vertices[b])
        e.view = EdgeViewer()
        graph_edges.append(e)
    graph = Graph(vertices, graph_edges)
    offset = 0.0
    margin = 10.0
    height = 0.0
    # each connected component separately, side by side
    for component in graph.C:
        sug = SugiyamaLayout(component)
        sug.xspace, sug.yspace = 16, 26
        sug.route_edge = route_with_lines
        sug.init_all()
        sug.draw(3)
        left = min(v.view.xy[0] - v.view.w / 2 for v in component.sV)
        top = min(v.view.xy[1] - v.view.h / 2 for v in component.sV)
        right = max(v.view.xy[0] + v.view.w / 2 for v in component.sV)
        bottom = max(v.view.xy[1] + v.view.h / 2 for v in component.sV)
        dx, dy = offset + margin - left, margin - top
        for v in component.sV:
            v.view.xy = (v.view.xy[0] + dx, v.view.xy[1] + dy)
        for e in component.sE:
            e.view._pts = [(x + dx, y + dy) for x, y in getattr(e.view, "_pts", [])]
        offset += right - left + margin
        height = max(height, bottom - top + 2 * margin)
    centres = [v.view.xy for v in vertices]
    paths = []
    for e, (a, b) in zip(graph_edges, edges):
        pts = getattr(e.view, "_pts", None) or [centres[a], centres[b]]
        paths.append(("line", [c for p in pts for c in p]))
    return Layout([(float(x), float(y)) for x, y in centres], paths, offset + margin, height, "grandalf")
