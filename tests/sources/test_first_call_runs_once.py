"""The first call of a compiled graph runs it once where a check run would be that very call
(capture's target: first calls at most 1.5x plain's with ``eager``), and always with
``check_runtime="calls"``; its failures are archived as the check's were, and the archive a
native crash would leave covers it.

Backends are custom functions that count their calls, or ``support.later_call_backends``:
milliseconds per graph; one test starts a program that aborts (a subprocess, no compiler).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch
import torch._dynamo

import reproarchive
from reproarchive.sources.capture.call_guard import backward_is_compiled, outputs_cannot_require_grad, runs_the_graph
from reproarchive.sources.capture.capture_backend import archive_path
from support import later_call_backends
from support.captures import archives_after_death, kept, stages_a_crash_would_leave

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def writes_and_draws(x, w):
    x.mul_(2)  # the graph writes x: an archive holds it as it was before the call
    return torch.relu(x @ w) + torch.rand(4, 8)


def _archives(folder):
    return sorted(folder.glob("*.tar.zst"))


class Counting:
    """A backend whose compiled code counts its runs and notes the failure stage of each archive
    on disk meanwhile."""

    def __init__(self, folder):
        self.folder, self.runs, self.archives_during = folder, 0, []

    def __call__(self, gm, example_inputs):
        def run(*args):
            self.runs += 1
            self.archives_during.append(stages_a_crash_would_leave(self.folder))
            return gm(*args)
        return run


def _first_call(tmp_path, *, w_grad: bool, grad_mode: bool = True, **options):
    counting = Counting(tmp_path)
    compiled = torch.compile(writes_and_draws, backend=reproarchive.capture(counting, path=tmp_path, **options))
    x, w = torch.randn(4, 8), torch.randn(8, 8, requires_grad=w_grad)
    x0 = x.clone()
    with torch.set_grad_enabled(grad_mode):
        out = compiled(x, w)
    return counting, out, x, x0, w


# ------------------------------------------------------------------------------------------
# how many times the graph runs at its first call


@pytest.mark.parametrize("case", ["no input requires grad", "grad mode off", "fwd_only", "calls"])
def test_a_first_call_that_is_its_own_check_runs_the_graph_once_under_the_crash_archive(tmp_path, case):
    options = {"fwd_only": {"fwd_only": True}, "calls": {"check_runtime": "calls"}}.get(case, {})
    counting, out, x, x0, w = _first_call(tmp_path, w_grad=case != "no input requires grad",
                                          grad_mode=case != "grad mode off", **options)
    assert counting.runs == 1
    # the archive a native crash would leave was on disk during that one run, and is gone after
    assert counting.archives_during == [["crash"]]
    assert kept(tmp_path) == []
    assert torch.equal(x, x0 * 2)  # the program's own effect, once
    if case == "calls":  # the training step goes on as without capture
        out.sum().backward()
        assert w.grad is not None and counting.runs == 1


def test_a_first_call_whose_output_requires_grad_is_its_own_check_too(tmp_path):
    """A training graph's first call is not run twice: its backward, where the backend compiled
    one, is watched where the program runs it (``backward_watch``); here it is PyTorch's."""
    counting, out, x, x0, w = _first_call(tmp_path, w_grad=True)
    assert counting.runs == 1
    assert counting.archives_during == [["crash"]]
    assert torch.equal(x, x0 * 2) and w.grad is None
    out.sum().backward()
    assert w.grad is not None and counting.runs == 1 and kept(tmp_path) == []


def test_a_first_call_with_spool_false_is_checked_before_it(tmp_path):
    """``spool=False`` writes a whole archive before the first run, which cannot be set aside
    while the program runs between the call and its backward: a check runs before the call."""
    counting, out, x, x0, w = _first_call(tmp_path, w_grad=True, spool=False)
    assert counting.runs == 2  # the check's forward on aliases/copies, then the real call
    assert torch.equal(x, x0 * 2) and w.grad is None


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad


