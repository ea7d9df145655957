"""Data is never passed off as real after minify (issue 18 item 2): an input a minified archive
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
    rows = reproarchive.inspect(path)["inputs"]
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
