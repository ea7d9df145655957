"""Input moves: shapes halved, dtypes narrowed, values replaced by zeros/ones -- and labelled."""

from __future__ import annotations

import torch
import torch.fx as fx

from reproarchive.minifier import minify_with_stats
from reproarchive.minifier.inputs import Transform, apply, label

aten = torch.ops.aten


def relu_graph(n_inputs: int = 1) -> fx.GraphModule:
    g = fx.Graph()
    xs = [g.placeholder(f"x{i}") for i in range(n_inputs)]
    y = g.call_function(aten.sin.default, (xs[0],))
    y = g.call_function(aten.relu.default, (y,))
    for x in xs[1:]:
        y = g.call_function(aten.add.Tensor, (y, x))
    g.output((y,))
    return fx.GraphModule(torch.nn.Module(), g)


def has(gm, target) -> bool:
    return any(n.target is target for n in gm.graph.nodes)


def test_apply_crops_the_leading_block_and_keeps_dimension_order_and_broadcast():
    x = torch.arange(48, dtype=torch.float64).reshape(6, 8).t()  # (8, 6), transposed
    out = apply(x, Transform(shape=(4, 3), dtype="float32"))
    assert out.shape == (4, 3) and out.dtype == torch.float32
    assert out.stride() == (1, 4) and not out.is_contiguous()  # still column-major
    assert torch.equal(out, x[:4, :3].float())
    nhwc = torch.randn(2, 4, 6, 6).to(memory_format=torch.channels_last)
    assert apply(nhwc, Transform(shape=(2, 4, 3, 3))).is_contiguous(memory_format=torch.channels_last)
    expanded = torch.randn(1, 5).expand(4, 5)
    small = apply(expanded, Transform(shape=(2, 5)))
    assert small.stride()[0] == 0 and torch.equal(small[1], expanded[0])
    assert torch.equal(apply(x, Transform(fill=1)), torch.ones_like(x))
    assert apply(x, Transform(fill=1)).stride() == x.stride()
    assert label(x, Transform(shape=(4, 3), dtype="float32"))["values"] == "cropped+cast"
    assert label(x, Transform(shape=(4, 3), fill=0))["values"] == "zeros"
    assert label(x, Transform())["values"] == "recorded"


def test_input_moves_shrink_narrow_and_fill_where_the_failure_allows_and_say_so():
    x = torch.randn(16, 32, dtype=torch.float64).t()  # (32, 16), not contiguous

    def fails(gm, inputs):
        (a,) = inputs  # the "bug": relu on a non-contiguous input of at least 4 rows
        return has(gm, aten.relu.default) and not a.is_contiguous() and a.shape[0] >= 4

    result = minify_with_stats(relu_graph(), [x], fails, shrink_inputs=True)
    (a,) = result.inputs
    assert [n.target for n in result.gm.graph.nodes if n.op == "call_function"] == [aten.relu.default]
    assert a.shape[0] == 4 and not a.is_contiguous() and a.dtype == torch.float16
    assert torch.count_nonzero(a) == 0  # the values did not matter
    (prov,) = result.input_provenance
    assert prov["origin"] == "node:sin_default" and prov["depends_on"] == [0]
    assert prov["values"] == "zeros" and prov["dtype"] == {"recorded": "float64", "now": "float16"}
    assert prov["shape"]["recorded"] == [32, 16] and prov["shape"]["now"][0] == 4
    assert result.stats.final_input_bytes < result.stats.initial_input_bytes
    assert {"shrink_shapes", "narrow_dtypes", "fill_inputs"} <= set(result.stats.passes)
    assert result.stats.inputs == result.input_provenance


def test_values_that_matter_stay_recorded():
    x, y = torch.randn(4, 4), torch.randn(4, 4) + 10

    def fails(gm, inputs):  # needs y's real values (all > 5), not x's
        return has(gm, aten.add.Tensor) and len(inputs) == 2 and bool((inputs[1] > 5).all())

    result = minify_with_stats(relu_graph(2), [x, y], fails, shrink_inputs=True)
    labels = {p["origin"]: p["values"] for p in result.input_provenance}
    assert labels["input:1"] in ("recorded", "cropped", "cast", "cropped+cast")  # the values, not a fill
    assert [v for k, v in labels.items() if k != "input:1"] == ["zeros"]


def test_without_shrink_inputs_the_inputs_are_the_recorded_values():
    x = torch.randn(8, 8)
    result = minify_with_stats(relu_graph(), [x], lambda gm, inputs: has(gm, aten.relu.default))
    assert result.input_provenance == [{"origin": "node:sin_default", "depends_on": [0], "values": "recorded"}]
    assert torch.equal(result.inputs[0], x.sin())
