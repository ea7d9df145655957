"""``reproarchive diff``: same bug or not, what changed, from the indexes alone."""

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


def _relu_graph(with_values: bool, relu_name: str = "relu") -> fx.GraphModule:
    """One graph, as an in-process capture records it (value summaries on every node) or as a
    dump import does (none)."""
    g = fx.Graph()
    x = g.placeholder("x")
    y = g.create_node("call_function", torch.relu, (g.call_function(torch.sin, (x,)),), name=relu_name)
    g.output((y,))
    gm = fx.GraphModule(torch.nn.Module(), g)
    if with_values:
        for node in gm.graph.nodes:
            node.meta["val"] = torch.empty(4, 4)
    return gm


def test_values_reproarchive_set_itself_are_no_differences(tmp_path):
    """One bug captured in-process and through ``capture --``: the capture's own dump folder and
    PyTorch's dump switches in the environment, the value summaries only the in-process graph
    has, and the graph kind (none recorded vs after_dynamo) are not differences."""
    failure = dict(FAILURE, message="bad relu_3", signature="compile|RuntimeError|bad relu<n>")
    env = {"TORCH_LOGS": "+dynamo"}
    inproc = reproarchive.pack(_relu_graph(True, "relu_3"), [torch.ones(4, 4)], tmp_path / "inproc.tar.zst",
                               backend="inductor", failure=failure, environment={"variables": env},
                               source={"kind": "capture"})
    capture_env = dict(env, TORCH_COMPILE_DEBUG_DIR="/tmp/reproarchive-capture-k2j1x",
                       TORCHDYNAMO_REPRO_AFTER="dynamo", TORCHDYNAMO_REPRO_LEVEL="2",
                       REPROARCHIVE_CRASH_DIR="/tmp/reproarchive-capture-k2j1x/crash")
    # the same bug, FX naming the node relu instead of relu_3
    dumped = reproarchive.pack(_relu_graph(False), [torch.ones(4, 4)], tmp_path / "dumped.tar.zst",
                               backend="inductor", failure=dict(failure, message="bad relu",
                                                                signature="compile|RuntimeError|bad relu"),
                               environment={"variables": capture_env}, source={"kind": "after_dynamo"})
    report = reproarchive.diff(inproc, dumped)
    assert report.identical, (report.differing, report.graph)
    assert report.failure["a"]["group"] == report.failure["b"]["group"]
    # a variable the user set is still a difference, and so is a debug folder that is not the capture's
    other = reproarchive.pack(_relu_graph(False, "relu_3"), [torch.ones(4, 4)], tmp_path / "other.tar.zst",
                              backend="inductor", failure=failure, source={"kind": "after_dynamo"},
                              environment={"variables": dict(env, TORCH_COMPILE_DEBUG_DIR="/scratch/dbg")})
    report = reproarchive.diff(inproc, other)
    assert report.differing == ("environment",)
    assert [r["name"] for r in report.environment["rows"]] == ["TORCH_COMPILE_DEBUG_DIR"]


def test_failures_in_the_same_words_but_other_groups_show_the_groups(tmp_path):
    """One message, two groups: A's message names a node of its graph (its ``relu``), B's graph
    has no such node. The text showed two identical failure lines under "DIFFERENT"."""
    def pack(path, last):
        g = fx.Graph()
        sin = g.create_node("call_function", torch.ops.aten.sin.default, (g.placeholder("x"),), name="sin")
        g.output((g.create_node("call_function", last, (sin,), name=last.__name__.split(".")[0]),))
        return reproarchive.pack(fx.GraphModule(torch.nn.Module(), g), [torch.ones(4)], path, backend="inductor",
                                 failure=FAILURE)

    a, b = pack(tmp_path / "a.tar.zst", torch.ops.aten.relu.default), pack(tmp_path / "b.tar.zst",
                                                                            torch.ops.aten.cos.default)
    text = invoke("diff", a, b).stdout
    assert "failure      DIFFERENT" in text and text.count("compile RuntimeError: bad relu") == 2, text
    assert "  group A  compile|RuntimeError|bad relu @" in text and "  group B  compile|RuntimeError|bad relu\n" in text
