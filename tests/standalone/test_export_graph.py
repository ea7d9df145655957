"""The exported ``repro.py`` hands the backend the recorded graph, node for node.

A script that re-traced the graph (``symbolic_trace`` or ``torch.compile`` of the recorded
module) would give the backend a different graph than the one that failed: constant-only calls
such as ``torch.tensor(2.0)`` folded into tensor attributes, ``2.0 - x`` rewritten, names and
order changed. Each graph below is packed, exported, and the GraphModule the script builds is
compared with the one ``reproarchive.load`` gives: same nodes in the same order, same op, name
and qualified target, the same constants as literals of the same type, the same state. One
export is run as ``python repro.py`` with a backend that writes down what it received.
"""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.fx as fx

import reproarchive
from reproarchive.context import failure as failure_mod
from reproarchive.standalone.script import export
from support import graph_recorder
from support.graph_recorder import describe

RECORDER = "graph_recorder:record"


class _Dynamo(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3))
        self.register_buffer("b", torch.ones(3))

    def forward(self, x):
        c, o, z = torch.tensor(2.0), torch.ones(3), torch.zeros(2, 2)
        f = torch.full((3,), -0.0, dtype=torch.float64)
        y = 1 + 3 / (2.0 - x)
        y = 2 ** y - 1.5 * y
        y = y.sum(dim=0, keepdim=True).view(-1).to(torch.float32).expand(3)
        y = y[1:] if y.shape[0] > 1 else y
        return (torch.cat([y, y[:1]]) * self.w + self.b + c + o).clamp(min=-float("inf")), z, f


def dynamo_graph():
    """Dynamo's graph (after_dynamo): constant-only calls, reversed operators, method calls,
    slices, dtype kwargs; the module's parameter and buffer arrive as placeholders."""
    graphs = []
    torch._dynamo.reset()
    torch.compile(_Dynamo(), backend=lambda gm, ex: graphs.append((gm, ex)) or gm, fullgraph=True)(torch.randn(3))
    torch._dynamo.reset()
    return graphs[0]


class _Traced(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(3, 3))
        self.register_buffer("scale", torch.full((3,), 0.5))
        self.table = torch.arange(3.0)  # a plain tensor attribute: a constant, neither kind of state

    def forward(self, x):
        y = torch.nn.functional.linear(x, self.weight) * self.scale + self.table
        return (torch.tensor(1.0) - y).relu()


def traced_graph():
    """A symbolic_trace graph: get_attr of a parameter, a buffer and a constant, then a
    call_module of a GraphModule child with its own parameter (a nested graph)."""
    gm = fx.symbolic_trace(_Traced())
    child_root = torch.nn.Module()
    child_root.bias = torch.nn.Parameter(torch.randn(3))
    cg = fx.Graph()
    a = cg.placeholder("a")
    bias = cg.get_attr("bias")
    rsub = cg.call_function(torch.rsub, (a, 2.0), {"alpha": 3})
    cg.output(cg.call_function(torch.add, (rsub, bias)))
    gm.add_submodule("inner", fx.GraphModule(child_root, cg))
    out = next(n for n in gm.graph.nodes if n.op == "output")
    with gm.graph.inserting_before(out):
        called = gm.graph.call_module("inner", (out.args[0],))
    out.args = ((called, out.args[0]),)
    gm.recompile()
    return gm, [torch.randn(2, 3)]


def aten_graph():
    """An ATen graph (after_aot): OpOverload targets, constant-only factory calls with
    device/dtype/layout kwargs, reversed scalar operators as ATen spells them."""
    def f(x):
        k = torch.scalar_tensor(3.0) + torch.ones(2, 2, dtype=torch.float32)
        return (5 - x) / 2 + k, (2 / x).transpose(0, 1).contiguous(), x.new_zeros(1)

    from torch.fx.experimental.proxy_tensor import make_fx

    x = torch.randn(2, 2)
    return make_fx(f)(x), [x]


def cond_graph():
    """A higher-order op: torch.cond's branches are subgraphs read with get_attr."""
    def f(x):
        return torch.cond(x.sum() > 0, lambda t: t.sin() + 1.0, lambda t: 1.0 - t.cos(), (x,))

    graphs = []
    torch._dynamo.reset()
    torch.compile(f, backend=lambda gm, ex: graphs.append((gm, ex)) or gm, fullgraph=True)(torch.randn(4))
    torch._dynamo.reset()
    return graphs[0]


