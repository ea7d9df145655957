"""Synthetic FX graphs of a chosen size, shaped like real ones (a chain of ATen ops with
residual branches, reductions and views), for what only size exercises: paging, layout time,
diff speed."""

from __future__ import annotations

import random
from pathlib import Path

import torch
import torch.fx as fx

import reproarchive

_UNARY = [torch.ops.aten.relu.default, torch.ops.aten.sin.default, torch.ops.aten.neg.default,
          torch.ops.aten.exp.default, torch.ops.aten.clone.default]


def chain_graph(nodes: int, *, seed: int = 0, inputs: int = 4) -> fx.GraphModule:
    """About ``nodes`` nodes: ``inputs`` placeholders, then unary ops, adds of earlier values,
    matmuls with an input and sums, in a random but reproducible order."""
    rng = random.Random(seed)
    g = fx.Graph()
    values = [g.placeholder(f"x{i}") for i in range(inputs)]
    weight = values[0]
    while len(g.nodes) < nodes - 1:
        last = values[-1]
        roll = rng.random()
        if roll < 0.5:
            v = g.call_function(rng.choice(_UNARY), (last,))
        elif roll < 0.8:
            v = g.call_function(torch.ops.aten.add.Tensor, (last, rng.choice(values[-12:])))
        elif roll < 0.9:
            v = g.call_function(torch.ops.aten.mm.default, (last, weight))
        else:
            v = g.call_function(torch.ops.aten.mul.Tensor, (last, rng.choice(values[:inputs])))
        values.append(v)
    g.output((values[-1],))
    return fx.GraphModule(torch.nn.Module(), g)


def pack_chain(path: Path, nodes: int, *, seed: int = 0, **records) -> Path:
    """``chain_graph(nodes)`` packed with small 4x4 inputs (no run, no compile)."""
    gm = chain_graph(nodes, seed=seed)
    torch.manual_seed(seed)
    args = [torch.randn(4, 4) for _ in range(4)]
    return reproarchive.pack(gm, args, path, backend="inductor", **records)
