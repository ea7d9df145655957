"""Native crashes become archives, by every way of getting one, and replay in a child.

The crashes are real: Inductor's C++ bug injector (``cpp.inject_relu_bug_TESTING_ONLY =
"runtime_error"`` puts ``throw 1`` in the kernel; on a tensor large enough for the OpenMP loop
the throw ends in ``std::terminate``, SIGABRT) and a custom op that reads address 0 (SIGSEGV).
Each program runs in its own process, which dies; the test process looks at what it left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import reproarchive
from reproarchive.context.failure import crash_report, same_failure
from reproarchive.format.schema import FailureRecord
from reproarchive.sources.program import crash_guard
from reproarchive.testing.machine_paths import machine_paths_in
from support.captures import archives_after_death
from support.cli import invoke


def cli(*args) -> tuple[int, str]:
    result = invoke(*args)
    return result.exit_code, result.output

# A graph whose Inductor kernel aborts the process (the relu is the injected bug).
_ABORTING = """
import sys, torch
torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY = "runtime_error"

def f(a):
    return torch.relu(a + 1) * 2

x = torch.randn(1 << 16)
"""

# A custom op that dereferences address 0; aot_eager runs it as it is.
_SEGFAULTING = """
import ctypes, sys, torch

@torch.library.custom_op("crashtest::boom", mutates_args=())
def boom(x: torch.Tensor) -> torch.Tensor:
    ctypes.string_at(0)
    return x.clone()

@boom.register_fake
def _(x):
    return torch.empty_like(x)

def f(a):
    return boom(a.sin()) + 1

x = torch.randn(8)
"""


@pytest.fixture(autouse=True)
def _two_openmp_threads(monkeypatch):
    """Inductor's injected ``runtime_error`` throws inside the kernel's OpenMP loop: with one
    OpenMP thread the loop runs on the calling thread and the throw becomes a Python
    RuntimeError, not an abort. Every process these tests start (programs, dump and replay
    children) gets at least two, as ``reproarchive demo`` gives its crash program."""
    current = os.environ.get("OMP_NUM_THREADS", "")
    if not current.isdigit() or int(current) < 2:
        monkeypatch.setenv("OMP_NUM_THREADS", "2")


def _run(folder: Path, source: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "prog.py").write_text(textwrap.dedent(source))
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHDYNAMO_REPRO", "TORCH_COMPILE_DEBUG"))}
    full_env.update(env or {}, PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable, "prog.py", *args], cwd=folder, env=full_env, capture_output=True,
                          text=True, timeout=300)


def _only_archive(folder: Path) -> Path:
    found = archives_after_death(folder)  # in-process: a guardian completes the spool the death left
    assert len(found) == 1, found
    return found[0]


# --------------------------------------------------------------------------------------------
# the in-process backend: the archive is on disk before the compiled code runs


def test_backend_leaves_a_verifying_archive_when_the_kernel_aborts(tmp_path):
    prog = _ABORTING + ("print(torch.compile(f, backend=__import__('reproarchive')"
                        ".capture('inductor', path=sys.argv[1]))(x))\n")
    done = _run(tmp_path / "job", prog, str(tmp_path / "archives"))
    assert done.returncode == -signal.SIGABRT, done.stderr[-2000:]
    archive = _only_archive(tmp_path / "archives")
    reproarchive.verify(archive)  # raises on any defect
    recorded = reproarchive.load(archive).records.failure
    # written before the kernel ran; the guardian learned the signal from faulthandler's report,
    # where there was one: a second worker's abort can end the process before faulthandler has
    # written (see below), and then the signal stays unknown, never a wrong one
    assert recorded.stage == "crash" and recorded.exception_type in ("SIGABRT", "")
    assert "written just before it ran" in recorded.message
    if recorded.exception_type:
        assert "died by SIGABRT" in recorded.message
        assert "died by SIGABRT in a compiled graph's first call" in done.stderr
    assert machine_paths_in(archive, tmp_path) == []

    # `run` replays it in a child by default: the caller survives, the exit code stays below 128
    code, out = cli("run", "--json", archive)
    report = json.loads(out)
    assert code == 1 and report["status"] == "reproduced" and report["isolated"] is True
    observed = report["observed"]
    assert observed["stage"] == "crash" and observed["exception_type"] == "SIGABRT"
    # Several OpenMP workers throw at once: their lines interleave, and the second abort can end
    # the process while faulthandler is still writing (test_run_reports_the_crashing_threads_stack
    # checks the stack on a crash with one writer). What is always there:
    assert "terminate called" in observed["message"] + observed["traceback"]


_ABORTING_BACKEND = """
import os
import torch

