"""The capture backend's call wrapper: every call covered, and nothing copied that the graph does
not write.

The backends are the custom functions of ``support.later_call_backends`` (compiled code that
fails on some calls only) and Dynamo's ``eager``: milliseconds per graph.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

import reproarchive
from reproarchive.replay import input_writes
from reproarchive.sources.capture.capture_backend import archive_path
from support import later_call_backends

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def mutating_fn(x, w):
    x.mul_(2)  # the graph writes x, never w
    return torch.relu(x @ w)


def _archives(folder):
    return sorted(folder.glob("repro-*.tar.zst"))


# ------------------------------------------------------------------------------------------
# 27.1: copies of the written inputs only


def test_written_inputs_are_found_on_fake_tensors():
    seen = {}

    def keep(gm, example_inputs):
        seen["gm"], seen["args"] = gm, list(example_inputs)
        return gm.forward

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8))
    torch.compile(model, backend=keep)(torch.randn(4, 8))
    names = [n.name for n in seen["gm"].graph.nodes if n.op == "placeholder"]
    written = {names[i] for i in input_writes.written_inputs(seen["gm"], seen["args"])}
    # batch norm's running statistics (unannotated in its schema) and its counter; no weight
    assert written == {n for n in names if "buffers" in n}, names
    assert len(written) == 3


@pytest.mark.parametrize("spool", [True, False], ids=["first-call-is-the-check", "check-before-the-call"])
def test_a_written_input_is_archived_as_before_the_first_run_and_the_rest_never_copied(tmp_path, monkeypatch, spool):
    from torch._dynamo import utils as dynamo_utils

    copied: list[int] = []  # bytes of every tensor copied for a run or a snapshot
    clone_input = dynamo_utils.clone_input

    def counting_clone(t, *args, **kwargs):
        copied.append(t.untyped_storage().nbytes())
        return clone_input(t, *args, **kwargs)

    monkeypatch.setattr(dynamo_utils, "clone_input", counting_clone)
    seen_ptrs: list[dict] = []

    def recording_backend(gm, example_inputs):
        def run(*args):
            seen_ptrs.append({tuple(a.shape): a.data_ptr() for a in args})
            return gm(*args)
        return run

    x = torch.randn(4, 256)
    w = torch.randn(256, 256, requires_grad=True)  # 256 KiB: the "weights"
    x0 = x.clone()
    compiled = torch.compile(mutating_fn, backend=reproarchive.capture(recording_backend, path=tmp_path, spool=spool))
    compiled(x, w).sum().backward()
    if not spool:  # a whole archive before the first run: a check run before the call
        # the check ran on an alias of w (same data) and on a copy of x; the real call on both
        check, real = seen_ptrs
        assert check[(256, 256)] == real[(256, 256)] == w.data_ptr()
        assert check[(4, 256)] != x.data_ptr() and real[(4, 256)] == x.data_ptr()
        assert w.grad is not None and torch.equal(x, x0 * 2)  # the program's own effects, once
        # only x was ever copied (once for the check, once as the snapshot of the real call)
        assert copied == [x.untyped_storage().nbytes()] * 2, copied
        assert _archives(tmp_path) == []
        return
    # the first call was the check (its backward is PyTorch's or watched where it runs): one
    # run, on w and x themselves
    (real,) = seen_ptrs
    assert real[(256, 256)] == w.data_ptr() and real[(4, 256)] == x.data_ptr()
    assert w.grad is not None and torch.equal(x, x0 * 2)  # the program's own effects, once
    # only x was ever copied: once, the snapshot of it as it was before the call
    assert copied == [x.untyped_storage().nbytes()], copied
    assert _archives(tmp_path) == []


def test_the_archive_of_a_failing_first_call_holds_the_written_input_as_before(tmp_path):
    x = -torch.rand(4, 8) - 1  # a negative first element: the compiled code raises
    w = torch.randn(8, 8)
    x0 = x.clone()
    backend = reproarchive.capture(later_call_backends.fails_on_negative, path=tmp_path)
    with pytest.raises(RuntimeError, match="negative first element") as info:
        torch.compile(mutating_fn, backend=backend)(x, w)
    repro = reproarchive.load(archive_path(info.value))
    assert torch.equal(repro.args[0], x0) and torch.equal(repro.args[1], w)
    assert torch.equal(x, x0)  # the check failed on a copy; the real call never ran
    assert repro.records.backend == "support.later_call_backends:fails_on_negative"


# ------------------------------------------------------------------------------------------
# 25.4: every call


def test_a_static_graph_failing_on_its_third_call_leaves_an_archive_of_that_call(tmp_path):
    backend = reproarchive.capture(later_call_backends.fails_on_negative, path=tmp_path)
    compiled = torch.compile(mutating_fn, backend=backend)
    w = torch.randn(8, 8)
    for _ in range(2):
        compiled(torch.rand(4, 8) + 1, w)
    assert _archives(tmp_path) == []
    x = torch.rand(4, 8) + 1
    x[0, 0] = -3.0
    x0 = x.clone()
    with pytest.raises(RuntimeError, match="negative first element") as info:
        compiled(x, w)
    (archive,) = _archives(tmp_path)
    assert archive_path(info.value) == str(archive)
    repro = reproarchive.load(archive)
    assert repro.records.failure.stage == "forward"
    assert torch.equal(repro.args[0], x0)  # the written input as it was before the failing call
    assert repro.fidelity == ["real", "real"]
    outcome = reproarchive.run(archive, backend="support.later_call_backends:fails_on_negative")
    assert outcome.status == "reproduced", outcome


def test_dynamic_sizes_4_6_7_failing_at_7(tmp_path):
    backend = reproarchive.capture(later_call_backends.fails_on_size_7, path=tmp_path)
    compiled = torch.compile(lambda a: torch.relu(a).sum(0), backend=backend, dynamic=True)
    for n in (4, 6):
        compiled(torch.randn(n, 3))
    assert _archives(tmp_path) == []
    with pytest.raises(RuntimeError, match="size 7"):
        compiled(torch.randn(7, 3))
    (archive,) = _archives(tmp_path)
    repro = reproarchive.load(archive)
    assert [tuple(a.shape) for a in repro.args if isinstance(a, torch.Tensor)] == [(7, 3)]


def test_a_later_failure_that_cannot_be_archived_says_so(tmp_path, monkeypatch, capsys):
    from reproarchive.sources.capture import failure_archives

    compiled = torch.compile(mutating_fn, backend=reproarchive.capture(later_call_backends.fails_on_negative,
                                                                         path=tmp_path))
    w = torch.randn(8, 8)
    compiled(torch.rand(4, 8) + 1, w)

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(failure_archives, "write_archive", broken)
    with pytest.raises(RuntimeError, match="negative first element"):
        compiled(-torch.rand(4, 8) - 1, w)
    err = capsys.readouterr().err
    assert "call 2 of a compiled graph failed (RuntimeError) and was not archived: OSError: disk full" in err
    assert _archives(tmp_path) == []


def test_passing_calls_copy_nothing_when_the_graph_writes_nothing(tmp_path, monkeypatch):
    from torch._dynamo import utils as dynamo_utils

    compiled = torch.compile(lambda a, b: torch.relu(a @ b),
                             backend=reproarchive.capture("eager", path=tmp_path))
    a, b = torch.randn(4, 8), torch.randn(8, 8)
    compiled(a, b)  # the first call (its check) is done

    def no_copies(*args, **kwargs):
        raise AssertionError("a passing call copied an input")

    monkeypatch.setattr(dynamo_utils, "clone_input", no_copies)
    for _ in range(3):
        compiled(a, b)