class CountingBackward:
    """A backend whose compiled code counts its forwards and the backward passes that reach its
    outputs; ``function``: the outputs come out of an ``autograd.Function``, as AOTAutograd's
    compiled backward's do."""

    def __init__(self, function: bool):
        self.function, self.forwards, self.backwards = function, 0, 0

    def _reached(self, grad):
        self.backwards += 1

    def __call__(self, gm, example_inputs):
        def run(*args):
            self.forwards += 1
            outs = [_Identity.apply(o) if self.function else o for o in gm(*args)]
            for o in outs:
                o.register_hook(self._reached)
            return outs
        return run


@pytest.mark.parametrize("function", [False, True], ids=["pytorch-derivatives", "autograd-function"])
def test_a_training_step_runs_once_at_a_first_call(tmp_path, function):
    """No check step before the first call: the real call is the check, and a backward the
    backend compiled runs once, in the program's own ``backward()``, watched there."""
    backend = CountingBackward(function)
    compiled = torch.compile(lambda x, w: torch.relu(x @ w), backend=reproarchive.capture(backend, path=tmp_path))
    w = torch.randn(8, 8, requires_grad=True)
    compiled(torch.randn(4, 8), w).sum().backward()
    assert (backend.forwards, backend.backwards) == (1, 1)
    assert w.grad is not None and kept(tmp_path) == []


class GraphItself:
    """A backend that returns the traced graph itself (``forward=True``: its ``forward``, as
    ``eager`` does), rewritten to count its runs (a node that calls ``_ran`` first) and, given a
    ``function``, to pass its outputs through it (one that applies an ``autograd.Function``)."""

    def __init__(self, forward: bool, function: Any = None):
        self.forward, self.function, self.runs = forward, function, 0

    def _ran(self) -> None:
        self.runs += 1

    def __call__(self, gm, example_inputs):
        graph = gm.graph
        with graph.inserting_before(next(iter(graph.nodes))):
            graph.call_function(self._ran)
        if self.function is not None:
            output = graph.output_node()
            with graph.inserting_before(output):
                output.args = (tuple(graph.call_function(self.function, (o,)) for o in output.args[0]),)
        gm.recompile()
        return gm.forward if self.forward else gm


@pytest.mark.parametrize("forward", [True, False], ids=["its-forward", "the-graph-module"])
def test_a_backend_that_runs_the_graph_itself_is_checked_by_its_first_call(tmp_path, forward):
    """Its backward is PyTorch's derivatives of the graph's operators: a check run would be a
    forward like the real call's, so the real call is the check (what keeps eager first calls cheap)."""
    backend = GraphItself(forward)
    compiled = torch.compile(lambda x, w: torch.relu(x @ w), backend=reproarchive.capture(backend, path=tmp_path))
    w = torch.randn(8, 8, requires_grad=True)
    compiled(torch.randn(4, 8), w).sum().backward()
    assert backend.runs == 1
    assert w.grad is not None and kept(tmp_path) == []


class _Doubled(torch.autograd.Function):
    fail = False
    seen: list = []  # the values each forward saw

    @staticmethod
    def forward(ctx, x):
        _Doubled.seen.append(x.detach().clone())
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        if _Doubled.fail:
            raise RuntimeError("injected failure in a custom backward")
        return grad * 2


def _doubled(x):
    return _Doubled.apply(x)


def _draws(x, w):
    return torch.relu(x @ w) * torch.rand(4, 8)


