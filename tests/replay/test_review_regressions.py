"""Bugs found in review, each pinned by the smallest test that would have caught it."""

from __future__ import annotations

import ast
import operator

import torch
import torch.fx as fx

import reproarchive
from reproarchive.context.config import safe_to_apply
from reproarchive.context.failure import signature
from reproarchive.format.schema import AccuracyOutput, AccuracyReport, FailureRecord


def test_signature_tells_dtypes_apart():
    a = signature("compile", "RuntimeError", "expected scalar type float16 but found float32")
    b = signature("compile", "RuntimeError", "expected scalar type float64 but found float32")
    assert a != b
    assert signature("compile", "E", "add_3 failed on buf12") == signature("compile", "E", "add_7 failed on buf3")


def test_backend_lists_in_config_are_applied():
    assert safe_to_apply("max_autotune_gemm_backends", "ATEN,CPP")
    assert not safe_to_apply("cpp.cxx", ["/bin/sh", "-c"])


def test_cuda_method_calls_follow_the_device_mapping():
    from reproarchive.codec.devices import remap_graph_devices

    g = fx.Graph()
    x = g.placeholder("x")
    g.output((g.call_method("cuda", (x,)),))
    gm = fx.GraphModule(torch.nn.Module(), g)
    assert remap_graph_devices(gm, {"cuda": "cpu"}) == 1
    node = [n for n in gm.graph.nodes if n.op == "call_method"][0]
    assert (node.target, node.args[1]) == ("to", "cpu")
    assert gm(torch.ones(2))[0].device.type == "cpu"


def test_pack_time_replay_generates_absent_inputs_like_load(tmp_path):
    """The failure recorded when packing a dump must be the one `run` sees later."""
    from reproarchive.sources.dump_child import _concrete

    g = fx.Graph()
    x, idx = g.placeholder("x"), g.placeholder("idx")
    g.output((g.call_function(operator.getitem, (x, idx)),))
    gm = fx.GraphModule(torch.nn.Module(), g)
    args = [torch.arange(20.0), reproarchive.AbsentTensor((3,), torch.int64)]
    path = reproarchive.pack(gm, args, tmp_path / "a.tar.zst")
    replayed, generated = _concrete(args)
    loaded = reproarchive.load(path).args
    assert generated == 1 and torch.equal(replayed[1], loaded[1])


def test_export_header_survives_backslashes_in_messages(tmp_path):
    from reproarchive.standalone.script import write_export

    g = fx.Graph()
    x = g.placeholder("x")
    g.output((g.call_function(torch.relu, (x,)),))
    gm = fx.GraphModule(torch.nn.Module(), g)
    failure = FailureRecord(stage="compile", exception_type="OSError", message=r"cannot open C:\Users\me\x.so",
                            backend="eager")
    report = write_export(gm, [torch.ones(2)], tmp_path / "out", backend="eager", failure=failure)
    ast.parse(open(report["script"]).read())


def test_run_report_prints_mismatches_without_error_figures():
    from reproarchive.cli.replay_cmds import format_outcome
    from reproarchive.replay.outcome import Outcome

    failure = FailureRecord(stage="accuracy")
    report = AccuracyReport(passed=False, tolerance=1e-3, outputs=(
        AccuracyOutput(name="output[0]", passed=False, rule="shape", reason="shape [2] vs [3]"),))
    outcome = Outcome(status="reproduced", exit_code=1, observed=failure, recorded=failure, accuracy=report)
    assert "shape [2] vs [3]" in format_outcome(outcome)
