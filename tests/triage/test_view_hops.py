"""``view`` draws higher-order operators as frames holding their subgraphs.

Each archive is a real captured failure inside an operator's subgraph (``support.hop_programs``:
``fail_on_relu`` raises on the ``relu`` there), captured once per module. The page must draw
``cond`` as its two branches, ``while_loop`` its condition and body, ``flex_attention`` its score
and mask mods, an operator inside another nested in it, highlight the ``relu`` inside, say which
operator ``with_effects``/``auto_functionalized`` call, and keep hostile text inert."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import torch._dynamo

import reproarchive
from reproarchive.triage import graph_hops
from support import browser, hop_programs
from support import hostile_corpus as hc
from support.real_graphs import Block

ROLES = {"cond": ["true branch", "false branch"], "while_loop": ["condition", "body"], "map": ["body (per slice)"],
         "checkpoint": ["checkpointed region"], "invoke_subgraph": ["subgraph"],
         "flex_attention": ["score_mod", "mask_mod"], "nested": ["checkpointed region"], "wrap": ["wrapped region"]}
CALLS = {"auto_functionalized": "rafx.bump", "with_effects": "rafx.tick"}
PROGRAMS = [*hop_programs.PROGRAMS, hop_programs.NESTED]
IDS = [f"{level}-{name}" for name, _, level in PROGRAMS]
EVIL = "</script><img src=x onerror=alert(1)>"


@pytest.fixture(scope="module")
def archives(tmp_path_factory) -> dict[str, Path]:
    """One captured archive per program (about a quarter second each)."""
    root = tmp_path_factory.mktemp("hops")
    out = {}
    for name, fn, level in PROGRAMS:
        out[f"{level}-{name}"] = root / f"{level}-{name}.tar.zst"
        hop_programs.capture(fn, level, out[f"{level}-{name}"])
    return out


def _report(html: str) -> dict:
    payload = re.search(r'<script id="report" type="application/json">(.*?)</script>', html, re.S).group(1)
    return json.loads(payload)


def _frames(graph: dict) -> list[str]:
    return [f[0] for page in graph["pages"] for f in page["hops"] if f[0]]


@pytest.mark.parametrize("name,fn,level", PROGRAMS, ids=IDS)
def test_each_operator_is_drawn_with_its_subgraphs_and_the_failing_node_inside(archives, tmp_path, name, fn, level):
    out = reproarchive.view(archives[f"{level}-{name}"], tmp_path / "page.html")
    graph = _report((tmp_path / "page.html").read_text())["graphs"][0]
    hops = out["subgraphs"]
    assert hops, out
    if name in CALLS:  # the operator passed as a value is named in the node's box
        assert hops[0]["calls"].startswith(f"torch.ops.{CALLS[name]}") and hops[0]["subgraphs"] == []
        assert any(n["l"].endswith(": " + CALLS[name]) for n in graph["nodes"])
        return
    assert [s["role"] for s in hops[0]["subgraphs"]] == ROLES[name]
    op = hops[0]["operator"]
    assert {f"{op}: {role}" for role in ROLES[name]} <= set(_frames(graph))
    # the relu the compiler failed on is highlighted where it is: inside a subgraph, in a page's nodes
    failing = [n for n in graph["nodes"] if n["f"] & 1]
    assert failing and all("relu" in n["t"] and n["s"] for n in failing), failing
    assert any(s["highlighted"] for s in hops[0]["subgraphs"])
    drawn = {i for page in graph["pages"] for i in page["nodes"]}
    assert all(graph["nodes"].index(n) in drawn for n in failing)
    header = next(n for n in graph["nodes"] if n["n"] == hops[0]["node"])
    assert header["f"] & graph_hops.FLAG_INSIDE and header["k"] == "hop"
    # each subgraph input says what it receives, and one bound to an operand links to it
    inputs = [n for n in graph["nodes"] if n.get("s") and n["o"] == "placeholder"]
    assert inputs and all(n["v"].startswith("← ") for n in inputs), inputs
    if name != "flex_attention":
        assert all(n["i"] for n in inputs), inputs


def test_a_nested_operator_is_drawn_inside_the_frame_of_the_one_that_runs_it(archives, tmp_path):
    out = reproarchive.view(archives["dynamo-nested"], tmp_path / "nested.html")
    region = out["subgraphs"][0]["subgraphs"][0]
    assert out["subgraphs"][0]["operator"] == "tag_activation_checkpoint"
    assert [h["operator"] for h in region["hops"]] == ["cond"]
    assert [s["highlighted"] for s in region["hops"][0]["subgraphs"]] == [True, False]
    graph = _report((tmp_path / "nested.html").read_text())["graphs"][0]
    frames = {f[0]: f for page in graph["pages"] for f in page["hops"]}
    outer, inner = frames["tag_activation_checkpoint: checkpointed region"], frames["cond: true branch"]
    assert inner[5] > outer[5]  # deeper
    assert outer[1] <= inner[1] and inner[3] <= outer[3] and outer[2] <= inner[2] and inner[4] <= outer[4]
    relu = next(n for n in graph["nodes"] if n["f"] & 1)
    assert relu["s"] == "tag_activation_checkpoint: checkpointed region › cond: true branch"


def test_invoke_subgraph_draws_a_shared_subgraph_once(archives, tmp_path):
    out = reproarchive.view(archives["dynamo-invoke_subgraph"], tmp_path / "inv.html")
    assert [h["subgraphs"][0]["drawn"] for h in out["subgraphs"]] == ["inline", "same as invoke_subgraph: subgraph"]
    graph = _report((tmp_path / "inv.html").read_text())["graphs"][0]
    assert sum(1 for n in graph["nodes"] if n["t"] == "torch.relu") == 1


def test_a_large_subgraph_is_drawn_as_a_graph_of_its_own(archives, tmp_path, monkeypatch):
    monkeypatch.setattr(graph_hops, "INLINE_NODES", 3)  # the true branch (4 nodes) is "large"
    out = reproarchive.view(archives["dynamo-cond"], tmp_path / "big.html")
    assert [s["drawn"] for s in out["subgraphs"][0]["subgraphs"]] == ["own graph graph-sub1", "inline"]
    graphs = _report((tmp_path / "big.html").read_text())["graphs"]
    assert [g["key"] for g in graphs] == ["graph", "graph-sub1"]
    assert graphs[1]["heading"].startswith("Subgraph cond: true branch") and graphs[1]["highlighted"] == 1
    box = next(n for n in graphs[0]["nodes"] if n["k"] == "subgraph")
    cond = next(n for n in graphs[0]["nodes"] if n["n"] == "cond")
    assert box["f"] & graph_hops.FLAG_INSIDE and cond["f"] & graph_hops.FLAG_INSIDE  # the failure is in there
    assert graphs[0]["folded"] == 0  # the branches are drawn, not counted as weights

    out = reproarchive.view(archives["dynamo-invoke_subgraph"], tmp_path / "inv.html")  # one subgraph, two calls
    assert [h["subgraphs"][0]["drawn"] for h in out["subgraphs"]] == \
        ["own graph graph-sub1", "same as invoke_subgraph: subgraph"]
    assert len(_report((tmp_path / "inv.html").read_text())["graphs"]) == 2


def test_beside_its_minified_child_the_page_shows_what_it_kept_inside_the_branch(archives, tmp_path):
    """The minifier cut inside the true branch down to its ``relu``; the child's page draws the
    parent with that ``relu`` highlighted inside its frame (kept, not named by the failure)."""
    parent = tmp_path / "cond.tar.zst"
    parent.write_bytes(archives["dynamo-cond"].read_bytes())
    report = reproarchive.minify_archive(parent, tmp_path / "cond-min.tar.zst", backend=hop_programs.BACKEND)
    out = reproarchive.view(report.output, tmp_path / "child.html")
    assert out["parent"] == str(parent) and out["subgraphs"] == []  # the child has no operator left
    before = _report((tmp_path / "child.html").read_text())["graphs"][1]
    assert before["key"] == "parent"
    kept = [(n["n"], n["s"]) for n in before["nodes"] if n["f"] & 1]
    assert kept == [("relu", "cond: true branch")]


class Checkpointed(torch.nn.Module):
    def __init__(self, layers: int = 12):
        super().__init__()
        self.layers = torch.nn.ModuleList([Block() for _ in range(layers)])

    def forward(self, x):
        for layer in self.layers:
            x = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False)
        return torch.relu(x)


def test_a_model_of_checkpointed_layers_is_paged_by_what_its_frames_hold(tmp_path):
    """12 transformer blocks, each a checkpointed region of 37 nodes: the frames' nodes count
    towards a page, so the page is cut between layers, and the weights folded inside the frames."""
    path = tmp_path / "ckpt.tar.zst"
    torch._dynamo.reset()
    with pytest.raises(Exception, match="planted compile error"):
        torch.compile(Checkpointed().eval(), backend=reproarchive.capture(hop_programs.fail_on_relu, path=path),
                      fullgraph=True)(torch.randn(2, 8, 16))
    torch._dynamo.reset()
    out = reproarchive.view(path, tmp_path / "ckpt.html")
    assert [h["operator"] for h in out["subgraphs"]] == ["tag_activation_checkpoint"] * 12
    graph = _report((tmp_path / "ckpt.html").read_text())["graphs"][0]
    assert out["pages"] > 1
    drawn = [i for page in graph["pages"] for i in page["nodes"]]  # every node once, but the folded weights
    assert sorted(drawn) == [i for i, n in enumerate(graph["nodes"]) if n["into"] < 0]
    assert max(len(page["nodes"]) for page in graph["pages"]) <= 400
    norms = [n for n in graph["nodes"] if n.get("s") and n["t"] == "torch.nn.functional.layer_norm"]
    assert len(norms) == 24 and all(n["ws"] == "+ weight, bias" for n in norms), norms[:2]


def _hostile(archive: Path, path: Path) -> Path:
    """The cond archive with hostile text where an archive may put free text: a constant operand
    of the operator, a subgraph node's argument, a subgraph input's recorded dtype."""
    def edit(index):
        for n in index["graph"]["nodes"]:
            if n["name"] == "cond":
                n["args"][3]["v"].append(EVIL)
        for entry in index["graph"]["module_state"]:
            for n in entry.get("graph", {}).get("nodes", []):
                if n["name"] == "mul":
                    n["args"][1] = EVIL
                if n["op"] == "placeholder":
                    n["meta"]["val"]["dtype"] = EVIL
    path.write_bytes(hc.rebuild(hc.parse(archive.read_bytes()), edit))
    return path


def test_hostile_text_in_a_subgraph_stays_inert(archives, tmp_path):
    evil = _hostile(archives["dynamo-cond"], tmp_path / "evil.tar.zst")
    reproarchive.view(evil, tmp_path / "evil.html")
    html = (tmp_path / "evil.html").read_text()
    assert EVIL not in html and "<img" not in html
    graph = _report(html)["graphs"][0]
    assert any(EVIL in n["c"] for n in graph["nodes"] if n.get("s"))  # shown, as text
    if browser.unavailable() is None:
        with browser.browser() as context:
            page, log = browser.open_page(context, tmp_path / "evil.html")
            dialogs = []
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.locator("svg.graph [data-node]").filter(has_text="mul").first.click()
            code = page.locator(".details pre.code-line").text_content()
            assert EVIL in code and page.locator("img").count() == 0 and not dialogs
        assert not log.errors, log.errors


def test_a_hostile_subgraph_name_is_refused_in_one_line_and_writes_no_page(archives, tmp_path):
    """A subgraph's path is an attribute name the format checks (spec R7.4-1): ``view`` of an
    archive whose ``cond`` branch is named with markup says so in one line and writes nothing."""
    from support.cli import invoke

    def edit(index):
        for n in index["graph"]["nodes"]:
            if n["op"] == "get_attr" and n["target"] == "cond_true_0":
                n["target"] = EVIL
        for entry in index["graph"]["module_state"]:
            if entry.get("path") == "cond_true_0":
                entry["path"] = EVIL
    evil = tmp_path / "evil-name.tar.zst"
    evil.write_bytes(hc.rebuild(hc.parse(archives["dynamo-cond"].read_bytes()), edit))
    result = invoke("view", evil, "-o", tmp_path / "evil-name.html", "--json")
    assert result.exit_code != 0 and not (tmp_path / "evil-name.html").exists()
    error = json.loads(result.stdout)["error"]
    assert "attribute path" in error["message"] and "\n" not in error["message"]


@pytest.mark.skipif(browser.unavailable() is not None, reason=str(browser.unavailable()))
def test_the_frames_and_the_failing_node_in_a_real_browser(archives, tmp_path):
    with browser.browser() as context:
        for key in ("dynamo-cond", "dynamo-flex_attention", "dynamo-nested", "aot-while_loop"):
            out = reproarchive.view(archives[key], tmp_path / f"{key}.html")
            page, log = browser.open_page(context, out["output"])
            labels = page.eval_on_selector_all("svg.graph .hop", "els => els.map(e => e.dataset.hop)")
            seen = page.evaluate("""() => {
              const hl = document.querySelector('svg.graph .node.hl').getBoundingClientRect();
              const inside = [...document.querySelectorAll('svg.graph .hop.hl rect')].filter(r => {
                const b = r.getBoundingClientRect();
                return b.left <= hl.left && hl.right <= b.right && b.top <= hl.top && hl.bottom <= b.bottom; });
              return {inside: inside.length, hl: document.querySelectorAll('svg.graph .node.hl').length,
                      dashed: document.querySelectorAll('svg.graph .edge.ext').length};
            }""")
            page.locator("svg.graph .node.hl").first.click()
            details = page.locator(".details").text_content()
            page.screenshot(path=str(tmp_path / f"{key}.png"))
            assert not log.errors, (key, log.errors)
            op = out["subgraphs"][0]["operator"]
            assert f"{op}: " in " ".join(labels), (key, labels)
            # the failing node sits inside its subgraph's frame and its operator's
            assert seen["hl"] == 1 and seen["inside"] >= 2 and seen["dashed"] >= 1, (key, seen)
            assert "inside: " in details and "relu" in details


def test_view_json_and_text_carry_the_operators(archives, tmp_path):
    from support.cli import invoke

    result = invoke("view", archives["aot-cond"], "-o", tmp_path / "cond.html", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [(h["operator"], [s["path"] for s in h["subgraphs"]]) for h in doc["subgraphs"]] == \
        [("cond", ["true_graph_0", "false_graph_0"])]
    text = invoke("view", archives["aot-cond"], "-o", tmp_path / "cond2.html")
    assert text.exit_code == 0 and "1 higher-order ops drawn with their subgraphs" in text.stdout


def _scan(x):
    from torch._higher_order_ops.scan import scan

    def combine(carry, t):
        new = carry + torch.relu(t)
        return new, new.clone()

    return scan(combine, torch.zeros(16), x)[1]


def test_an_operator_without_known_roles_still_shows_its_subgraphs(tmp_path):
    """``scan`` is not in the table of roles: its subgraph is still drawn, named by its path."""
    path = tmp_path / "scan.tar.zst"
    hop_programs.capture(_scan, "dynamo", path)
    out = reproarchive.view(path, tmp_path / "scan.html")
    (hop,) = out["subgraphs"]
    assert hop["operator"] == "scan" and [(s["role"], s["drawn"], s["highlighted"]) for s in hop["subgraphs"]] == \
        [("scan_combine_fn_0", "inline", True)]
    graph = _report((tmp_path / "scan.html").read_text())["graphs"][0]
    assert "scan: scan_combine_fn_0" in _frames(graph)
