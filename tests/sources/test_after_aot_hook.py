"""Inductor's door maps the graph AOTAutograd hands Inductor back to the program's real inputs
(``sources.program.after_aot_hook.real_inputs``): by AOTAutograd's own input descriptors, and only where
the real value has the metadata Inductor was given. No compile: a graph and fake inputs built here."""

from __future__ import annotations

import torch
from torch import fx
from torch._functorch._aot_autograd.descriptors import ParamAOTInput, PlainAOTInput
from torch._subclasses.fake_tensor import FakeTensorMode

from reproarchive.sources.program.after_aot_hook import real_inputs


def _graph(descs) -> fx.GraphModule:
    g = fx.Graph()
    for i, desc in enumerate(descs):
        node = g.placeholder(f"primals_{i + 1}")
        if desc is not None:
            node.meta["desc"] = desc
    g.output(())
    return fx.GraphModule(torch.nn.Module(), g)


def test_each_input_is_the_real_value_its_descriptor_names_when_the_metadata_matches():
    dynamo_gm = torch.nn.Module()
    dynamo_gm.weight = torch.nn.Parameter(torch.randn(5, 3))
    ids, other = torch.randint(0, 5, (2, 4)), torch.randn(4, 4)
    with FakeTensorMode() as mode:
        fakes = [mode.from_tensor(t) for t in (dynamo_gm.weight, ids, other, torch.randn(4, 4), torch.randn(2, 2))]
    gm = _graph([ParamAOTInput("weight"), PlainAOTInput(0), PlainAOTInput(1), None, PlainAOTInput(1)])
    inputs, real = real_inputs(gm, fakes, (dynamo_gm, [ids, other]))
    assert real == 3
    assert inputs[0] is dynamo_gm.weight and inputs[1] is ids and inputs[2] is other
    assert inputs[3] is fakes[3]  # no descriptor: stays as Inductor got it (stored absent)
    assert inputs[4] is fakes[4]  # the named input has other metadata: never passed off as real


def test_without_the_dynamo_call_nothing_is_real():
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(torch.randn(3))
    inputs, real = real_inputs(_graph([PlainAOTInput(0)]), [fake], None)
    assert real == 0 and inputs == [fake]
