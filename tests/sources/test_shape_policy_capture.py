"""The capture backend records the dynamic-shape policy of the failing compile (spec §8 ``shapes``)."""

from __future__ import annotations

import pytest
import torch

import reproarchive
from support.symbolic_backends import FREE_SYMBOLS, UNBACKED, nonzero_view, two_sums

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def captured(path, fn, args, backend, **compile_options):
    compiled = torch.compile(fn, backend=reproarchive.capture(backend, path=path), **compile_options)
    with pytest.raises(Exception, match="symbol"):  # the backend's own message
        compiled(*args)
    return reproarchive.load(path)


def tensor_dims(policy, source):
    return next(r for r in policy.inputs if r.source == source).dims


def test_mark_dynamic_with_a_range_is_recorded_with_its_range_origin_and_guards(tmp_path):
    x, y = torch.randn(8, 3), torch.randn(8, 3)
    torch._dynamo.mark_dynamic(x, 0, min=2, max=64)
    policy = captured(tmp_path / "a.tar.zst", two_sums, (x, y), FREE_SYMBOLS).records.shapes
    dim0, dim1 = tensor_dims(policy, "L['x']")
    assert (dim0.kind, dim0.size, dim0.min, dim0.max, dim0.origin, dim0.source) == (
        "backed", 8, 2, 64, "mark_dynamic", "L['x'].size()[0]")
    assert (dim1.kind, dim1.size) == ("static", 3)
    assert all(d.kind == "static" for d in tensor_dims(policy, "L['y']"))
    assert "2 <= L['x'].size()[0] and L['x'].size()[0] <= 64" in policy.guards
    symint = next(r for r in policy.inputs if r.kind == "symint")  # Dynamo's s77 placeholder
    assert symint.dims[0].expr == dim0.expr and symint.dims[0].origin == "mark_dynamic"
    assert policy.recorded_from == "fake_tensors"


def test_equal_sizes_marked_dynamic_one_by_one_are_independent_symbols(tmp_path):
    x, y = torch.randn(8, 3), torch.randn(8, 3)
    torch._dynamo.mark_dynamic(x, 0)
    torch._dynamo.mark_dynamic(y, 0)
    policy = captured(tmp_path / "a.tar.zst", two_sums, (x, y), FREE_SYMBOLS).records.shapes
    (x0, _), (y0, _) = tensor_dims(policy, "L['x']"), tensor_dims(policy, "L['y']")
    assert x0.kind == y0.kind == "backed" and x0.expr != y0.expr and x0.size == y0.size == 8


def test_dynamic_true_duck_sizes_equal_dimensions_and_specialises_size_one(tmp_path):
    x, y = torch.randn(8, 1), torch.randn(8, 1)
    policy = captured(tmp_path / "a.tar.zst", two_sums, (x, y), FREE_SYMBOLS, dynamic=True).records.shapes
    (x0, x1), (y0, _) = tensor_dims(policy, "L['x']"), tensor_dims(policy, "L['y']")
    assert x0.expr == y0.expr and x0.origin == "dynamic=True"
    x_index, y_index = (next(r.input for r in policy.inputs if r.source == s) for s in ("L['x']", "L['y']"))
    assert f"{y_index}.0" in x0.equal_to and f"{x_index}.0" in y0.equal_to
    assert (x1.kind, x1.size, x1.specialized) == ("static", 1, "0/1")
    assert policy.settings["assume_static_by_default"] is False


def test_an_unbacked_symbol_from_nonzero_is_recorded(tmp_path):
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        repro = captured(tmp_path / "a.tar.zst", nonzero_view, (torch.tensor([1.0, 0.0, 2.0, 3.0]),), UNBACKED,
                         fullgraph=True)
    policy = repro.records.shapes
    unbacked = [s for s in policy.symbols if s.kind == "unbacked"]
    assert unbacked and unbacked[0].name.startswith("u") and unbacked[0].hint is None
    assert all(d.kind == "static" for r in policy.inputs for d in r.dims)  # the input itself is static