@pytest.mark.parametrize("fails", [False, True], ids=["passes", "fails"])
def test_a_graph_run_by_the_backend_whose_backward_is_a_function_is_checked_after_its_first_call(tmp_path, fails):
    """The real call was the check, but its outputs' backward is an ``autograd.Function``'s: that
    backward runs once it has ended, on its inputs as they were before it and from the generator
    states it started from, and a failure of it is archived as the check's was."""
    _Doubled.fail, _Doubled.seen = fails, []
    try:
        backend = GraphItself(forward=True, function=_doubled)
        compiled = torch.compile(_draws, backend=reproarchive.capture(backend, path=tmp_path))
        x, w = torch.randn(4, 8), torch.randn(8, 8, requires_grad=True)
        torch.manual_seed(7)
        rng0 = torch.get_rng_state()
        if fails:
            with pytest.raises(RuntimeError, match="injected failure in a custom backward") as info:
                compiled(x, w)
        else:
            out = compiled(x, w)
        assert backend.runs == 2  # the real call, then the check of its backward
        real, checked = _Doubled.seen
        assert torch.equal(real, checked)  # the check drew the real call's random numbers
        if not fails:
            assert torch.equal(torch.get_rng_state(), _after_one_draw(rng0))  # the program's own draws, once
            out.sum().backward()
            assert kept(tmp_path) == [] and w.grad is not None
            return
        (archive,) = _archives(tmp_path)
        assert archive_path(info.value) == str(archive)
        repro = reproarchive.load(archive)
        assert repro.records.failure.stage == "backward"
        assert torch.equal(repro.args[0], x) and torch.equal(repro.rng_states["cpu"], rng0)
        assert w.grad is None  # the check's gradients were its own
    finally:
        _Doubled.fail = False


def _after_one_draw(state):
    with torch.random.fork_rng():
        torch.set_rng_state(state)
        torch.rand(4, 8)
        return torch.get_rng_state()


def test_runs_the_graph_is_judged_by_the_callable():
    gm = torch.fx.symbolic_trace(torch.nn.Linear(4, 4))
    assert runs_the_graph(gm) and runs_the_graph(gm.forward)
    assert not runs_the_graph(lambda *args: gm(*args))
    assert not runs_the_graph(gm.recompile)
    assert not runs_the_graph(torch.nn.Linear(4, 4).forward)


def test_backward_is_compiled_reads_the_outputs_autograd_graph():
    x, w = torch.randn(4, 8), torch.randn(8, 8, requires_grad=True)
    eager = torch.relu(x @ w)
    assert not backward_is_compiled([eager, 3, None])  # PyTorch's own nodes, down to the leaf
    assert backward_is_compiled((eager.detach(), _Identity.apply(eager)))
    assert backward_is_compiled([_Identity.apply(w) * 2])  # below a built-in node too
    assert not backward_is_compiled([x * 2])  # no autograd graph at all

    def aot_eager(*args):
        return torch.compile(lambda x, w: torch.relu(x @ w), backend="aot_eager")(*args)

    assert backward_is_compiled([aot_eager(x, w)])


def test_a_graph_holding_a_parameter_that_requires_grad_needs_the_check():
    gm = torch.fx.symbolic_trace(torch.nn.Linear(4, 4))
    x = torch.randn(2, 4)
    assert not outputs_cannot_require_grad(gm, [x])
    with torch.no_grad():
        assert outputs_cannot_require_grad(gm, [x])
    gm.requires_grad_(False)
    assert outputs_cannot_require_grad(gm, [x])


# ------------------------------------------------------------------------------------------
# a failure of that one run: the archive the check would have written


def _failing_first_call(folder, *, w_grad: bool, **options):
    x, w = torch.randn(4, 8), torch.randn(8, 8, requires_grad=w_grad)
    x0, rng0 = x.clone(), torch.get_rng_state()
    backend = reproarchive.capture(later_call_backends.fails_after_running, path=folder, **options)
    with pytest.raises(RuntimeError, match="failed after running") as info:
        torch.compile(writes_and_draws, backend=backend)(x, w)
    (archive,) = _archives(folder)  # the failure's: the crash archive was removed
    assert archive_path(info.value) == str(archive)
    return reproarchive.load(archive), archive, x, x0, rng0


