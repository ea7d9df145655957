"""Failure records and the signature that decides "is this the same failure?"."""

from __future__ import annotations

from reproarchive.context.failure import fault_signal, signature


def test_signature_tells_dtypes_apart():
    a = signature("compile", "RuntimeError", "expected scalar type float16 but found float32")
    b = signature("compile", "RuntimeError", "expected scalar type float64 but found float32")
    assert a != b
    assert signature("compile", "E", "add_3 failed on buf12") == signature("compile", "E", "add_7 failed on buf3")


# --------------------------------------------------------------------------------------------
# compiler diagnostics: two different C++ errors are two different failures


def _cpp_compile_error(folder, source: str):
    """Inductor's CppCompileError around real g++ output for ``source``."""
    import subprocess

    from torch._inductor.exc import CppCompileError

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kernel.cpp").write_text(source)
    cmd = ["g++", "-Wall", "-c", str(folder / "kernel.cpp"), "-o", str(folder / "kernel.o")]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode != 0
    return CppCompileError(cmd, done.stderr)


_UNDECLARED = "int f(int x) { int unused = 1; return x + undeclared_name; }\n"
_MISSING_SEMICOLON = "int f(int x) { int unused = 1; return x }\n"


def test_cpp_compile_errors_are_told_apart_by_their_first_diagnostic(tmp_path):
    from reproarchive.context.failure import compiler_errors, record_from_exception, same_failure

    a = record_from_exception(_cpp_compile_error(tmp_path / "a", _UNDECLARED), "compile")
    a_again = record_from_exception(_cpp_compile_error(tmp_path / "elsewhere", _UNDECLARED), "compile")
    b = record_from_exception(_cpp_compile_error(tmp_path / "b", _MISSING_SEMICOLON), "compile")
    assert a.message.splitlines()[0] == "C++ compile error"
    assert "undeclared_name" in a.signature and "|diag:" in a.signature
    assert any("error:" in line and "undeclared_name" in line for line in compiler_errors(a.message))
    assert not any("warning" in line for line in compiler_errors(a.message))  # -Wall's unused warning
    assert same_failure(a, a_again)  # other folder, same error
    assert not same_failure(a, b)


def test_an_archive_signed_before_diagnostics_still_matches(tmp_path):
    import dataclasses

    from reproarchive.context.failure import DIAGNOSTIC_MARK, record_from_exception, same_failure

    observed = record_from_exception(_cpp_compile_error(tmp_path, _UNDECLARED), "compile")
    old = dataclasses.replace(observed, signature=observed.signature.split(DIAGNOSTIC_MARK)[0])
    assert same_failure(old, observed)
    assert not same_failure(observed, dataclasses.replace(observed, signature=old.signature + DIAGNOSTIC_MARK + "x"))


def test_a_type_a_log_names_without_its_module_matches_the_replay_s_qualified_one(tmp_path):
    """A TORCH_TRACE log names ``CppCompileError``; the replay raises
    ``torch._inductor.exc.CppCompileError``: the same failure (``run`` said DIFFERENT FAILURE)."""
    import dataclasses

    from reproarchive.context.failure import record_from_exception, same_failure

    observed = record_from_exception(_cpp_compile_error(tmp_path, _UNDECLARED), "compile")
    qualified = observed.exception_type
    assert "." in qualified

    def named(record, exc_type):
        return dataclasses.replace(record, exception_type=exc_type,
                                   signature=record.signature.replace(f"|{qualified}|", f"|{exc_type}|"))

    logged = named(observed, qualified.rpartition(".")[2])
    assert same_failure(logged, observed)
    assert not same_failure(observed, logged)  # a qualified record asks for the qualified type
    assert not same_failure(logged, named(observed, "torch._inductor.exc.LoweringException"))
    assert not same_failure(named(observed, "LoweringException"), observed)


def test_inspect_and_run_show_the_compiler_errors(tmp_path):
    import torch
    from click.testing import CliRunner

    import reproarchive
    from reproarchive.cli import main
    from reproarchive.context.failure import record_from_exception

    record = record_from_exception(_cpp_compile_error(tmp_path / "c", _UNDECLARED), "compile", backend="eager")
    gm = torch.fx.symbolic_trace(lambda x: x.sin())
    path = reproarchive.pack(gm, [torch.ones(2)], tmp_path / "a.tar.zst", failure=record, backend="eager")
    shown = CliRunner().invoke(main, ["inspect", str(path)]).output
    assert "compiler errors:" in shown and "undeclared_name" in shown and "was not declared" in shown
    ran = CliRunner().invoke(main, ["run", str(path)])
    assert ran.exit_code == 0  # eager passes; the recorded compiler error is still shown
    assert "undeclared_name" in ran.output and "was not declared" in ran.output