def modes_graph():
    """Dynamic shapes and the calls Dynamo writes for context managers: SymInt placeholders,
    grad mode and autocast enter/exit, indexing with Ellipsis/None/slices, nan and -inf."""
    def f(x, n):
        with torch.no_grad():
            a = x * 2
        with torch.autocast("cpu", dtype=torch.bfloat16):
            b = torch.mm(x, x)
        y = x[..., None, 1:, ::2]
        w = torch.where(x > 0, x + float("nan") * 0, torch.tensor(float("-inf")))
        return a, b.float(), y, w, x.size(0) * n, torch.arange(4, device="cpu").sum()

    graphs = []
    torch._dynamo.reset()
    torch.compile(f, backend=lambda gm, ex: graphs.append((gm, ex)) or gm, fullgraph=True, dynamic=True)(
        torch.randn(4, 4), 3)
    torch._dynamo.reset()
    return graphs[0]


CASES = {"dynamo": dynamo_graph, "traced": traced_graph, "aten": aten_graph, "cond": cond_graph,
         "modes": modes_graph}


def packed(tmp_path: Path, case: str) -> Path:
    gm, args = CASES[case]()
    path = tmp_path / f"{case}.tar.zst"
    reproarchive.pack(gm, list(args), path, backend=RECORDER, failure=failure_mod.unknown_record("test"))
    return path


def script_graph(script: Path):
    """The GraphModule ``repro.py`` builds for the backend, without running its main()."""
    return runpy.run_path(str(script), run_name="exported")["build"]()


@pytest.mark.parametrize("case", sorted(CASES))
def test_script_builds_the_recorded_graph_node_for_node(tmp_path, case):
    path = packed(tmp_path, case)
    recorded = reproarchive.load(path).gm
    export(path, tmp_path / "out")
    built = script_graph(tmp_path / "out" / "repro.py")
    want, got = describe(recorded), describe(built)
    assert list(got) == list(want)  # the same subgraphs at the same paths
    for key in want:
        assert got[key] == want[key], key


def test_dynamo_graph_keeps_constants_and_reversed_operators(tmp_path):
    """The cases a re-trace would lose, spelled out on the script's graph itself."""
    path = packed(tmp_path, "dynamo")
    export(path, tmp_path / "out")
    nodes = {n.name: n for n in script_graph(tmp_path / "out" / "repro.py").graph.nodes}
    calls = [(n.target, n.args) for n in nodes.values() if n.op == "call_function"]
    assert (torch.tensor, (2.0,)) in calls and (torch.ones, (3,)) in calls and (torch.zeros, (2, 2)) in calls
    import operator

    reversed_ops = {(n.target, n.args[0]) for n in nodes.values()
                    if n.op == "call_function" and n.args and not isinstance(n.args[0], fx.Node)}
    assert {(operator.sub, 2.0), (operator.truediv, 3), (operator.add, 1), (operator.pow, 2)} <= reversed_ops
    assert {type(a) for t, a in reversed_ops if t in (operator.sub, operator.truediv)} == {float, int}
    assert {"sum", "view", "to", "expand"} <= {n.target for n in nodes.values() if n.op == "call_method"}


@pytest.mark.parametrize("case", ["dynamo", "traced"])
def test_python_repro_py_hands_the_backend_the_recorded_graph(tmp_path, case):
    """``python repro.py --backend graph_recorder:record``: the backend writes what it got."""
    path = packed(tmp_path, case)
    export(path, tmp_path / "out")
    received = tmp_path / "received.json"
    env = dict(os.environ, PYTHONPATH=str(Path(graph_recorder.__file__).parent),
               **{graph_recorder.OUT_VARIABLE: str(received)})
    proc = subprocess.run([sys.executable, "repro.py", "--backend", RECORDER], cwd=tmp_path / "out",
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "no failure" in proc.stdout, proc.stderr[-3000:]
    want = json.loads(json.dumps(describe(reproarchive.load(path).gm)))
    assert json.loads(received.read_text()) == want
