"""A first call's compiled backward is guarded where the program runs it (``backward_watch``),
not by a check step before the call (capture's target: first calls at most 1.15x plain's with
Inductor): the crash record is on disk while that backward runs and only then, a failure of it
is archived and raised in the program's own ``backward()``, and the class whose backward is
watched gets its own back.

Backends are AOTAutograd with Python compilers (a real compiled backward, milliseconds); one
test starts a program whose compiled backward aborts.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

import reproarchive
from reproarchive.sources.capture import backward_watch
from support.captures import archives_after_death, kept, stages_a_crash_would_leave

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _step(x, w):
    return torch.relu(x @ w)


def _recording_backend(folder, seen: list):
    """AOTAutograd whose compiled backward notes what a crash would leave while it runs."""

    def backward_compiler(gm, example_inputs):
        def run(*args):
            seen.append(stages_a_crash_would_leave(folder))
            return gm(*args)
        return make_boxed_func(run)

    return aot_autograd(fw_compiler=lambda gm, _: make_boxed_func(gm.forward), bw_compiler=backward_compiler)


def _own_backward(out):
    return type(out.grad_fn)._forward_cls.__dict__["backward"]


def test_the_crash_record_is_on_disk_while_the_programs_backward_runs_and_only_then(tmp_path):
    seen: list = []
    compiled = torch.compile(_step, backend=reproarchive.capture(_recording_backend(tmp_path, seen), path=tmp_path))
    x, w = torch.randn(4, 8), torch.randn(8, 8, requires_grad=True)
    out = compiled(x, w)
    cls = type(out.grad_fn)._forward_cls
    assert kept(tmp_path) == []  # between the call and its backward: nothing stands for the graph
    out.sum().backward()
    assert seen == [["crash"]]  # the compiled backward ran once, with the crash record on disk
    assert kept(tmp_path) == []
    assert "backward" in cls.__dict__ and not _is_dispatcher(cls)  # the class's own backward back
    w_eager = w.detach().clone().requires_grad_(True)
    _step(x, w_eager).sum().backward()
    assert torch.allclose(w.grad, w_eager.grad)


def _is_dispatcher(cls) -> bool:
    return cls.__dict__["backward"].__func__.__module__ == backward_watch.__name__


def test_outputs_freed_without_a_backward_end_the_watch(tmp_path):
    from reproarchive.sources.capture import process_spool

    seen: list = []
    compiled = torch.compile(_step, backend=reproarchive.capture(_recording_backend(tmp_path, seen), path=tmp_path))
    out = compiled(torch.randn(4, 8), torch.randn(8, 8, requires_grad=True))
    cls = type(out.grad_fn)._forward_cls
    assert _is_dispatcher(cls)
    del out
    gc.collect()
    assert not _is_dispatcher(cls) and seen == [] and kept(tmp_path) == []
    spools = [s for (pid, folder), s in process_spool._spools.items() if pid == os.getpid() and folder == tmp_path]
    assert spools and all(not s._pending for s in spools)  # the entry is gone, not only set aside


def test_only_the_first_calls_backward_is_watched(tmp_path):
    seen: list = []
    compiled = torch.compile(_step, backend=reproarchive.capture(_recording_backend(tmp_path, seen), path=tmp_path))
    w = torch.randn(8, 8, requires_grad=True)
    first = compiled(torch.randn(4, 8), w)
    second = compiled(torch.randn(4, 8), w)  # the same graph, before the first call's backward
    second.sum().backward()
    assert seen == [[]]  # a later call's backward: unguarded, as every later call's is
    first.sum().backward()
    assert seen == [[], ["crash"]]


class _Scaled(torch.autograd.Function):
    fail = False

    @staticmethod
    def forward(ctx, x):
        return x * 3

    @staticmethod
    def backward(ctx, grad):
        if _Scaled.fail:
            raise ValueError("injected failure in a backward")
        return grad * 3


class _ScaledByVjp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 3

    @staticmethod
    def vjp(ctx, grad):
        return grad * 3


def test_a_watched_node_runs_the_guard_once_and_other_nodes_of_its_class_never():
    x = torch.randn(3, requires_grad=True)
    inputs = [x]
    watched, other = _Scaled.apply(x), _Scaled.apply(x)
    guarded, done = [], []

    def guard(run):
        guarded.append(1)
        return run()

    assert backward_watch.watch(watched, inputs, guard, lambda: done.append(1))
    other.sum().backward()
    assert guarded == [] and torch.equal(x.grad, torch.full((3,), 3.0))
    watched.sum().backward()
    assert guarded == [1] and done == [1] and torch.equal(x.grad, torch.full((3,), 6.0))
    assert not _is_dispatcher(_Scaled)


def test_a_guard_sees_the_backwards_exception_and_the_program_gets_it_unchanged():
    x = torch.randn(3, requires_grad=True)
    out, seen = _Scaled.apply(x), []

    def guard(run):
        try:
            return run()
        except ValueError as exc:
            seen.append(exc)
            raise

    assert backward_watch.watch(out, [x], guard, lambda: None)
    _Scaled.fail = True
    try:
        with pytest.raises(ValueError, match="injected failure in a backward") as info:
            out.sum().backward()
    finally:
        _Scaled.fail = False
    assert seen == [info.value]


def test_nothing_is_watched_where_the_engine_would_not_call_backward():
    x = torch.randn(3, requires_grad=True)
    assert not backward_watch.watch(_ScaledByVjp.apply(x), [x], lambda run: run(), lambda: None)
    assert not backward_watch.watch(x * 2, [x], lambda run: run(), lambda: None)  # PyTorch's own nodes
    upstream = _Scaled.apply(x)  # an input's own node is not the call's
    assert not backward_watch.watch(upstream * 2, [upstream], lambda run: run(), lambda: None)


_ABORTS_IN_BACKWARD = """
import os, sys, torch, reproarchive
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

