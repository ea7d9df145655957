"""A compiled function over a nested jagged tensor (format 1.3 ``size`` values): Dynamo passes the
tensor's ragged size, a nested int (``j1``), as a graph input of its own. It is stored as "the size
of input k at dimension d" and computed from the rebuilt tensor on load, so a replay, an
exported script and a minified archive all get the tensor's own nested int."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch
import torch._dynamo
import torch.fx as fx

import reproarchive
from reproarchive.errors import IndexSchemaError, PackError
from reproarchive.format.schema import DerivedValue, SubclassValue, SymValue
from reproarchive.minifier.candidate import Recording
from spec.vectors import make_vectors
from support.cli import invoke
from support.hostile_corpus import parse, rebuild


def _njt() -> torch.Tensor:
    return torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(3, 4)], layout=torch.jagged)


def _capture(path, fn, backend="relu_compile_error_TESTING_ONLY", **compile_options):
    torch._dynamo.reset()
    captured = reproarchive.capture(backend, path=path)
    with pytest.raises(Exception, match="archive written to"):
        torch.compile(fn, backend=captured, **compile_options)(_njt())
    torch._dynamo.reset()
    return path


def _relu_twice(t):
    return torch.relu(t) * 2


def _view_sin_relu(t):
    return torch.relu(t.view(t.size(0), t.size(1), t.size(2)).sin()) * 2


def test_a_compiled_function_of_a_nested_jagged_tensor_is_captured_and_reproduces(tmp_path):
    path = _capture(tmp_path / "njt.tar.zst", _relu_twice)
    assert reproarchive.verify(path).valid
    repro = reproarchive.load(path)
    derived, njt = repro.index.inputs
    assert isinstance(derived, DerivedValue) and (derived.kind, derived.input, derived.dim) == ("size", 1, 1)
    assert isinstance(njt, SubclassValue) and derived.expr and derived.expr.startswith("s")  # Dynamo's symbol
    size, t = repro.args
    assert type(t).__name__ == "NestedTensor" and torch.equal(t.offsets(), torch.tensor([0, 2, 5]))
    assert isinstance(size, torch.SymInt) and size.node.is_nested_int() and size == t.size(1)
    alone = reproarchive._internal.read_input(path, 0)  # the input it is the size of is read with it
    assert isinstance(alone, torch.SymInt) and alone.node.is_nested_int()
    row = reproarchive.inspect(path).inputs[0]
    assert (row.kind, row.fidelity, row.value) == ("size", "derived", "of input 1, dim 1")
    outcome = reproarchive.run(path, isolate=False)
    assert (outcome.status, outcome.exit_code) == ("reproduced", 1), outcome.to_dict()
    shown = invoke("inspect", path)
    assert shown.exit_code == 0 and "size of input 1, dim 1" in shown.stdout
    assert invoke("diff", path, path).exit_code == 0


def test_with_dynamic_shapes_plain_sizes_stay_symints_and_the_ragged_size_is_derived(tmp_path):
    path = _capture(tmp_path / "dyn.tar.zst", _relu_twice, dynamic=True)
    repro = reproarchive.load(path)
    kinds = [type(v).__name__ for v in repro.index.inputs]
    assert kinds == ["SymValue", "DerivedValue", "SymValue", "SubclassValue"], kinds
    assert [repro.index.inputs[i].hint for i in (0, 2)] == [2, 4]  # batch and feature sizes: plain ints
    assert isinstance(repro.index.inputs[0], SymValue) and repro.args[1] == repro.args[3].size(1)
    shapes = repro.records.shapes
    assert shapes is not None and [r.kind for r in shapes.inputs] == ["symint", "symint", "symint", "tensor"]
    outcome = reproarchive.run(path, isolate=False)
    assert (outcome.status, outcome.exit_code) == ("reproduced", 1), outcome.to_dict()
    assert outcome.to_dict()["shapes"]["policy"] == "recorded"


def test_a_runtime_failure_after_a_view_by_the_ragged_size_minifies_to_the_relu_of_the_nested_value(tmp_path):
    """The relu's input, a nested jagged tensor computed inside the graph, is cut as an input
    whose ragged dimension keeps the recorded symbol (``codec.inner_shapes``): the sin, the view
    and the size it read go (before, cut inputs were static, and the view stayed with the size
    beside its tensor; ``test_a_minifier_candidate_that_keeps_the_size_without_its_tensor_...``
    keeps that pairing rule)."""
    path = _capture(tmp_path / "view.tar.zst", _view_sin_relu, backend="relu_runtime_error_TESTING_ONLY")
    assert reproarchive.run(path, isolate=False).status == "reproduced"
    out = tmp_path / "min.tar.zst"
    reproarchive.minify_archive(path, out, isolate=False, max_time=60)
    assert reproarchive.verify(out).valid
    repro = reproarchive.load(out)
    assert [n.target for n in repro.gm.graph.nodes if n.op in ("call_function", "call_method")] == [torch.relu]
    (value,) = repro.index.inputs
    assert isinstance(value, SubclassValue) and value.size[1].startswith("j")  # still ragged
    (cut,) = repro.records.shapes.inputs
    assert cut.source is None and [d.kind for d in cut.dims] == ["static", "backed", "static"], cut
    outcome = reproarchive.run(out, isolate=False)
    assert (outcome.status, outcome.exit_code) == ("reproduced", 1), outcome.to_dict()


def _view_graph() -> fx.GraphModule:
    g = fx.Graph()
    size, t = g.placeholder("s0"), g.placeholder("t")
    view = g.call_method("view", (t, 2, size, 4))
    g.output((g.call_function(torch.relu, (view,)),))
    return fx.GraphModule(torch.nn.Module(), g)


def test_a_minifier_candidate_that_keeps_the_size_without_its_tensor_is_never_judged():
    t = _njt()
    rec = Recording(_view_graph(), [t.size(1), t])
    start = rec.start()
    assert rec.stores(start)
    size_only = dataclasses.replace(start, inputs=tuple(i for i in start.inputs if rec.nested.get(i)))
    assert len(size_only.inputs) == 1 and not rec.stores(size_only)


def test_a_nested_int_that_no_input_has_is_refused_at_pack(tmp_path):
    t = _njt()
    with pytest.raises(PackError, match="nested int"):
        reproarchive.pack(_view_graph(), [t.size(1), _njt()], tmp_path / "orphan.tar.zst", backend="eager")
    assert not (tmp_path / "orphan.tar.zst").exists()


@pytest.mark.slow
def test_the_exported_script_rebuilds_the_tensor_and_computes_its_size(tmp_path):
    path = _capture(tmp_path / "njt.tar.zst", _relu_twice)
    report = reproarchive.export(path, tmp_path / "out")
    script = (tmp_path / "out" / "repro.py").read_text()
    assert "_subclass('torch.nested._internal.nested_tensor.NestedTensor'" in script
    assert "None,  # the size of input 1 at dimension 1, computed below" in script  # never a literal j1
    assert "for i, kind, k, d in [(0, 'size', 1, 1)]:" in script
    done = subprocess.run([sys.executable, report.script], capture_output=True, text=True, timeout=300,
                          env={"OMP_NUM_THREADS": "1", "PATH": ""})
    assert done.returncode != 0 and "ReluCompileError" in done.stderr, done.stderr[-2000:]


def _with_input_7(valid: bytes, value: dict) -> bytes:
    def edit(index: dict) -> None:
        index["inputs"][7] = value
    return rebuild(parse(valid), edit)


def test_a_size_of_another_input_loads_as_its_size_and_hostile_ones_are_refused(tmp_path):
    valid = (make_vectors.HERE / f"basic-{make_vectors.VERSION}.tar.zst").read_bytes()
    good = tmp_path / "good.tar.zst"
    good.write_bytes(_with_input_7(valid, {"kind": "size", "input": 1, "dim": 0}))  # input 1 is (6, 4)
    assert reproarchive.verify(good).valid and reproarchive.load(good).args[7] == 6
    stride = tmp_path / "stride.tar.zst"
    stride.write_bytes(_with_input_7(valid, {"kind": "stride", "input": 1, "dim": 0}))  # a transposed view
    assert reproarchive.load(stride).args[7] == 1
    shown = invoke("diff", good, stride)  # the same input position, another derived value
    assert "size of input 1, dim 0" in shown.stdout and "stride of input 1, dim 0" in shown.stdout, shown.stdout
    for hostile in ({"kind": "size", "input": 1 << 40, "dim": 0}, {"kind": "size", "input": 10, "dim": 0},
                    {"kind": "stride", "input": 0, "dim": 64}, {"kind": "size", "input": "0", "dim": 0},
                    {"kind": "size", "input": 0}):
        bad = tmp_path / "bad.tar.zst"
        bad.write_bytes(_with_input_7(valid, hostile))
        with pytest.raises(IndexSchemaError, match=r"rule R6(\.3-10|-1)\)"):
            reproarchive.load(bad)