@pytest.mark.parametrize("options", [{}, {"check_runtime": "calls"}], ids=["default", "calls"])
def test_a_failing_first_call_that_ran_once_leaves_the_archive_the_check_left(tmp_path, options):
    torch.manual_seed(0)
    checked, _, _, _, _ = _failing_first_call(tmp_path / "checked", w_grad=True)  # the check run fails
    torch.manual_seed(0)
    repro, archive, x, x0, rng0 = _failing_first_call(tmp_path / "once", w_grad=bool(options), **options)
    assert torch.equal(x, x0 * 2)  # this time the real call ran (and wrote x) before it failed
    failure = repro.records.failure
    assert failure.stage == "forward" == checked.records.failure.stage
    assert failure.signature == checked.records.failure.signature
    assert failure.inputs_modified == () and repro.fidelity == ["real", "real"]
    # the written input as it was before the call, the generator state the call started from
    assert torch.equal(repro.args[0], x0) and torch.equal(checked.args[0], x0)
    assert torch.equal(repro.args[1].detach(), checked.args[1].detach())
    assert torch.equal(repro.rng_states["cpu"], rng0) and torch.equal(checked.rng_states["cpu"], rng0)
    assert "mul_" in repro.gm.code and repro.records.source.check_runtime is True
    outcome = reproarchive.run(archive, backend="support.later_call_backends:fails_after_running")
    assert outcome.status == "reproduced", outcome


@pytest.mark.parametrize("check_runtime", [True, "calls"])
def test_calls_gives_up_archiving_a_failing_backward(tmp_path, check_runtime):
    """The trade-off ``check_runtime="calls"`` documents: the backward runs later, in the
    program's own ``backward()``, outside every guard; by default the check archives it."""
    backend = reproarchive.capture(later_call_backends.fails_in_backward, path=tmp_path, check_runtime=check_runtime)
    compiled = torch.compile(lambda x, w: torch.relu(x @ w), backend=backend)
    w = torch.randn(8, 8, requires_grad=True)
    with pytest.raises(RuntimeError, match="injected backward failure"):
        compiled(torch.randn(4, 8), w).sum().backward()
    stages = [reproarchive.load(a).records.failure.stage for a in _archives(tmp_path)]
    assert stages == (["backward"] if check_runtime is True else [])


# ------------------------------------------------------------------------------------------
# the option


def test_check_runtime_values_are_checked():
    with pytest.raises(ValueError, match="check_runtime must be True, False or 'calls', not 'call'"):
        reproarchive.capture("eager", check_runtime="call")
    with pytest.raises(ValueError, match="cannot check accuracy"):
        reproarchive.capture("eager", check_runtime="calls", accuracy=True)
    assert reproarchive.capture("eager", check_runtime="calls").settings["check_runtime"] == "calls"


# ------------------------------------------------------------------------------------------
# a native crash in that one run


_ABORTS_AT_RUNTIME = """
import os, sys, torch, reproarchive

def aborting(gm, example_inputs):
    def run(*args):
        os.abort()
    return run

w = torch.randn(8, 8, requires_grad=True)
compiled = torch.compile(lambda x, w: torch.relu(x @ w),
                         backend=reproarchive.capture(aborting, path=sys.argv[1], check_runtime="calls"))
compiled(torch.randn(4, 8), w).sum().backward()
"""


@pytest.mark.slow
def test_a_crash_in_the_first_call_with_calls_leaves_the_pending_archive(tmp_path):
    (tmp_path / "prog.py").write_text(textwrap.dedent(_ABORTS_AT_RUNTIME))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHDYNAMO_REPRO", "TORCH_COMPILE_DEBUG"))}
    done = subprocess.run([sys.executable, "prog.py", str(tmp_path / "archives")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGABRT, done.stderr[-2000:]
    (archive,) = archives_after_death(tmp_path / "archives")  # completed by the spool's guardian
    reproarchive.verify(archive)
    repro = reproarchive.load(archive)
    assert repro.records.failure.stage == "crash" and repro.records.source.written_before_run
    assert [tuple(a.shape) for a in repro.args] == [(4, 8), (8, 8)] and repro.args[1].requires_grad
