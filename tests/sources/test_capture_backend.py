"""The in-process capture backend: failures become archives, passing graphs are untouched.

Graphs are tiny and most tests use PyTorch's ``relu_*_TESTING_ONLY`` Dynamo backends, which cost
milliseconds; one test runs real inductor with its C++ bug injector (a few seconds).
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch._dynamo
import torch._inductor.config as inductor_config
from torch._dynamo.debug_utils import AccuracyError
from torch._dynamo.exc import BackendCompilerFailed

import reproarchive
from reproarchive.format.schema import CaptureSource
from reproarchive.sources.capture import capture_backend as capture_backend
from reproarchive.sources.capture import failure_archives
from reproarchive.sources.capture.capture_backend import CaptureWarning, archive_path
from reproarchive.testing.machine_paths import machine_paths_in
from reproarchive.testing.sources import Captured, SourceTests
from support.captures import kept
from support.later_call_backends import BrokenGrad

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def mutating_fn(x, y):
    x.add_(1)  # the graph mutates its input: the archive must hold the value from before
    return torch.relu(x * y).sum(0)


def plain_fn(x, y):
    return torch.relu(x * y) + y


def inputs():
    torch.manual_seed(0)
    return torch.randn(3, 4), torch.randn(3, 4, requires_grad=True)


def failing_call(fn, backend, tmp_path, **kw):
    x, y = inputs()
    x0, y0 = x.clone(), y.detach().clone()
    compiled = torch.compile(fn, backend=reproarchive.capture(backend, path=tmp_path, **kw))
    with pytest.raises(Exception) as info:
        compiled(x, y)
    return info.value, (x, y), (x0, y0)


def only_archive(tmp_path):
    found = sorted(tmp_path.glob("repro-*.tar.zst"))
    assert len(found) == 1, found
    return found[0]


# ------------------------------------------------------------------------------------------
# failures


def test_compile_error_is_archived_with_real_inputs_and_reraised(tmp_path):
    exc, (x, y), (x0, y0) = failing_call(mutating_fn, "relu_compile_error_TESTING_ONLY", tmp_path)
    path = only_archive(tmp_path)
    # the original exception comes back (Dynamo wraps it), with the path in its message
    assert isinstance(exc, torch._dynamo.exc.BackendCompilerFailed)
    assert type(exc.inner_exception).__name__ == "ReluCompileError"
    assert str(path) in str(exc)
    assert archive_path(exc) == str(path)

    repro = reproarchive.load(path)
    assert repro.records.failure.stage == "compile"
    assert repro.records.failure.exception_type.endswith("ReluCompileError")
    assert repro.records.backend == "relu_compile_error_TESTING_ONLY"
    assert repro.fidelity == ["real", "real"]
    assert torch.equal(repro.args[0], x0) and torch.equal(repro.args[1], y0)
    assert repro.args[1].requires_grad
    assert "torch.relu" in repro.gm.code and "add_" in repro.gm.code
    assert repro.records.source.kind == "capture"
    assert repro.records.config.modules["torch._inductor.config"]
    assert repro.records.environment.variables is not None
    assert repro.records.system.torch.version == torch.__version__


def test_failure_text_names_no_path_of_the_capturing_machine(tmp_path):
    """The in-process backend redacts its message and traceback like pack does: no absolute path
    of this machine (home, Python, site-packages, caches, temp, cwd) is left in them."""
    import os
    import sys
    import tempfile

    failing_call(mutating_fn, "relu_compile_error_TESTING_ONLY", tmp_path)
    failure = reproarchive.load(only_archive(tmp_path)).records.failure
    text = failure.message + "\n" + failure.traceback
    assert "site-packages" in failure.traceback or "<python>" in failure.traceback  # a real traceback
    for path in {os.path.expanduser("~"), sys.prefix, os.path.dirname(torch.__file__), tempfile.gettempdir(),
                 os.getcwd()}:
        if len(path) > 1:
            assert path + "/" not in text, path
    # nor anywhere else in the index: config values, environment values, the source record
    assert machine_paths_in(only_archive(tmp_path), tmp_path, os.getcwd()) == []


def test_runtime_error_archives_inputs_from_before_the_graph_ran(tmp_path):
    exc, (x, y), (x0, y0) = failing_call(mutating_fn, "relu_runtime_error_TESTING_ONLY", tmp_path)
    path = only_archive(tmp_path)
    # a runtime failure surfaces at the call, as without capture: same type, path added
    assert type(exc) is AssertionError
    assert "ReluRuntimeError" in str(exc) and str(path) in str(exc)
    assert exc.reproarchive_path == str(path)
    # the backend runs the graph itself (its rewrite of it), whose backward is PyTorch's: the
    # real call was the check, and wrote x as it does without capture before it failed; no
    # gradient reached the caller's tensors
    assert torch.equal(x, x0 + 1) and torch.equal(y.detach(), y0) and y.grad is None
    repro = reproarchive.load(path)
    assert repro.records.failure.stage == "forward"
    assert repro.records.failure.signature == "forward|AssertionError|ReluRuntimeError"
    assert repro.records.failure.inputs_modified == ()
    assert torch.equal(repro.args[0], x0)
    # the archived graph is the one Dynamo traced, not the backend's rewrite of it
    assert "torch.relu" in repro.gm.code and "_assert" not in repro.gm.code


def backward_bug_backend(gm, example_inputs):
    def run(*args):
        return tuple(BrokenGrad.apply(o) if isinstance(o, torch.Tensor) and o.requires_grad else o
                     for o in gm(*args))
    return run


def test_backward_failure_is_staged_as_backward_and_raised_where_the_program_runs_it(tmp_path):
    """The compiled backward fails in the program's own ``backward()``, as without capture: the
    forward call passes, and the archive holds the inputs as they were before it."""
    x, y = inputs()
    x0, y0 = x.clone(), y.detach().clone()
    compiled = torch.compile(plain_fn, backend=reproarchive.capture(backward_bug_backend, path=tmp_path))
    out = compiled(x, y)
    assert kept(tmp_path) == []
    with pytest.raises(RuntimeError, match="injected backward failure") as info:
        out.sum().backward()
    exc = info.value
    repro = reproarchive.load(only_archive(tmp_path))
    assert archive_path(exc) == str(only_archive(tmp_path))
    assert repro.records.failure.stage == "backward"
    assert "injected backward failure" in repro.records.failure.message
    assert repro.records.backend.endswith(":backward_bug_backend")  # importable module:function form
    assert torch.equal(repro.args[0], x0) and torch.equal(repro.args[1], y0)


def test_fwd_only_does_not_run_backward(tmp_path):
    x, y = inputs()
    compiled = torch.compile(plain_fn, backend=reproarchive.capture(backward_bug_backend, path=tmp_path, fwd_only=True))
    out = compiled(x, y)
    assert torch.allclose(out, plain_fn(x, y))
    assert kept(tmp_path) == []


def test_accuracy_failure_records_per_output_figures(tmp_path):
    exc, _, (x0, y0) = failing_call(plain_fn, "relu_accuracy_error_TESTING_ONLY", tmp_path, accuracy=True)
    path = only_archive(tmp_path)
    assert isinstance(exc, AccuracyError)
    assert str(path) in str(exc)
    repro = reproarchive.load(path)
    failure = repro.records.failure
    assert failure.stage == "accuracy" and repro.records.accuracy is True
    details = failure.accuracy
    assert details.passed is False and details.tolerance == pytest.approx(1e-3)
    out0 = details.outputs[0]
    assert out0.name == "output[0]" and out0.shape == (3, 4) and out0.dtype == "float32"
    assert out0.passed is False and out0.max_abs_error >= 1.0 - 1e-6  # relu -> x + 1
    assert out0.rmse_vs_fp64_compiled > out0.rmse_vs_fp64_eager
    assert any(o.name.startswith("grad of input") for o in details.outputs)
    assert torch.equal(repro.args[0], x0)


def test_accuracy_failure_can_warn_instead_of_raising(tmp_path):
    x, y = inputs()
    backend = reproarchive.capture("relu_accuracy_error_TESTING_ONLY", path=tmp_path, accuracy=True,
                                   on_accuracy="warn", tolerance=1e-2)
    with pytest.warns(CaptureWarning, match="differs from eager"):
        torch.compile(plain_fn, backend=backend)(x, y)
    repro = reproarchive.load(only_archive(tmp_path))
    assert repro.records.failure.accuracy.tolerance == pytest.approx(1e-2)


def test_without_accuracy_a_wrong_result_is_not_a_failure(tmp_path):
    x, y = inputs()
    out = torch.compile(plain_fn, backend=reproarchive.capture("relu_accuracy_error_TESTING_ONLY", path=tmp_path))(x, y)
    assert not torch.allclose(out, plain_fn(x, y))  # the injected bug is there ...
    assert kept(tmp_path) == []  # ... but was not asked about


def test_real_inductor_cpp_bug_injector_accuracy(tmp_path):
    """Real inductor compile (a few seconds): the injected config is recorded as changed."""
    def fn(x):
        return torch.relu(x) * 2

    x = torch.randn(8)
    with inductor_config.patch({"cpp.inject_relu_bug_TESTING_ONLY": "accuracy"}):
        compiled = torch.compile(fn, backend=reproarchive.capture("inductor", path=tmp_path, accuracy=True))
        with pytest.raises(Exception) as info:
            compiled(x)
    path = only_archive(tmp_path)
    assert archive_path(info.value) == str(path)
    repro = reproarchive.load(path)
    assert repro.records.backend == "inductor" and repro.records.failure.stage == "accuracy"
    assert repro.records.config.changed["torch._inductor.config"]["cpp.inject_relu_bug_TESTING_ONLY"] == "accuracy"
    assert torch.equal(repro.args[0], x)


# ------------------------------------------------------------------------------------------
# passing graphs


def test_passing_graph_writes_nothing_and_matches_eager(tmp_path):
    x, y = inputs()
    xe, ye = x.clone(), y.detach().clone().requires_grad_(True)
    target = tmp_path / "out"
    # aot_eager: a real AOTAutograd training graph, whose backward compiles lazily in the check
    out = torch.compile(mutating_fn, backend=reproarchive.capture("aot_eager", path=target, accuracy=True))(x, y)
    expected = mutating_fn(xe, ye)
    assert torch.equal(out, expected)
    assert torch.equal(x, xe)  # the input mutation happened exactly once
    out.sum().backward()
    expected.sum().backward()
    assert torch.equal(y.grad, ye.grad)  # no gradient leaked from the check run
    assert kept(target) == []


def test_check_runtime_false_never_runs_the_graph(tmp_path):
    x, y = inputs()
    backend = reproarchive.capture("relu_runtime_error_TESTING_ONLY", path=tmp_path / "out", check_runtime=False)
    with pytest.raises(AssertionError, match="ReluRuntimeError") as info:
        torch.compile(plain_fn, backend=backend)(x, y)
    assert archive_path(info.value) is None and not (tmp_path / "out").exists()


def test_check_run_does_not_disturb_the_rng_stream(tmp_path):
    def noisy(x):
        return torch.nn.functional.dropout(x, 0.5, training=True) + torch.rand_like(x)

    x = torch.ones(16)
    results = []
    for backend in (reproarchive.capture("eager", path=tmp_path), "eager"):
        torch._dynamo.reset()
        torch.manual_seed(123)
        out = torch.compile(noisy, backend=backend)(x)
        results.append((out, torch.rand(4)))
    (out_c, after_c), (out_e, after_e) = results
    assert torch.equal(out_c, out_e)
    assert torch.equal(after_c, after_e)


# ------------------------------------------------------------------------------------------
# where archives go, and what happens when writing fails


def test_file_target_and_default_directory(tmp_path, monkeypatch):
    target = tmp_path / "sub" / "mine.tar.zst"
    x, y = inputs()
    with pytest.raises(BackendCompilerFailed):
        torch.compile(plain_fn, backend=reproarchive.capture("relu_compile_error_TESTING_ONLY", path=target))(x, y)
    assert target.is_file()
    assert reproarchive.load(target).records.failure.stage == "compile"

    torch._dynamo.reset()
    monkeypatch.setenv("REPROARCHIVE_DIR", str(tmp_path / "from_env"))
    with pytest.raises(BackendCompilerFailed):
        torch.compile(plain_fn, backend=reproarchive.capture("relu_compile_error_TESTING_ONLY"))(x, y)
    assert len(list((tmp_path / "from_env").glob("repro-*.tar.zst"))) == 1

    torch._dynamo.reset()
    monkeypatch.delenv("REPROARCHIVE_DIR")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BackendCompilerFailed):
        torch.compile(plain_fn, backend=reproarchive.capture("relu_compile_error_TESTING_ONLY"))(x, y)
    assert len(list((tmp_path / "reproarchives").glob("repro-*.tar.zst"))) == 1


def test_a_failing_write_never_hides_the_original_error(tmp_path, monkeypatch):
    """The archive cannot be written from the inputs after the failure: it comes from the first
    call's spool entry (its inputs as they were before the call), and where that fails too,
    the user's own error says that no archive was written."""
    from reproarchive.sources.capture.process_spool import ProcessSpool

    def broken_write(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(failure_archives, "write_archive", broken_write)
    exc, _, _ = failing_call(plain_fn, "relu_runtime_error_TESTING_ONLY", tmp_path / "spooled")
    assert type(exc) is AssertionError and "ReluRuntimeError" in str(exc)
    assert archive_path(exc) is not None and set(reproarchive.load(archive_path(exc)).fidelity) == {"real"}
    monkeypatch.setattr(ProcessSpool, "keep", broken_write)
    exc, _, _ = failing_call(plain_fn, "relu_runtime_error_TESTING_ONLY", tmp_path / "none")
    assert type(exc) is AssertionError
    assert "ReluRuntimeError" in str(exc)
    assert "no archive written: OSError: disk full" in str(exc)
    assert archive_path(exc) is None


def test_records_passed_to_pack(tmp_path, monkeypatch):
    seen = {}

    def recording_write(gm, inputs, destination, **kwargs):
        seen.update(kwargs, gm=gm, inputs=inputs, destination=destination)
        destination.write_bytes(b"stub")
        return destination

    monkeypatch.setattr(failure_archives, "write_archive", recording_write)
    failing_call(mutating_fn, "relu_runtime_error_TESTING_ONLY", tmp_path, tolerance=0.5)
    assert seen["destination"].parent == tmp_path
    assert seen["destination"].name.startswith("repro-") and seen["destination"].name.endswith(".tar.zst")
    assert seen["backend"] == "relu_runtime_error_TESTING_ONLY" and seen["accuracy"] is False
    assert seen["failure"].stage == "forward" and seen["failure"].backend == seen["backend"]
    assert seen["capture_settings"]["tolerance"] == 0.5
    assert [n.op for n in seen["gm"].graph.nodes].count("placeholder") == len(seen["inputs"])


def test_options_are_checked_and_the_public_name_stays_a_function():
    with pytest.raises(TypeError, match="unknown option"):
        reproarchive.capture("eager", fwd_onyl=True)
    with pytest.raises(ValueError):
        reproarchive.capture("eager", on_accuracy="ignore")
    with pytest.raises(ValueError):
        reproarchive.capture("eager", mode="max-autotune")
    # importing the module (done at the top of this file) must not shadow the function
    backend = reproarchive.capture("eager")
    assert backend.__name__ == "capture(eager)"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        inductor_backend = reproarchive.capture("inductor", mode="max-autotune-no-cudagraphs")
    assert inductor_backend.config_patches.get("max_autotune") is True


# ------------------------------------------------------------------------------------------
# the contract of every source


class TestBackendSource(SourceTests):
    """The in-process capture backend, on a compile error from PyTorch's bug injector."""

    source_record = CaptureSource
    stage = "compile"

    @pytest.fixture(scope="module")
    def captured(self, tmp_path_factory) -> Captured:
        folder = tmp_path_factory.mktemp("backend_source")
        torch._dynamo.reset()
        backend = reproarchive.capture("relu_compile_error_TESTING_ONLY", path=folder)
        with pytest.raises(BackendCompilerFailed):
            torch.compile(mutating_fn, backend=backend)(*inputs())
        torch._dynamo.reset()
        return Captured(archives=sorted(folder.glob("repro-*.tar.zst")), reports=backend.reports, folders=(folder,))


@pytest.mark.parametrize("program_gc", ["on", "off"])
def test_the_collector_is_paused_for_captures_own_work_only_and_left_as_the_program_set_it(tmp_path, monkeypatch,
                                                                                           program_gc):
    """(27.1) Capture's fake run (the inputs a graph writes) runs with the cyclic collector
    paused (a full collection it would trigger costs 0.3-0.45 s after Dynamo's imports:
    ``sources.capture.gc_pause``); the backend's compile and the calls run as the program set it, and
    it is as the program set it afterwards, on or off."""
    import gc

    from reproarchive.sources.capture import call_guard

    seen = {}
    real_writes = call_guard.written_inputs

    def written_inputs(gm, args):
        seen["analysis"] = gc.isenabled()
        return real_writes(gm, args)

    def inner(gm, example_inputs):
        seen["compile"] = gc.isenabled()
        return gm.forward

    monkeypatch.setattr(call_guard, "written_inputs", written_inputs)
    was_on = gc.isenabled()
    (gc.enable if program_gc == "on" else gc.disable)()
    try:
        x, w = torch.randn(4, 64), torch.randn(64, 256)
        out = torch.compile(lambda a, b: torch.relu(a @ b), backend=reproarchive.capture(inner, path=tmp_path))(x, w)
        after = gc.isenabled()
    finally:
        (gc.enable if was_on else gc.disable)()
    assert torch.equal(out, torch.relu(x @ w))
    assert seen == {"analysis": False, "compile": program_gc == "on"} and after == (program_gc == "on")


@pytest.mark.parametrize("backend", ["aot_eager", "eager"])
def test_a_first_call_whose_backward_is_compiled_forks_no_writer(tmp_path, monkeypatch, backend):
    """(27.1) A graph whose backward is compiled (``aot_eager``; lazily, in the program's first
    ``backward()``, seconds with Inductor): the spool's thread, unfinished, is not handed to a
    forked writer alive through that compile (every page the compile writes would be copied for
    it). The entry is finished before the call, and no check runs: the call is the check, its
    backward watched. A backend that runs the graph itself (``eager``) forks its writer: its
    first call waits for nothing."""
    import threading

    from reproarchive.archive.spool import Spool, Stopped
    from reproarchive.sources.capture import snapshot_writer

    real_hash, checks = Spool.hash, []

    def hash_(self, draft, stop=None, *args, **kwargs):
        if threading.current_thread().name.startswith("reproarchive-spool-low"):
            while not stop():  # a thread that never finishes before it is told to stop
                threading.Event().wait(0.002)
            raise Stopped
        return real_hash(self, draft, stop, *args, **kwargs)

    real_check, real_start, forks = capture_backend._CaptureBackend._run_check, snapshot_writer.start, []
    monkeypatch.setattr(Spool, "hash", hash_)
    monkeypatch.setattr(snapshot_writer, "start", lambda *a, **k: forks.append(1) or real_start(*a, **k))
    monkeypatch.setattr(capture_backend._CaptureBackend, "_run_check",
                        lambda self, *a, **k: checks.append(1) or real_check(self, *a, **k))
    x, w = torch.randn(4, 64), torch.randn(64, 256, requires_grad=True)
    out = torch.compile(lambda a, b: torch.relu(a @ b), backend=reproarchive.capture(backend, path=tmp_path))(x, w)
    out.sum().backward()
    assert torch.equal(out, torch.relu(x @ w)) and w.grad is not None
    assert (checks, forks) == ([], [] if backend == "aot_eager" else [1])
    # no archive, no entry (a hidden half-written index of the killed writer's may stay until exit)
    assert not list(tmp_path.glob("*.tar.zst")) and not list(tmp_path.glob("spool-*/pending/[!.]*"))


@pytest.mark.parametrize("checked_before", [False, True], ids=["call-is-its-own-check", "check-before-the-call"])
def test_a_failure_that_leaves_the_inputs_unreadable_is_archived_from_the_spool(tmp_path, monkeypatch, checked_before):
    """(27.5) A device-side assert fails every later use of the device: the failing first call's
    inputs can no longer be read to write its archive. Its spool entry holds them as they were
    before the call: the archive comes from there, with the failure the program saw, and the
    weights the device could no longer give are stored as absent. (CPU storages here, told to
    take the device's path and to fail as the device's would once the assert has fired.)"""
    import threading

    from reproarchive.archive.spool import Spool
    from reproarchive.sources.capture import process_spool, snapshot_writer

    assert_fired = threading.Event()
    message = "CUDA error: device-side assert triggered"
    monkeypatch.setattr(snapshot_writer, "can_fork", lambda storages, inputs_copied: False)
    monkeypatch.setattr(process_spool, "FIRST_BYTES", 4096)
    real_write, real_archive = Spool.write, failure_archives.write_archive

    def write(self, todo, stop=None):
        if any(storage.nbytes() > 4096 for _, storage in todo):  # the weights: read after the assert
            assert_fired.wait(10)
            raise RuntimeError(message)
        return real_write(self, todo, stop)

    def write_archive(*args, **kwargs):
        if assert_fired.is_set():
            raise RuntimeError(message)
        return real_archive(*args, **kwargs)

    monkeypatch.setattr(Spool, "write", write)
    monkeypatch.setattr(failure_archives, "write_archive", write_archive)

    def asserting(gm, example_inputs):
        def run(*args):
            assert_fired.set()
            raise RuntimeError(message)
        return run

    x, w = torch.randn(4, 64), torch.randn(64, 256, requires_grad=checked_before)  # 1 KiB, 64 KiB
    with pytest.raises(RuntimeError, match="device-side assert"):  # the program's own error
        torch.compile(lambda a, b: torch.relu(a @ b), backend=reproarchive.capture(asserting, path=tmp_path))(x, w)
    (archive,) = tmp_path.glob("*.tar.zst")
    reproarchive.verify(archive)
    repro = reproarchive.load(archive)
    assert repro.fidelity == ["real", "absent"] and torch.equal(repro.args[0], x)
    failure = repro.records.failure
    assert failure.stage == "forward" and failure.exception_type == "RuntimeError" and message in failure.message
    assert machine_paths_in(archive, tmp_path) == []  # the failure's traceback redacted as any record
    assert not list(tmp_path.glob("spool-*/pending/*"))  # the entry became the archive
