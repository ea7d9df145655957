"""Device constants inside a graph follow the device mapping a replay asks for."""

from __future__ import annotations

import torch
import torch.fx as fx


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
