"""Higher-order operators round-trip with their subgraphs, and the minifier cuts inside them.

Each program fails inside a higher-order operator's subgraph (a ``relu`` there, where the cheap
compiler ``support.hop_programs.fail_on_relu`` raises): captured in-process as Dynamo hands the
graph to a backend, or after AOTAutograd (where ``auto_functionalized`` and ``with_effects``
appear, calling an operator passed as a value: spec §7.2's ``operator`` argument), it must
reproduce on replay and minify to the op inside, with no higher-order operator left."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

import reproarchive
from reproarchive.errors import UnsafeArchiveError
from support import hop_programs

REPRODUCED = "reproduced"
_OPERATOR_NAMES = {"map": "map_impl", "checkpoint": "tag_activation_checkpoint",
                   "auto_functionalized": "auto_functionalized_v2"}


_capture = hop_programs.capture


@pytest.mark.parametrize("name,fn,level", hop_programs.PROGRAMS,
                         ids=[f"{level}-{name}" for name, _, level in hop_programs.PROGRAMS])
def test_a_failure_inside_a_subgraph_reproduces_and_minifies_to_the_op_inside(name, fn, level, tmp_path):
    path = tmp_path / f"{name}.tar.zst"
    _capture(fn, level, path)
    assert reproarchive.verify(path).valid
    repro = reproarchive.load(path)
    assert _OPERATOR_NAMES.get(name, name) in hop_programs.higher_order_ops(repro.gm)
    outcome = reproarchive.run(path, backend=hop_programs.BACKEND, isolate=False)
    assert (outcome.status, outcome.exit_code) == (REPRODUCED, 1), outcome.to_dict()

    report = reproarchive.minify_archive(path, tmp_path / f"{name}-min.tar.zst", backend=hop_programs.BACKEND)
    small = reproarchive.load(report.output).gm
    assert hop_programs.higher_order_ops(small) == [], small.code  # cut inside the subgraph
    ops = [n for n in small.graph.nodes if n.op in ("call_function", "call_method")]
    assert hop_programs.relu_calls(small) == 1 and len(ops) <= 2, small.code
    outcome = reproarchive.run(report.output, backend=hop_programs.BACKEND, isolate=False)
    assert (outcome.status, outcome.exit_code) == (REPRODUCED, 1), outcome.to_dict()


def test_an_operator_may_only_be_passed_to_an_operator_that_calls_it(tmp_path):
    """A graph passing an operator to anything else (here ``torch.add``) is refused by effect,
    and so is ``with_effects`` of an operator whose own effect is refused (``aten._print``)."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(torch.add, (x, torch.ops.aten.relu.default)))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    path = reproarchive.pack(gm, [torch.ones(2)], tmp_path / "passes-op.tar.zst", backend="eager")
    with pytest.raises(UnsafeArchiveError, match="passes operator torch.ops.aten.relu.default"):
        reproarchive.load(path)

    def prints(x):
        torch.ops.aten._print("hello")
        return torch.relu(x)

    printed = tmp_path / "print.tar.zst"
    _capture(prints, "aot", printed)
    with pytest.raises(UnsafeArchiveError, match="_print"):
        reproarchive.load(printed)


def test_a_while_loop_compiled_by_inductor_replays_and_minifies_into_its_body(tmp_path):
    """Inductor fails inside a ``while_loop`` body (its C++ relu injector). Inductor's lowering
    of the loop makes symbols of its own, which needs the ShapeEnv Dynamo gives every backend:
    the static replay gives one too (a DIFFERENT FAILURE "'NoneType' object has no attribute
    'ignore_fresh_unbacked_symbols'" before), and the minifier takes the relu out of the body."""
    from torch._higher_order_ops.while_loop import while_loop

    def program(x):
        def cond(i, x):
            return i < 3

        def body(i, x):
            return i + 1, torch.relu(x) + 1

        return while_loop(cond, body, (torch.tensor(0), x))[1].sum()

    path = tmp_path / "while.tar.zst"
    torch._dynamo.reset()
    with torch._inductor.config.patch({"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"}):
        compiled = torch.compile(program, backend=reproarchive.capture("inductor", path=path))
        with pytest.raises(Exception, match="CppCompileError"):
            compiled(torch.randn(4, 4))
    torch._dynamo.reset()
    outcome = reproarchive.run(path, isolate=False)
    assert (outcome.status, outcome.exit_code) == (REPRODUCED, 1), outcome.to_dict()
    report = reproarchive.minify_archive(path, tmp_path / "while-min.tar.zst", shrink_inputs=False)
    small = reproarchive.load(report.output).gm
    assert hop_programs.higher_order_ops(small) == [] and hop_programs.relu_calls(small) == 1, small.code


@pytest.mark.slow
def test_every_higher_order_op_dynamo_hands_inductor_replays_inductors_failure_inside_it(tmp_path):
    """The programs above, compiled by inductor itself (its C++ relu injector fails on the relu
    inside each operator's subgraph) rather than by a cheap backend: each archive replays to the
    same CppCompileError through inductor's own lowering of the operator. (Minifying into a
    subgraph under inductor is the while_loop test's above; the cheap backend's tests minify
    every operator.)"""
    programs = [(name, fn) for name, fn, level in hop_programs.PROGRAMS if level == "dynamo"]
    for name, fn in programs:
        path = tmp_path / f"{name}.tar.zst"
        torch._dynamo.reset()
        with torch._inductor.config.patch({"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"}):
            compiled = torch.compile(fn, backend=reproarchive.capture("inductor", path=path), fullgraph=True)
            with pytest.raises(Exception, match="CppCompileError"):
                compiled(torch.randn(8, 16))
        torch._dynamo.reset()
        assert hop_programs.higher_order_ops(reproarchive.load(path).gm), name
        outcome = reproarchive.run(path)
        assert (outcome.status, outcome.exit_code) == (REPRODUCED, 1), (name, outcome.to_dict())
        assert outcome.observed.exception_type.endswith("CppCompileError"), name
