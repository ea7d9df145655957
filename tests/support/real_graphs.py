"""Graphs as torch.compile hands them to a backend, from small versions of what real models do.

The allowlist of spec §7.3 must refuse what reaches outside tensors and still accept every
graph real models produce; these are the positive controls: a transformer block, a conv net,
the common Python-level idioms Dynamo keeps (``//``, ``.shape``, einsum, ``no_grad`` and
autocast regions, constant factories, RNG), a higher-order operator and ``vmap``, each captured
at the Dynamo level (Python functions and methods) and after AOTAutograd (ATen operators).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    """A pre-norm transformer block (attention, GELU MLP, dropout)."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.norm2 = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, 4 * d)
        self.fc2 = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        h = F.gelu(self.fc1(self.norm2(x)), approximate="tanh")
        return x + F.dropout(self.fc2(h), p=0.1, training=self.training)


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.conv2 = torch.nn.Conv2d(4, 4, 3, padding="same")

    def forward(self, x):
        y = F.relu(self.bn(self.conv(x)))
        y = F.max_pool2d(y, 2)
        y = F.interpolate(y, scale_factor=2.0, mode="nearest")
        y = F.pad(self.conv2(y), (1, 1, 1, 1), mode="reflect")
        return F.adaptive_avg_pool2d(y, 1).flatten(1).softmax(-1)


def idioms(x, idx):
    n = x.shape[0] // 2
    y = torch.einsum("ij,jk->ik", x, x.t()) / torch.tensor(2.0)
    z = torch.div(x, 3, rounding_mode="floor") + torch.arange(x.shape[1], dtype=x.dtype)
    with torch.no_grad():
        w = torch.ones_like(x).cumsum(0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        m = (x @ x.t()).float()
    top = torch.topk(x, 2, dim=1)
    r = torch.randn_like(x) * 0
    e = F.embedding(idx, x)
    s = torch.where(x > 0, x, -x).clamp(max=3.0).masked_fill(x < -1, 0.0)
    return (y[:n].sum() + z.sum() + w.sum() + m.sum() + top.values.sum() + top.indices.sum() + r.sum()
            + e.sum() + s.sum() + torch.cat([x, x]).split(2)[0].sum() + x.to(torch.float64).sum())


def branches(x):
    def t(x):
        return x.sin()

    def f(x):
        return x.cos()

    return torch.cond(x.sum() > 0, t, f, (x,)) + torch.vmap(lambda r: r * 2)(x)


def cases():
    torch.manual_seed(0)
    block = Block().train()
    return [
        ("block", block, (torch.randn(2, 4, 16, requires_grad=True),)),
        ("convnet", ConvNet().train(), (torch.randn(2, 3, 8, 8, requires_grad=True),)),
        ("idioms", idioms, (torch.randn(4, 4, requires_grad=True), torch.tensor([0, 2, 3]))),
        ("branches", branches, (torch.randn(3, 3),)),
    ]


def captured_graphs() -> list[tuple[str, torch.fx.GraphModule, list]]:
    """(label, graph, example inputs) for every case, at the Dynamo level and after AOTAutograd
    (forward and backward graphs)."""
    from torch._dynamo.backends.common import aot_autograd

    out: list[tuple[str, torch.fx.GraphModule, list]] = []
    for label, fn, args in cases():
        def dynamo_level(gm, example, label=label):
            out.append((f"{label}/dynamo", gm, list(example)))
            return gm.forward

        def aot_level(kind, label=label):
            def compiler(gm, example):
                out.append((f"{label}/aot_{kind}", gm, list(example)))
                return gm
            return compiler

        for backend in (dynamo_level, aot_autograd(fw_compiler=aot_level("fw"), bw_compiler=aot_level("bw"))):
            torch._dynamo.reset()
            result = torch.compile(fn, backend=backend, fullgraph=True)(*args)
            if result.requires_grad:
                result.sum().backward()
    torch._dynamo.reset()
    return out
