"""Data is never passed off as real after minify: an input a minified archive
labels as not the original data says so on every later read, and a second minify keeps the label."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.fx as fx

import reproarchive
from reproarchive.minifier.driver import _labelled


def _minified_archive(path):
    g = fx.Graph()
    y, z = g.placeholder("y"), g.placeholder("z")
    g.output((g.call_function(torch.relu, (g.call_function(torch.add, (y, z)),)),))
    provenance = [
        {"origin": "node:h", "depends_on": [0], "values": "recorded", "from_absent": True, "real": False},
        {"origin": "input:1", "depends_on": [1], "values": "recorded", "from_absent": False, "real": True},
    ]
    return reproarchive.pack(fx.GraphModule(torch.nn.Module(), g), [torch.ones(2, 2), torch.ones(2, 2)], path,
                             backend="eager", minify={"inputs": provenance, "input_origins": ["node:h", "input:1"]})


def test_load_and_inspect_say_an_input_is_not_the_original_data(tmp_path):
    path = _minified_archive(tmp_path / "min.tar.zst")
    with pytest.warns(UserWarning, match=r"1 input\(s\) of this minified archive are not the original data: y "
                                         r"\(computed from generated data\)"):
        repro = reproarchive.load(path)
    assert any("not the original data" in w for w in repro.warnings)
    rows = reproarchive.inspect(path).to_plain()["inputs"]
    assert rows[0]["fidelity"] == "not original: computed from generated data"
    assert rows[1]["fidelity"] == "real"


def test_a_second_minify_keeps_generated_values_generated(tmp_path):
    """Minifying a minified archive: a value computed from the parent's not-real input is
    labelled from_absent and not real, though its bytes are stored as a real storage."""
    path = _minified_archive(tmp_path / "min.tar.zst")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        repro = reproarchive.load(path)
    stats = {"inputs": [{"origin": "node:add", "depends_on": [0, 1], "values": "recorded"},
                        {"origin": "input:1", "depends_on": [1], "values": "recorded"}]}
    labelled = _labelled(stats, repro)["inputs"]
    assert labelled[0]["from_absent"] is True and labelled[0]["real"] is False
    assert labelled[1]["from_absent"] is False and labelled[1]["real"] is True


def test_minify_of_mixed_real_and_absent_inputs_keeps_generated_values_labelled(tmp_path):
    """Through the real minifier and CLI: an archive with one real and one absent input, whose
    failing op (relu, PyTorch's compile-error injector) sees a value computed from both. The
    minimized archive's input is that value: its bytes are stored, but it is labelled as
    computed from generated data, and load, inspect and run say so; minifying it again keeps
    the label."""
    from click.testing import CliRunner

    from reproarchive.cli import main

    g = fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    mixed = g.call_function(torch.add, (g.call_function(torch.sin, (a,)), g.call_function(torch.cos, (b,))))
    g.output((g.call_function(torch.relu, (mixed,)), g.call_function(torch.mul, (a, 2))))
    gm = fx.GraphModule(torch.nn.Module(), g)
    failure = {"stage": "compile", "exception_type": "torch._dynamo.backends.debugging.ReluCompileError",
               "message": "", "signature": "compile|torch._dynamo.backends.debugging.ReluCompileError|"}
    archive = reproarchive.pack(gm, [torch.randn(4), reproarchive.AbsentTensor((4,), torch.float32)],
                                tmp_path / "mixed.tar.zst", backend="relu_compile_error_TESTING_ONLY",
                                failure=failure, snapshot=False)
    assert reproarchive.run(archive).status == "reproduced"

    result = CliRunner().invoke(main, ["minify", str(archive), "--summary", str(tmp_path / "bug.md")])
    assert result.exit_code == 0, result.output
    assert "inputs that are not the original data:" in result.output
    # the bug report says it as the terminal does: its graph's input is no data of the failing run
    report = (tmp_path / "bug.md").read_text()
    assert "- inputs that are not the original data:" in report
    assert "computed from generated data (the original archive had none)" in report
    minified = tmp_path / "mixed.min.tar.zst"
    with pytest.warns(UserWarning, match="not the original data"):
        repro = reproarchive.load(minified)
    assert "torch.relu" in repro.gm.code and "torch.sin" not in repro.gm.code
    (entry,) = repro.index.records.minify.inputs
    assert entry.from_absent and not entry.real
    assert reproarchive.inspect(minified).inputs[0].fidelity.startswith("not original")
    outcome = reproarchive.run(minified)
    assert outcome.status == "reproduced" and any("not the original data" in w for w in outcome.warnings)

    again = CliRunner().invoke(main, ["minify", str(minified), "-o", str(tmp_path / "again.tar.zst")])
    assert again.exit_code == 0, again.output
    with pytest.warns(UserWarning, match="not the original data"):
        twice = reproarchive.load(tmp_path / "again.tar.zst")
    assert all(not e.real for e in twice.index.records.minify.inputs)