def abort_on_relu(gm, example_inputs):
    if any(n.target is torch.relu for n in gm.graph.nodes):
        os.abort()
    return gm
"""


def test_run_reports_the_crashing_threads_stack(tmp_path, monkeypatch):
    """A compiler that aborts on the main thread, one writer: the report is faulthandler's
    "Current thread" stack, down to the compiler's frame, and no other thread's."""
    import torch

    (tmp_path / "aborting_backend.py").write_text(_ABORTING_BACKEND)
    monkeypatch.syspath_prepend(str(tmp_path))
    gm = torch.fx.symbolic_trace(lambda x: torch.relu(x.sin()))
    archive = reproarchive.pack(gm, [torch.randn(4)], tmp_path / "a.tar.zst",
                                backend="aborting_backend:abort_on_relu", snapshot=False)
    # no failure recorded: replayed in a child by default
    outcome = reproarchive.run(archive, backend="aborting_backend:abort_on_relu")
    assert outcome.isolated and outcome.observed.stage == "crash" and outcome.observed.exception_type == "SIGABRT"
    stack = outcome.observed.traceback.splitlines()
    assert stack[0] == "Fatal Python error: Aborted" and stack[1].startswith("Current thread 0x")
    assert stack[2].endswith("in abort_on_relu")  # innermost first: the frame that aborted
    assert all(line.startswith("  File ") for line in stack[2:])
    assert outcome.exit_code < 128


def test_backend_archive_of_a_segfaulting_custom_op(tmp_path):
    prog = _SEGFAULTING + ("print(torch.compile(f, backend=__import__('reproarchive')"
                           ".capture('aot_eager', path=sys.argv[1]))(x))\n")
    done = _run(tmp_path / "job", prog, str(tmp_path / "archives"))
    assert done.returncode == -signal.SIGSEGV, done.stderr[-2000:]
    archive = _only_archive(tmp_path / "archives")
    reproarchive.verify(archive)
    summary = reproarchive.inspect(archive).to_plain()
    assert summary["failure"]["stage"] == "crash"
    assert "crashtest.boom" in json.dumps(summary["graph"]["op_histogram"])


def test_backend_removes_the_pending_archive_when_nothing_crashes(tmp_path):
    import torch

    def backend(gm, example_inputs):
        return gm.forward

    compiled = torch.compile(lambda a: a.sin() + 1, backend=reproarchive.capture(backend, path=tmp_path / "a"))
    compiled(torch.randn(4))
    compiled(torch.randn(4))
    assert list((tmp_path / "a").glob("*.tar.zst")) == []


# --------------------------------------------------------------------------------------------
# pack: the replay that records the failure crashes


def test_pack_records_the_crash_of_its_replay(tmp_path, monkeypatch):
    # PyTorch's own dump writer, called directly, on the aborting graph and its real input; in
    # this process (nothing crashes here: the graph runs eagerly), with what the aborting program
    # sets (the injected bug) and where TORCH_COMPILE_DEBUG_DIR would send the dump
    import torch
    import torch._dynamo
    from torch._dynamo.repro.after_dynamo import dump_to_minify_after_dynamo

    monkeypatch.setattr(torch._inductor.config.cpp, "inject_relu_bug_TESTING_ONLY", "runtime_error")
    monkeypatch.setattr(torch._dynamo.config, "debug_dir_root", str(tmp_path / "dbg" / "torch_compile_debug"))

    def f(a):
        return torch.relu(a + 1) * 2

    def backend(gm, example_inputs):
        dump_to_minify_after_dynamo(gm, example_inputs, "inductor")
        return gm.forward

    torch._dynamo.reset()
    try:
        torch.compile(f, backend=backend)(torch.randn(1 << 16))
    finally:
        torch._dynamo.reset()
    (launcher,) = (tmp_path / "dbg").glob("torch_compile_debug/run_*/minifier/minifier_launcher.py")

    code, out = cli("pack", "--json", launcher, "-o", tmp_path / "crash.tar.zst")
    assert code == 0, out
    failure = json.loads(out)["failure"]
    assert failure["stage"] == "crash" and failure["exception_type"] == "SIGABRT"
    record = reproarchive.load(tmp_path / "crash.tar.zst").records.failure
    assert "terminate called" in record.message + record.traceback

    # packed without the replay, `run` still replays it in a child: the caller is not killed
    code, out = cli("pack", launcher, "--no-replay", "-o", tmp_path / "unknown.tar.zst")
    assert code == 0, out
    outcome = reproarchive.run(tmp_path / "unknown.tar.zst")
    assert outcome.isolated and outcome.observed.stage == "crash" and outcome.exit_code == 1


# --------------------------------------------------------------------------------------------
# capture --: PyTorch's hooks write nothing for a native crash, the crash guard does


def test_capture_program_packs_the_graph_it_crashed_in(tmp_path):
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "prog.py").write_text(textwrap.dedent(_ABORTING) + "print(torch.compile(f)(x))\n")
    out = tmp_path / "archives"
    out.mkdir()
    code, text = cli("capture", "--after", "aot", "-o", out, "--json", "--", sys.executable, folder / "prog.py")
    assert code == 128 + signal.SIGABRT, text  # the program's own exit status
    report = json.loads(text)
    (packed,) = report["archives"]
    assert packed["failure"]["stage"] == "crash" and packed["failure"]["exception_type"] == "SIGABRT"
    archive = Path(packed["archive"])
    assert [p.name for p in out.iterdir()] == [archive.name]
    reproarchive.verify(archive)
    repro = reproarchive.load(archive)
    assert repro.fidelity == ["real"] and repro.records.backend == "inductor"
    assert "the program was killed by SIGABRT" in repro.records.failure.message
    assert machine_paths_in(archive, folder) == []
    assert "terminate called" in repro.records.failure.message + repro.records.failure.traceback


def test_capture_does_not_change_how_the_program_ends(tmp_path):
    """Plain ``capture --`` (PyTorch's after_dynamo hook): the kernel aborts the program as it
    would without capture (134), not ``BackendCompilerFailed`` from the hook's own run inside
    the backend (exit 1), and the graph it died in is archived."""
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "prog.py").write_text(textwrap.dedent(_ABORTING) + "print(torch.compile(f)(x))\n")
    out = tmp_path / "archives"
    cli_main = [sys.executable, "-c", "from reproarchive.cli import main; main()"]
    done = subprocess.run([*cli_main, "capture", "-o", str(out), "--json", "--", sys.executable, "prog.py"],
                          cwd=folder, capture_output=True, text=True, timeout=300)
    assert done.returncode == 128 + signal.SIGABRT, done.stderr[-3000:]
    assert "BackendCompilerFailed" not in done.stderr and "Traceback" not in done.stderr
    (packed,) = json.loads(done.stdout)["archives"]
    assert packed["failure"]["stage"] == "crash" and packed["failure"]["exception_type"] == "SIGABRT"


_ABORTS_ON_A_LATER_CALL = """
import os, torch

@torch.library.custom_op("crashtest::checked", mutates_args=())
def checked(x: torch.Tensor) -> torch.Tensor:
    if float(x.sum()) > 100:
        os.abort()  # a native crash on the data of one call: the third
    return x.clone()

checked.register_fake(lambda x: torch.empty_like(x))

@torch.compile(backend="eager")
def f(x):
    return torch.ops.crashtest.checked(x.relu() * 2) + 1

for scale in (1.0, 2.0, 100.0):
    f(torch.ones(4) * scale)
"""


def test_a_crash_in_a_later_call_is_named_by_the_call_it_died_in(tmp_path):
    """Only a graph's compile and first call are guarded against a crash; a crash in its third
    call left nothing, and capture said "PyTorch wrote no repro dump (the failure was not
    inside a compiler backend)". Each later call marks itself, so capture names the call and
    the graph, and says why no archive covers it."""
    (tmp_path / "prog.py").write_text(_ABORTS_ON_A_LATER_CALL)
    cli_main = [sys.executable, "-c", "from reproarchive.cli import main; main()"]
    done = subprocess.run([*cli_main, "capture", "-o", "out", "--", sys.executable, "prog.py"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 128 + signal.SIGABRT, done.stderr[-3000:]
    assert ("the program was killed by SIGABRT (exit 134) in call 3 of the graph compiled as [0/0] (prog.py:14 in f), "
            "and nothing was archived") in done.stderr, done.stderr[-3000:]
    assert "not inside a compiler backend" not in done.stderr
    quiet = subprocess.run([*cli_main, "capture", "--json", "-o", "out", "--", sys.executable, "prog.py"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=300)
    report = json.loads(quiet.stdout)
    assert report["crashed_in"] == ["call 3 of the graph compiled as [0/0] (prog.py:14 in f)"], report
    assert report["archives"] == [] and not list((tmp_path / "out").iterdir())


def test_the_in_process_backend_s_guardian_names_the_later_call_a_crash_died_in(tmp_path):
    """The same crash under ``reproarchive.capture(...)``: the first call's spool entry is gone
    by the third call, so the guardian found nothing and said nothing. The later calls mark
    themselves in the spool, and the guardian names the one the process died in."""
    program = _ABORTS_ON_A_LATER_CALL.replace('@torch.compile(backend="eager")',
                                              'import reproarchive\n'
                                              '@torch.compile(backend=reproarchive.capture("eager", path="out"))')
    (tmp_path / "prog.py").write_text(program)
    done = subprocess.run([sys.executable, "prog.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGABRT, done.stderr[-3000:]
    assert archives_after_death(tmp_path / "out") == []
    assert (" died by SIGABRT in call 3 of the graph compiled as [0/0] (prog.py:15 in f), and nothing was "
            "archived") in done.stderr, done.stderr[-3000:]


# --------------------------------------------------------------------------------------------
# reading faulthandler's report


def test_crash_report_keeps_the_crashing_threads_stack_only(tmp_path):
    script = tmp_path / "die.py"
    script.write_text(textwrap.dedent("""
        import os, threading, time
        def monitor():
            while True:
                time.sleep(0.05)
        threading.Thread(target=monitor, daemon=True).start()
        time.sleep(0.1)
        def crashing_frame():
            os.abort()
        crashing_frame()
    """))
    done = subprocess.run([sys.executable, "-X", "faulthandler", str(script)], capture_output=True, text=True)
    assert done.returncode == -signal.SIGABRT
    native, stack = crash_report(done.stderr + "\nExtension modules: a, b, c (total: 3)\n")
    assert stack.splitlines()[0] == "Fatal Python error: Aborted"
    assert "in crashing_frame" in stack and "in monitor" not in stack and "Extension" not in stack


def test_crash_report_without_a_current_thread_and_with_interleaved_output():
    # a kernel's OpenMP worker aborted: faulthandler knows no "Current thread"; the C++ runtime
    # and faulthandler wrote at once
    output = textwrap.dedent("""\
        /x/functional_tensor.py:368: UserWarning: Failed to initialize NumPy
          cpu = _conversion_method_template(device=torch.device("cpu"))
        terminate called after throwing an instance of 'Fatal Python error: intAborted
        '

        Thread 0x00007f1 (most recent call first):
          File "/usr/lib/python3.11/threading.py", line 331 in wait
          File "/usr/lib/python3.11/threading.py", line 1045 in _bootstrap_inner

        Thread 0x00007f3 (most recent call first):
          Fileterminate called recursively

        Thread 0x00007f2 (most recent call first):
          File "/tmp/torchinductor/kernel.py", line 88 in call
        terminate called recursively
          File "prog.py", line 5 in <module>

        Extension modules: torch._C (total: 1)
    """)
    native, stack = crash_report(output)
    assert native == ["terminate called after throwing an instance of '"]
    assert "kernel.py" in stack and "threading.py" not in stack and "main thread" in stack
    assert stack.splitlines()[-1].endswith("in <module>") and "recursively" not in stack


def test_crash_report_finds_the_runtimes_words_above_a_long_backtrace():
    # c10::Error's text carries its C++ backtrace: more lines than the runtime's last words
    # window, ending in a blank line, before faulthandler's report
    frames = "\n".join(f"frame #{i}: 0x7f{i:04x} in libtorch_cpu.so" for i in range(30))
    output = ("terminate called after throwing an instance of 'c10::Error'\n"
              "  what():  relu bug injected\nException raised from kernel at /tmp/k.cpp:3\n"
              f"{frames}\n\nterminate called recursively\n\nFatal Python error: Aborted\n\n"
              'Current thread 0x00007f1 (most recent call first):\n  File "prog.py", line 5 in <module>\n')
    native, stack = crash_report(output)
    assert native[0] == "terminate called after throwing an instance of 'c10::Error'"
    assert "  what():  relu bug injected" in native and len(native) <= 6
    assert stack.splitlines()[-1].endswith("in <module>")


def test_crash_report_leaves_out_torchs_own_log_lines():
    # a CUDA build of torch on a machine without the GPU logs at import (torch 2.15's wheel):
    # the native runtime's last words are the C++ runtime's, not that line
    output = ("W1128 21:38:22.732000 4691 torch/utils/cpp_extension.py:183] No CUDA runtime is found, "
              "using CUDA_HOME='/usr/local'\n"
              "terminate called after throwing an instance of 'int'\n\nFatal Python error: Aborted\n\n"
              'Current thread 0x00007f1 (most recent call first):\n  File "prog.py", line 5 in <module>\n')
    native, _ = crash_report(output)
    assert native == ["terminate called after throwing an instance of 'int'"]


def test_a_crash_recorded_before_its_signal_matches_any_crash():
    from reproarchive.context.failure import crash_record, pending_crash_record

    pending = pending_crash_record(backend="inductor")
    assert same_failure(pending, crash_record("SIGSEGV", "died", ""))
    assert not same_failure(pending, FailureRecord(stage="forward", exception_type="RuntimeError",
                                                   signature="forward|RuntimeError|x"))
    assert not same_failure(crash_record("SIGABRT", "died", ""), crash_record("SIGSEGV", "died", ""))


def test_pack_of_a_trace_log_records_the_crash_of_its_replay(tmp_path):
    """A TORCH_TRACE job that died in compiled code: the log says the compile succeeded; named
    with --compile-id and --backend, its replay kills the child, and the archive says so."""
    prog = _ABORTING + "print(torch.compile(f)(x))\n"
    done = _run(tmp_path / "job", prog, env={"TORCH_TRACE": str(tmp_path / "trace")})
    assert done.returncode == -signal.SIGABRT, done.stderr[-2000:]
    code, out = cli("pack", "--json", tmp_path / "trace", "--compile-id", "0/0", "--backend", "inductor",
                    "-o", tmp_path / "crash.tar.zst")
    assert code == 0, out
    record = reproarchive.load(tmp_path / "crash.tar.zst").records.failure
    assert record.stage == "crash" and record.exception_type == "SIGABRT"
    assert "terminate called" in record.message + record.traceback
    assert machine_paths_in(tmp_path / "crash.tar.zst", tmp_path) == []


@pytest.mark.parametrize("requires_grad", [True, False], ids=["backward-compiled-later", "no-backward"])
def test_capture_cli_hook_finishes_the_entry_of_a_call_with_a_compiled_backward_and_forks_no_writer(
        tmp_path, monkeypatch, requires_grad):
    """(27.1) Under ``capture --`` (PyTorch's after_dynamo hook, run at the first call by the
    crash guard), a first call whose backward is compiled (``aot_eager``, an output that
    requires grad; compiled in the program's own ``backward()``, watched there) has its spool
    entry finished before it: no writer is forked to live through that backward's compile. One
    with no backward (nothing requires grad) forks its writer and waits for nothing. The
    spool's thread is kept unfinished here."""
    import threading

    import torch
    import torch._dynamo

    from reproarchive.archive.spool import Spool, Stopped
    from reproarchive.sources.capture import first_call, snapshot_writer

    real_hash, real_start, forks = Spool.hash, snapshot_writer.start, []

    def hash_(self, draft, stop=None, *args, **kwargs):
        if threading.current_thread().name.startswith("reproarchive-spool-low"):
            while not stop():
                threading.Event().wait(0.002)
            raise Stopped
        return real_hash(self, draft, stop, *args, **kwargs)

    _guard_this_process(monkeypatch, tmp_path)
    monkeypatch.setattr(Spool, "hash", hash_)
    monkeypatch.setattr(snapshot_writer, "start", lambda *a, **k: forks.append(1) or real_start(*a, **k))
    torch._dynamo.reset()
    x, w = torch.randn(4, 64), torch.randn(64, 256, requires_grad=requires_grad)
    out = torch.compile(lambda a, b: torch.relu(a @ b), backend="aot_eager")(x, w)
    torch._dynamo.reset()
    assert torch.equal(out, torch.relu(x @ w)) and forks == ([] if requires_grad else [1])
    assert first_call.spool().spool.names() == []  # no entry left (a killed writer's is gone)


def _guard_this_process(monkeypatch, tmp_path) -> None:
    """This process set up as ``capture --`` sets up its program (the crash guard on Dynamo's
    door, PyTorch's after_dynamo hook at level 2), given back after the test."""
    import torch
    from torch._dynamo.repro import after_dynamo

    from reproarchive.sources.program import crash_guard

    cls = after_dynamo.WrapBackendDebug
    monkeypatch.setattr(cls, "__call__", cls.__call__)
    monkeypatch.setattr(cls, "_reproarchive_guarded", False, raising=False)
    crash_guard._patch(after_dynamo)
    monkeypatch.setenv(crash_guard.CRASH_DIR_ENV, str(tmp_path / "crash"))
    monkeypatch.setattr(torch._dynamo.config, "repro_after", "dynamo")
    monkeypatch.setattr(torch._dynamo.config, "repro_level", 2)
    monkeypatch.setattr(torch._dynamo.config, "debug_dir_root", str(tmp_path / "debug"))


def test_capture_cli_hook_dumps_a_failing_compiled_backward_where_the_program_runs_it(tmp_path, monkeypatch):
    """Under ``capture --`` a compiled backward that fails fails in the program's own
    ``backward()``, as without capture (PyTorch's own hook would raise it inside the compile),
    and PyTorch's dump of the graph's first call is written then; the spool entry of that call
    is on disk while its backward runs, and not between the call and the backward. That entry
    is kept as the failure's archive (stage backward), with the generator states the call
    started from, which PyTorch's dump lacks; the dump it supersedes is named beside it."""
    import torch
    import torch._dynamo
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    from reproarchive.sources.capture import first_call

    _guard_this_process(monkeypatch, tmp_path)
    entries = []

    def failing_backward(gm, example_inputs):
        def run(*args):
            entries.append(first_call.spool().spool.names())
            raise RuntimeError("injected failure in the compiled backward")
        return make_boxed_func(run)

    backend = aot_autograd(fw_compiler=lambda gm, _: make_boxed_func(gm.forward), bw_compiler=failing_backward)
    torch._dynamo.reset()
    try:
        a, b = torch.randn(4, 8), torch.randn(8, 8, requires_grad=True)
        started = torch.get_rng_state()
        out = torch.compile(lambda a, b: torch.nn.functional.dropout(torch.relu(a @ b), 0.5), backend=backend)(a, b)
        assert first_call.spool().spool.names() == []  # set aside between the call and its backward
        with pytest.raises(RuntimeError, match="injected failure in the compiled backward") as info:
            out.sum().backward()
    finally:
        torch._dynamo.reset()
    assert len(entries) == 1 and len(entries[0]) == 1  # on disk while the backward ran
    launcher = Path(info.value.minifier_path)
    assert launcher.name == "minifier_launcher.py" and launcher.is_file()
    assert tmp_path / "debug" in launcher.parents
    assert first_call.spool().spool.names() == []
    (kept,) = crash_guard.kept_archives(tmp_path)
    repro = reproarchive.load(kept)
    assert repro.records.failure.stage == "backward" and "injected failure" in repro.records.failure.message
    assert torch.equal(repro.rng_states["cpu"], started)
    assert crash_guard.dump_identity(launcher) in crash_guard.superseded_dumps(tmp_path)


def test_a_crash_under_a_custom_backend_leaves_an_archive_and_a_hint_that_works(tmp_path):
    """The graph a program crashed in under its own compiler function (``module:function``) is
    archived with the signal the program died of; capture does not import that module to replay
    it, and says how to: a ``run --backend`` that reproduces the crash."""
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "abk.py").write_text("import os\n\n\ndef aborting(gm, example_inputs):\n"
                                   "    return lambda *args: os.abort()\n")
    (folder / "prog.py").write_text("import torch\nimport abk\n\n"
                                    "torch.compile(lambda x: torch.relu(x) + 1, backend=abk.aborting)(torch.ones(8))\n")
    out = tmp_path / "archives"
    cli_main = [sys.executable, "-c", "from reproarchive.cli import main; main()"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([*cli_main, "capture", "-o", str(out), "--json", "--", sys.executable, "prog.py"],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 128 + signal.SIGABRT, done.stderr  # the program's own exit status
    (packed,) = json.loads(done.stdout)["archives"]
    archive = Path(packed["archive"])
    repro = reproarchive.load(archive)
    assert repro.records.backend == "abk:aborting" and repro.records.failure.exception_type == "SIGABRT"
    [hint] = [w for w in packed["warnings"] if "reproarchive run --backend abk:aborting" in w]
    command = hint[hint.index("reproarchive run"):].split()
    replayed = subprocess.run([*cli_main, *command[1:], "--json"], cwd=folder.parent, env=env,
                              capture_output=True, text=True, timeout=300)
    assert replayed.returncode == 1 and json.loads(replayed.stdout)["status"] == "reproduced", replayed.stdout