def aborting(gm, example_inputs):
    def run(*args):
        os.abort()
    return make_boxed_func(run)

backend = aot_autograd(fw_compiler=lambda gm, _: make_boxed_func(gm.forward), bw_compiler=aborting)
torch.manual_seed(0)
x, w = torch.randn(4, 8), torch.randn(8, 8, requires_grad=True)
torch.save({"x": x, "w": w.detach()}, os.path.join(sys.argv[1], "..", "inputs.pt"))
out = torch.compile(lambda x, w: torch.relu(x @ w), backend=reproarchive.capture(backend, path=sys.argv[1]))(x, w)
print("forward passed", flush=True)
out.sum().backward()
"""


def test_a_native_crash_in_the_programs_backward_leaves_the_archive_of_its_first_call(tmp_path):
    folder = tmp_path / "archives"
    folder.mkdir()
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(_ABORTS_IN_BACKWARD), str(folder)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == -6, done.stderr[-2000:]  # the program died as it does without capture
    assert "forward passed" in done.stdout
    (archive,) = archives_after_death(folder)
    repro = reproarchive.load(archive)
    assert repro.records.failure.stage == "crash"
    saved = torch.load(tmp_path / "inputs.pt")
    assert torch.equal(repro.args[0], saved["x"]) and torch.equal(repro.args[1].detach(), saved["w"])


def test_a_crash_record_that_cannot_be_put_back_costs_the_record_not_the_backward(tmp_path, monkeypatch, caplog):
    from reproarchive.archive.spool import Spool

    def full(self, name, files):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Spool, "put", full)
    seen: list = []
    compiled = torch.compile(_step, backend=reproarchive.capture(_recording_backend(tmp_path, seen), path=tmp_path))
    w = torch.randn(8, 8, requires_grad=True)
    compiled(torch.randn(4, 8), w).sum().backward()
    assert w.grad is not None and seen == [[]]  # the backward ran, without its crash record
    assert "No space left on device" in caplog.text
