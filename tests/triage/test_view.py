"""``reproarchive view`` and ``inspect --graph``: one self-contained page per archive,
checked in a real headless Chromium when one is installed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import reproarchive
from support import browser
from support.cli import invoke
from support.graphs import pack_chain

FAILURE = {"stage": "compile", "exception_type": "RuntimeError", "message": "bad relu <script>alert(1)</script>",
           "traceback": "", "signature": "compile|RuntimeError|bad relu", "backend": "inductor"}


def _self_contained(html: str) -> None:
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html), "the page must not load anything"
    assert "<script>alert(1)</script>" not in html  # archive strings are inert JSON


def test_view_writes_one_self_contained_page(tmp_path):
    archive = pack_chain(tmp_path / "small.tar.zst", 40, failure=FAILURE)
    result = invoke("view", archive, "-o", tmp_path / "small.html", "--json")
    assert result.exit_code == 0, result.output
    html = (tmp_path / "small.html").read_text()
    _self_contained(html)
    assert "__REPORT_JSON__" not in html and "bad relu" in html


def test_inspect_graph_prints_the_readable_code(tmp_path):
    archive = pack_chain(tmp_path / "g.tar.zst", 12)
    result = invoke("inspect", "--graph", archive)
    assert result.exit_code == 0 and "def forward" in result.stdout


def test_view_of_a_missing_archive_is_one_line(tmp_path):
    result = invoke("view", tmp_path / "nope.tar.zst")
    assert result.exit_code in (2, 4) and result.stderr.startswith("error: ") and result.stderr.count("\n") == 1


@pytest.mark.skipif(browser.unavailable() is not None, reason=str(browser.unavailable()))
@pytest.mark.parametrize("nodes", [40, 1200])
def test_page_in_a_real_browser(tmp_path, nodes):
    """The page of a graph (and of a 1,200-node one, which is paged) in headless Chromium: no
    console error, no network request, the graph drawn with the archive's node count, and a
    screenshot written."""
    archive = pack_chain(tmp_path / f"g{nodes}.tar.zst", nodes, failure=FAILURE)
    out = reproarchive.view(archive, tmp_path / f"g{nodes}.html")
    assert out["nodes"] == len(reproarchive.load(archive).gm.graph.nodes)
    with browser.browser() as context:
        page, log = browser.open_page(context, out["output"])
        svg = page.locator("svg.graph").first
        assert int(svg.get_attribute("data-total-nodes")) == out["nodes"]
        drawn = page.locator("svg.graph [data-node]").count()
        assert 0 < drawn <= out["nodes"] + 64  # one page of nodes (and ghosts of other pages)
        if nodes > 1000:
            assert int(svg.get_attribute("data-pages")) > 1
        shot = tmp_path / f"g{nodes}.png"
        page.screenshot(path=str(shot), full_page=False)
        assert shot.stat().st_size > 5000
    assert not log.errors, log.errors
    assert all(u.startswith(("file://", "data:", "blob:")) for u in log.requests), log.requests


def test_view_shows_before_and_after_for_a_minified_archive(tmp_path):
    """A minified archive next to its parent: the page holds both graphs."""
    g = pack_chain(tmp_path / "parent.tar.zst", 30)
    repro = reproarchive.load(g)
    relus = [n for n in repro.gm.graph.nodes if n.target is torch.ops.aten.relu.default]
    assert relus
    gm, inputs = reproarchive.minify(repro.gm, repro.args,
                                     lambda gm,
                                     xs: any(n.target is torch.ops.aten.relu.default for n in gm.graph.nodes))
    child = reproarchive.pack(gm, inputs, tmp_path / "child.tar.zst", backend="inductor", parent=repro.digest)
    out = reproarchive.view(child, tmp_path / "child.html")
    assert out["parent"] is not None and out["parent"].endswith("parent.tar.zst")
    html = (tmp_path / "child.html").read_text()
    assert "before: parent.tar.zst" in html


def test_view_and_inspect_show_the_shape_policy_and_its_guards(tmp_path):
    vector = Path(__file__).resolve().parents[2] / "spec" / "vectors" / "dynamic-1.3.tar.zst"
    out = reproarchive.view(vector, tmp_path / "dynamic.html")
    html = (tmp_path / "dynamic.html").read_text()
    assert "shape policy and guards" in html
    assert "s77=8 [2, 64] mark_dynamic" in html and "unbacked symbols: u0 [0, 192]" in html
    assert "guard: 2 \\u003c= L['x'].size()[0] and L['x'].size()[0] \\u003c= 64" in html  # inert JSON: < escaped
    assert out["nodes"] == 10
    text = invoke("inspect", vector).stdout
    assert "shape policy:" in text and "input 2 dim 0 L['y'].size()[0]: s17=8 [2, inf] automatic" in text
    assert reproarchive.inspect(vector).to_plain()["shapes"]["guards"][0].startswith("2 <= L['x']")
