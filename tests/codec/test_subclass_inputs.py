"""Tensor subclasses as data (format 1.3 ``subclass`` values): a traceable subclass is recorded
through its flatten protocol -- inner tensors as ordinary tensor records, context as plain data,
class by name -- and rebuilt at load only when it is a class torch itself defines (a fixed
table, never an import of a name the archive gives)."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch.testing._internal.two_tensor import TwoTensor

import reproarchive
from reproarchive.errors import NotReplayableHereError
from support.cli import invoke


def _graph() -> torch.fx.GraphModule:
    g = torch.fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    g.output((g.call_function(torch.relu, (a,)), g.call_method("sin", (b,))))
    return torch.fx.GraphModule(torch.nn.Module(), g)


def test_two_tensor_and_nested_jagged_tensor_round_trip_with_their_structure(tmp_path):
    two = TwoTensor(torch.randn(2, 3), torch.randn(2, 3))
    njt = torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(3, 4)], layout=torch.jagged)
    path = reproarchive.pack(_graph(), [two, njt], tmp_path / "sub.tar.zst", backend="eager")
    assert reproarchive.verify(path).valid
    rows = reproarchive.inspect(path).inputs
    assert [r.kind for r in rows] == ["subclass", "subclass"] and rows[1].value.startswith("NestedTensor[2, j")
    x, y = reproarchive.load(path).args
    assert type(x) is TwoTensor and torch.equal(x.a, two.a) and torch.equal(x.b, two.b)
    assert type(y) is type(njt) and y._ragged_idx == njt._ragged_idx
    assert torch.equal(y.offsets(), njt.offsets()) and torch.equal(y.values(), njt.values())
    outcome = reproarchive.run(path, isolate=False)
    assert (outcome.status, outcome.exit_code) == ("passed", 0), outcome.to_dict()
    assert invoke("diff", path, path).exit_code == 0


def test_a_compiled_function_of_a_two_tensor_is_captured_and_reproduces(tmp_path):
    path = tmp_path / "two.tar.zst"
    torch._dynamo.reset()
    backend = reproarchive.capture("relu_compile_error_TESTING_ONLY", path=path)
    with pytest.raises(Exception, match="archive written to"):
        torch.compile(lambda t: torch.relu(t) * 2, backend=backend)(TwoTensor(torch.randn(4), torch.randn(4)))
    torch._dynamo.reset()
    (arg,) = reproarchive.load(path).args
    assert type(arg) is TwoTensor
    outcome = reproarchive.run(path, isolate=False)
    assert (outcome.status, outcome.exit_code) == ("reproduced", 1), outcome.to_dict()


class OutsideTorch(TwoTensor):
    """A traceable subclass torch does not define: recorded, never rebuilt."""


def test_a_subclass_torch_does_not_define_is_recorded_but_not_rebuilt(tmp_path):
    sub = OutsideTorch(torch.randn(3), torch.randn(3))
    path = reproarchive.pack(_graph(), [sub, torch.randn(2)], tmp_path / "outside.tar.zst", backend="eager")
    assert reproarchive.verify(path).valid  # verify and inspect run nothing
    assert "OutsideTorch" in reproarchive.inspect(path).inputs[0].value
    with pytest.raises(NotReplayableHereError, match="test_subclass_inputs.OutsideTorch"):
        reproarchive.load(path)
    result = invoke("run", path)
    assert result.exit_code == 125 and result.stderr.count("\n") == 1
