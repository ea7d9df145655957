"""``view`` on a real model's graph: a 12-layer transformer as Dynamo hands it to a backend (426
nodes, 146 weight inputs). Before, the page opened on one row of 147 tiny input boxes with no
op in sight; now weights are folded into the ops that use them, ops are framed by the module
they were traced in, and the page opens readable, on the failing node when one is named."""

from __future__ import annotations

import pytest
import torch

import reproarchive
from reproarchive.triage import graph_folding
from support import browser
from support.real_graphs import Block


class Stack(torch.nn.Module):
    def __init__(self, layers: int = 12):
        super().__init__()
        self.layers = torch.nn.ModuleList([Block() for _ in range(layers)])
        self.head = torch.nn.Linear(16, 16)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


@pytest.fixture(scope="module")
def transformer(tmp_path_factory):
    """Captured in-process around PyTorch's relu compile-error injector (no inductor)."""
    import torch._dynamo

    path = tmp_path_factory.mktemp("model") / "t12.tar.zst"
    model = Stack().eval()
    torch._dynamo.reset()
    backend = reproarchive.capture("relu_compile_error_TESTING_ONLY", path=path)
    with pytest.raises(Exception, match="archive written to"):
        torch.compile(lambda x: torch.relu(model(x)), backend=backend)(torch.randn(2, 8, 16))
    torch._dynamo.reset()
    return path


def test_module_paths_are_recorded_and_weights_fold_into_their_ops(transformer, tmp_path):
    repro = reproarchive.load(transformer)
    index = repro.index
    modules = {n.meta.get("module") for n in index.graph.nodes if isinstance(n.meta, dict)}
    assert {f"layers.{k}.qkv" for k in range(12)} <= modules and "head" in modules
    placeholders = [n.name for n in index.graph.nodes if n.op == "placeholder"]
    weights = [p for p in placeholders if graph_folding.state_path(p)]
    assert len(placeholders) == 147 and len(weights) == 146

    out = reproarchive.view(transformer, tmp_path / "t12.html")
    html = (tmp_path / "t12.html").read_text()
    assert out["nodes"] == 426
    assert '"folded":146' in html
    # (format 1.7) each op knows the model line it came from; the 12 layers share their stacks
    ops = [n for n in index.graph.nodes if n.op == "call_function"]
    assert all(n.stack is not None for n in ops) and 0 < len(index.graph.stacks) < len(ops) / 6
    assert '"src":"./tests/support/real_graphs.py:' in html


@pytest.mark.skipif(browser.unavailable() is not None, reason=str(browser.unavailable()))
def test_the_page_opens_on_ops_framed_by_module_and_on_the_failing_node(transformer, tmp_path):
    repro = reproarchive.load(transformer)
    named = tmp_path / "named.tar.zst"  # the same graph, failing with an error that names its last op
    reproarchive.pack(repro.gm, repro.args, named, backend="inductor",
                      failure={"stage": "compile", "exception_type": "LoweringException",
                               "message": "LoweringException: boom\n  target: relu", "signature": "x"})
    for archive in (transformer, named):
        out = reproarchive.view(archive, tmp_path / f"{archive.stem}.html")
        with browser.browser() as context:
            page, log = browser.open_page(context, out["output"])
            page.locator("svg.graph").first.scroll_into_view_if_needed()
            drawn = page.evaluate("""() => {
              const canvas = document.querySelector('.canvas').getBoundingClientRect();
              const seen = {inputs: 0, ops: 0, widths: [], hl: 0};
              for (const n of document.querySelectorAll('svg.graph .node')) {
                const r = n.getBoundingClientRect();
                if (r.bottom < canvas.top || r.top > canvas.bottom) continue;
                if (r.right < canvas.left || r.left > canvas.right) continue;
                if (n.querySelector('rect').getAttribute('rx') > 10) seen.inputs++;
                else { seen.ops++; seen.widths.push(r.width); }
                if (n.classList.contains('hl')) seen.hl++;
              }
              return seen;
            }""")
            modules = page.eval_on_selector_all("svg.graph [data-module]", "els => els.map(e => e.dataset.module)")
            if archive == named:  # the failing node's details name the model line it came from (format 1.7)
                page.locator("svg.graph .node.hl").first.click()
                details = page.locator(".details").text_content()
            page.screenshot(path=str(tmp_path / f"{archive.stem}.png"))
        assert not log.errors, log.errors
        assert page_count(out) == 1
        assert drawn["inputs"] <= 2  # the activation, not 146 weights
        assert drawn["ops"] >= 8 and min(drawn["widths"]) >= 40, (archive.name, drawn)  # ops in sight, readable
        assert {f"layers.{k}" for k in range(12)} <= set(modules)
        if archive == named:
            assert drawn["hl"] == 1  # opened where the error points, at the bottom of a tall graph
            assert "source: ./tests/triage/test_view_models.py:" in details and "torch.relu(model(x))" in details


def page_count(out: dict) -> int:
    return out["pages"]
