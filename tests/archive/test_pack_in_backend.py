"""``reproarchive.pack`` called by a user's own backend records what the capture backend
records of the same call: the shape policy of the symbolic inputs Dynamo handed it, the grad
mode and autocast Dynamo guarded the graph on, and the generator states its first call starts
from. Without them a symbolic, no_grad or random graph replays as another program."""

from __future__ import annotations

import pytest
import torch

import reproarchive
from reproarchive.format.reader import ContainerReader


def _records(path):
    with ContainerReader(path) as reader:
        return reader.index.records


@pytest.mark.usefixtures("fresh_dynamo")
def test_pack_in_a_backend_records_shapes_execution_and_rng(tmp_path):
    path = tmp_path / "mine.tar.zst"

    def my_backend(gm, example_inputs):
        reproarchive.pack(gm, example_inputs, path, backend="eager")
        return gm.forward

    def f(x):
        return torch.nn.functional.dropout(x.sin(), 0.5, training=True) * x.shape[0]

    with torch.no_grad():
        torch.compile(f, backend=my_backend, dynamic=True)(torch.randn(6))
    records = _records(path)
    assert records.shapes is not None and records.shapes.symbols, records.shapes
    assert records.execution is not None and records.execution.grad_enabled is False
    assert records.rng is not None and records.rng.generators
    # the replay honours all three: nothing makes its pass inconclusive
    outcome = reproarchive.run(path, isolate=False)
    assert outcome.status == "passed" and outcome.unfaithful == [], outcome.to_dict()


def test_pack_outside_a_trace_takes_no_thread_state(tmp_path):
    """A graph packed by hand: the calling thread's grad mode says nothing of the graph."""
    gm = torch.fx.symbolic_trace(torch.nn.ReLU())
    path = reproarchive.pack(gm, [torch.ones(3)], tmp_path / "hand.tar.zst", backend="eager")
    records = _records(path)
    assert records.execution is None and records.shapes is None
