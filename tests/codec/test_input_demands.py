"""Generated data for absent inputs respects what the graph demands of them (spec §6.2):
an integer input used as an index stays inside the dimension it indexes, embedding_bag
offsets are non-decreasing from 0 and in range, whichever dialect wrote the graph (Dynamo's
torch functions and methods, AOTAutograd's aten ops). No compiles: pack, load, run eagerly."""

from __future__ import annotations

import operator

import pytest
import torch
from torch import fx

import reproarchive
from reproarchive import AbsentTensor

aten = torch.ops.aten
F = torch.nn.functional
ROWS = 3  # far below the [0, 16) integers generated when nothing is demanded


def _graph(build, n_inputs: int) -> fx.GraphModule:
    g = fx.Graph()
    ins = [g.placeholder(f"in{i}") for i in range(n_inputs)]
    g.output((build(g, *ins),))
    return fx.GraphModule(torch.nn.Module(), g)


def _fn(op, *args, **kwargs):
    return lambda g, *ins: g.call_function(op, tuple(ins[a] if isinstance(a, Ref) else a for a in args),
                                           {k: ins[v] if isinstance(v, Ref) else v for k, v in kwargs.items()})


class Ref(int):
    """An argument that is the graph input at this position."""


IDX = AbsentTensor((40,), torch.int64)
IDX2 = AbsentTensor((5, 8), torch.int64)
TABLE = torch.randn(ROWS, 4)
WIDE = torch.randn(6, ROWS)

CASES = {
    # name: (graph builder, inputs, which input is the index, the bound)
    "F.embedding": (_fn(F.embedding, Ref(1), Ref(0)), [TABLE, IDX2], 1, ROWS),
    "aten.embedding": (_fn(aten.embedding.default, Ref(0), Ref(1)), [TABLE, IDX2], 1, ROWS),
    "torch.index_select": (_fn(torch.index_select, Ref(0), 1, Ref(1)), [WIDE, IDX], 1, ROWS),
    "aten.index_select": (_fn(aten.index_select.default, Ref(0), 0, Ref(1)), [TABLE, IDX], 1, ROWS),
    "aten.gather": (_fn(aten.gather.default, Ref(0), 1, Ref(1)),
                    [WIDE, AbsentTensor((6, 2), torch.int64)], 1, ROWS),
    "torch.scatter_add": (_fn(torch.scatter_add, Ref(0), 1, Ref(1), Ref(2)),
                          [WIDE, AbsentTensor((6, 2), torch.int64), torch.ones(6, 2)], 1, ROWS),
    "aten.scatter.src": (_fn(aten.scatter.src, Ref(0), 1, Ref(1), Ref(2)),
                         [WIDE, AbsentTensor((6, 2), torch.int64), torch.ones(6, 2)], 1, ROWS),
    "aten.index_add": (_fn(aten.index_add.default, Ref(0), 0, Ref(1), Ref(2)),
                       [TABLE, AbsentTensor((7,), torch.int64), torch.ones(7, 4)], 1, ROWS),
    "aten.index.Tensor": (lambda g, t, i: g.call_function(aten.index.Tensor, (t, [None, i])), [WIDE, IDX], 1, ROWS),
    "aten.nll_loss_forward": (lambda g, x, t: g.call_function(operator.getitem, (
        g.call_function(aten.nll_loss_forward.default, (x, t, None, 1, -100)), 0)),
        [WIDE, AbsentTensor((6,), torch.int64)], 1, ROWS),
    "F.cross_entropy": (_fn(F.cross_entropy, Ref(0), target=Ref(1)), [WIDE, AbsentTensor((6,), torch.int64)], 1, ROWS),
    "gather of where(ne(t, -100), t, 0)": (lambda g, x, t: g.call_function(aten.gather.default, (x, 1, g.call_function(
        aten.unsqueeze.default, (g.call_function(torch.where, (g.call_function(aten.ne.Scalar, (t, -100)), t, 0)),
                                 1)))), [WIDE, AbsentTensor((6,), torch.int64)], 1, ROWS),
    "x[:, idx]": (lambda g, t, i: g.call_function(operator.getitem, (t, (slice(None), i))), [WIDE, IDX], 1, ROWS),
    "x[idx] through view": (lambda g, t, i: g.call_function(operator.getitem, (t, g.call_method("view", (i, -1)))),
                            [TABLE, IDX2], 1, ROWS),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_generated_indices_stay_in_the_indexed_dimension(name, tmp_path):
    build, inputs, which, bound = CASES[name]
    gm = _graph(build, len(inputs))
    path = reproarchive.pack(gm, inputs, tmp_path / "a.tar.zst")
    with pytest.warns(UserWarning, match="generated"):
        repro = reproarchive.load(path)
    assert repro.fidelity[which] == "absent"  # still labelled generated
    values = repro.args[which]
    assert 0 <= int(values.min()) and int(values.max()) < bound
    assert torch.equal(reproarchive.read_input(path, which), values)  # one generator, same data
    repro.gm(*repro.args)  # the graph runs on them


def test_embedding_bag_offsets_are_monotonic_and_in_range(tmp_path):
    indices, offsets = AbsentTensor((10,), torch.int64), AbsentTensor((4,), torch.int64)
    gm = _graph(_fn(aten._embedding_bag.default, Ref(0), Ref(1), Ref(2)), 3)
    path = reproarchive.pack(gm, [TABLE, indices, offsets], tmp_path / "bag.tar.zst")
    with pytest.warns(UserWarning):
        repro = reproarchive.load(path)
    got = repro.args[2]
    assert int(got[0]) == 0 and bool((got[1:] >= got[:-1]).all()) and int(got[-1]) <= 10
    assert int(repro.args[1].max()) < ROWS
    repro.gm(*repro.args)


def test_masks_stay_bool_and_unused_integers_keep_the_default_range(tmp_path):
    gm = _graph(lambda g, x, m, n: g.call_function(torch.where, (m, x, g.call_function(operator.add, (x, n)))), 3)
    inputs = [torch.randn(64), AbsentTensor((64,), torch.bool), AbsentTensor((64,), torch.int64)]
    with pytest.warns(UserWarning):
        repro = reproarchive.load(reproarchive.pack(gm, inputs, tmp_path / "m.tar.zst"))
    assert repro.args[1].dtype == torch.bool
    assert int(repro.args[2].max()) >= ROWS  # nothing demanded: integers in [0, 16) as before
