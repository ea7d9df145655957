"""``reproarchive diff`` (issue 15): same bug or not, what changed, from the indexes alone."""

from __future__ import annotations

import json

import torch
import torch.fx as fx

import reproarchive
from support.cli import invoke
from support.graphs import pack_chain


def _pack(path, x, *, dtype=torch.float32, failure=None, backend="inductor"):
    g = fx.Graph()
    a = g.placeholder("x")
    g.output((g.call_function(torch.ops.aten.relu.default, (g.call_function(torch.ops.aten.sin.default, (a,)),)),))
    return reproarchive.pack(fx.GraphModule(torch.nn.Module(), g), [x.to(dtype)], path, backend=backend,
                             failure=failure)


FAILURE = {"stage": "compile", "exception_type": "RuntimeError", "message": "bad relu", "traceback": "",
           "signature": "compile|RuntimeError|bad relu", "backend": "inductor"}


def test_identical_archives_exit_0(tmp_path):
    a = _pack(tmp_path / "a.tar.zst", torch.ones(4, 4), failure=FAILURE)
    b = _pack(tmp_path / "b.tar.zst", torch.ones(4, 4), failure=FAILURE)
    result = invoke("diff", a, b, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["identical"] and report["differing"] == []


def test_same_bug_other_data_is_same_signature_and_different_inputs(tmp_path):
    """Two captures of one bug on different days: same signature and graph, other data."""
    a = _pack(tmp_path / "monday.tar.zst", torch.randn(4, 4), failure=FAILURE)
    b = _pack(tmp_path / "tuesday.tar.zst", torch.randn(4, 4), failure=FAILURE)
    result = invoke("diff", a, b, "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["failure"]["same"] and report["graph"]["same"]
    assert report["differing"] == ["inputs"]
    text = invoke("diff", a, b).stdout
    assert "same metadata, different data" in text and "(exit 1)" in text


def test_dtype_graph_and_failure_differences_are_named(tmp_path):
    a = _pack(tmp_path / "a.tar.zst", torch.ones(4, 4), failure=FAILURE)
    b = _pack(tmp_path / "b.tar.zst", torch.ones(4, 4), dtype=torch.float64,
              failure=dict(FAILURE, message="other", signature="compile|RuntimeError|other"))
    c = pack_chain(tmp_path / "c.tar.zst", 30)
    report = reproarchive.diff(a, b).to_plain()
    assert set(report["differing"]) >= {"failure", "inputs"} and not report["failure"]["same"]
    assert "dtype" in json.dumps(report["inputs"])
    report = reproarchive.diff(a, c).to_plain()
    assert not report["graph"]["same"]


def test_diff_reads_no_blob(tmp_path):
    """Blobs are compared by digest: a blob damaged in the middle of its frame does not stop
    diff (verify names it), so diff never decompressed it."""
    from reproarchive.format.reader import ContainerReader

    a = _pack(tmp_path / "a.tar.zst", torch.randn(64, 64))
    with ContainerReader(a) as reader:
        blob = next(m for name, m in reader.members.items() if name.startswith("blobs/"))
        offset, length = blob.offset, blob.compressed
    raw = bytearray(a.read_bytes())
    raw[offset + length // 2] ^= 0xFF
    damaged = tmp_path / "damaged.tar.zst"
    damaged.write_bytes(bytes(raw))
    assert invoke("verify", "-q", damaged).exit_code == 2
    result = invoke("diff", a, damaged, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["identical"]


def test_not_an_archive_is_exit_2_with_json(tmp_path):
    a = _pack(tmp_path / "a.tar.zst", torch.ones(4, 4))
    junk = tmp_path / "junk.tar.zst"
    junk.write_bytes(b"not an archive")
    result = invoke("diff", a, junk)
    assert result.exit_code == 2 and result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    result = invoke("diff", a, junk, "--json")
    assert result.exit_code == 2 and json.loads(result.stdout)["exit_code"] == 2
