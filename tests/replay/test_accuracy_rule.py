"""The accuracy rule where it departs from PyTorch's ``same()``, and the floating-only mode."""

from __future__ import annotations

import torch

from reproarchive.replay.accuracy import compare


def test_nan_in_the_fp64_reference_does_not_hide_a_wrong_result():
    """log1p computed as x + 1 (PyTorch's injector): where x < -1 eager and fp64 are NaN, so both
    RMSEs are NaN and PyTorch's rule passes the output; the elements fp64 vouches for are wrong."""
    torch.manual_seed(0)
    x = torch.randn(20, dtype=torch.float64)
    eager, fp64, compiled = torch.log1p(x.float()), torch.log1p(x), x.float() + 1
    report = compare((eager,), (compiled,), (fp64,))
    assert not report.passed and "where fp64 is finite" in report.outputs[0].rule
    # the same NaNs and otherwise close values still pass
    close = torch.where(torch.isnan(eager), eager, eager + 1e-6)
    assert compare((eager,), (close,), (fp64,)).passed


def test_floating_only_mode_ignores_bool_and_integer_outputs():
    mask, idx, y = torch.tensor([True, False]), torch.tensor([1, 2]), torch.ones(2)
    flipped = (~mask, idx + 1, y)
    assert not compare((mask, idx, y), flipped).passed
    assert compare((mask, idx, y), flipped, ignore_non_fp=True).passed


def _linear_chain(layers: int, width: int):
    """A Dynamo-style graph: every weight a placeholder, as Dynamo passes parameters."""
    import torch.fx as fx

    graph = fx.Graph()
    x = graph.placeholder("x")
    weights = [graph.placeholder(f"w{i}") for i in range(layers)]
    for w in weights:
        x = graph.call_function(torch.relu, (graph.call_function(torch.nn.functional.linear, (x, w)),))
    graph.output((x,))
    torch.manual_seed(0)
    args = [torch.randn(4, width, requires_grad=True)] + [torch.randn(width, width) / width ** 0.5
                                                          for _ in range(layers)]
    return fx.GraphModule(torch.nn.Module(), graph), args


def test_fp64_reference_casts_one_input_at_a_time_and_matches_a_full_cast():
    import weakref

    from torch.utils._python_dispatch import TorchDispatchMode

    from reproarchive.replay.fp64_run import fp64_reference

    gm, args = _linear_chain(layers=8, width=64)
    alive: list[weakref.ref] = []
    peak = [0]

    class CountFloat64Copies(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, a=(), kw=None):
            out = func(*a, **(kw or {}))
            if func is torch.ops.aten._to_copy.default and out.dtype == torch.float64 and out.dim() == 2 \
                    and out.shape[0] == 64:  # a weight's cast
                alive.append(weakref.ref(out))
            peak[0] = max(peak[0], sum(r() is not None for r in alive))
            return out

    with torch.no_grad(), CountFloat64Copies():
        result, error = fp64_reference(gm, args, fwd_only=True)
    assert error is None
    assert len(alive) == 8 and peak[0] <= 2  # never an fp64 copy of every weight at once
    expected = gm(*[a.detach().double() for a in args])[0]
    assert torch.equal(result["outputs"][0], expected)

    # with backward: gradients in float64, with respect to the inputs that require grad only
    result, error = fp64_reference(gm, args)
    assert error is None and set(result["grads"]) == {0}
    reference = args[0].detach().double().requires_grad_()
    out = gm(reference, *[w.double() for w in args[1:]])[0]
    (out.sum() / out.numel()).backward()
    assert result["grads"][0].dtype == torch.float64 and torch.allclose(result["grads"][0], reference.grad)
    assert args[0].grad is None  # the caller's tensor got no gradient