def test_a_compile_worker_failure_has_the_signature_of_the_same_failure_in_process():
    """Seen on a GPU machine: inductor compiled the capture's graph in a worker, which the parent
    re-raises as ``SubprocException`` (its message the worker's traceback); the replay compiled
    in-process and raised the ``RuntimeError`` itself, and ``run`` said "different failure"."""
    from reproarchive.context.failure import record_from_exception

    class SubprocException(Exception):  # torch._inductor.compile_worker.subproc_pool's, by name
        pass

    worker = SubprocException(
        "An exception occurred in a subprocess:\n\nTraceback (most recent call last):\n"
        '  File "/x/codecache.py", line 3764, in load_by_key_path\n    mod = _reload_python_module(key, path)\n'
        "RuntimeError: Failed to import /tmp/torchinductor_root/pq/cpqln.py\n"
        "SyntaxError: invalid syntax (cpqln.py, line 24)\n")
    here = RuntimeError("Failed to import /tmp/torchinductor_root/fk/cfkp.py\n"
                        "SyntaxError: invalid syntax (cfkp.py, line 24)")
    recorded, replayed = record_from_exception(worker, "compile"), record_from_exception(here, "compile")
    assert recorded.exception_type == "RuntimeError" and recorded.signature == replayed.signature


# --------------------------------------------------------------------------------------------
# a collective that waited past its timeout: one rule, for the capture and the replay


def _store_timeout() -> BaseException:
    """The exception a real torch.distributed store raises when a peer never answers."""
    import datetime

    import torch.distributed as dist

    store = dist.HashStore()
    store.set_timeout(datetime.timedelta(milliseconds=20))
    try:
        store.get("a peer that never came")
    except dist.DistError as exc:
        return exc
    raise AssertionError("the store did not time out")


def test_a_collective_that_timed_out_is_a_timeout_by_one_rule():
    """The capture (``sources.capture.job_capture.failed``) and the replay (``replay.rank_worker``) both
    judge by ``as_collective_timeout``: a rank recorded as hanging replays as hanging. They used
    to keep a rule each, and the replay's did not know a store's ``DistStoreError`` nor a
    timeout while compiling, which the capture's did."""
    import torch.distributed as dist

    from reproarchive.context.failure import as_collective_timeout, record_from_exception

    store = record_from_exception(_store_timeout(), "forward")
    gloo = record_from_exception(dist.DistBackendError(
        "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 5000ms for recv "
        "operation to complete"), "compile")
    for record in (store, gloo):
        hung = as_collective_timeout(record)
        assert hung.stage == "timeout", record
        assert hung.signature == "timeout|" + record.signature.split("|", 1)[1]
        assert (hung.exception_type, hung.message) == (record.exception_type, record.message)
    for unchanged in (record_from_exception(TimeoutError("the data loader timed out"), "forward"),
                      record_from_exception(dist.DistBackendError("NCCL error: unhandled cuda error"), "forward"),
                      record_from_exception(dist.DistBackendError("gloo: Timed out"), "accuracy")):
        assert as_collective_timeout(unchanged) is unchanged
    assert as_collective_timeout(None) is None


def test_the_signal_of_a_fault_report_is_the_one_named_before_the_stacks_or_none():
    """faulthandler's report of a death, as the guardian and a rank's watch read it: threads
    that fault at once write their headers into each other (the demo's aborting kernel does),
    and words in a stack are not a signal; a report that names no signal, or two, leaves the
    signal unknown rather than guessed."""
    stack = 'Current thread 0x00007f01 (most recent call first):\n  File "seg.py", line 3 in Segmentation fault\n'
    assert fault_signal("Fatal Python error: Aborted\n\n" + stack) == "SIGABRT"
    assert fault_signal("Fatal Python error: Fatal Python error: AbortedAborted\n\n\n" + stack) == "SIGABRT"
    assert fault_signal("Fatal Python error: Floating-point exception\n\nStack (most recent call first):\n") == "SIGFPE"
    assert fault_signal("Fatal Python error: Segmentation fault\n\nFatal Python error: Aborted\n\n" + stack) is None
    assert fault_signal("Fatal Python error: Fatal Python error: \n\n" + stack) is None
    assert fault_signal("") is None and fault_signal(stack) is None


def test_a_peer_that_went_away_is_one_rule_for_the_merge_the_launcher_and_the_job_script():
    from reproarchive.context.failure import PEER_GONE_WORDS, says_a_peer_went_away
    from reproarchive.standalone.job_script import _job_template

    for said in ("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:5",
                 "Read error [127.0.0.1]:4: Connection reset by peer", "NCCL communicator was aborted on rank 0"):
        assert says_a_peer_went_away(said), said
    assert not says_a_peer_went_away("IndexError: index 9 is out of bounds") and not says_a_peer_went_away(None)
    # the exported job script is filled with the same words, not a copy of them
    assert "_PEER_GONE = {peer_gone}" in _job_template() and all(w == w.lower() for w in PEER_GONE_WORDS)
