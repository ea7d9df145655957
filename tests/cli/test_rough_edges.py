"""Rough edges found by trying the command line as a new user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch._inductor.config

import reproarchive
from reproarchive.context.config import config_snapshot
from reproarchive.context.failure import pending_crash_record
from support.cli import invoke
from support.graphs import pack_chain

CLI = str(Path(sys.executable).parent / "reproarchive")
INJECTOR = "torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY"


@pytest.mark.slow
@pytest.mark.parametrize("args", [["inspect", "ARCHIVE"], ["ls", "STORE"], ["inspect", "ARCHIVE", "--json"]])
def test_a_reader_that_goes_away_ends_the_command_quietly(args, tmp_path):
    """``reproarchive ... | head``: the pipe's reader is gone before the command writes."""
    archive = pack_chain(tmp_path / "a.tar.zst", 60)
    reproarchive.push(archive, tmp_path / "store")
    argv = [CLI, *[str(archive) if a == "ARCHIVE" else str(tmp_path / "store") if a == "STORE" else a for a in args]]
    read, write = os.pipe()
    os.close(read)  # like `head` that has already exited
    try:
        proc = subprocess.run(argv, stdout=write, stderr=subprocess.PIPE, text=True, timeout=120, check=False)
    finally:
        os.close(write)
    assert proc.returncode == 141, proc.stderr
    assert proc.stderr == ""


@pytest.mark.slow
def test_capture_creates_its_output_folder(tmp_path):
    out = tmp_path / "not" / "yet"
    result = invoke("capture", "-o", out, "-q", "--", sys.executable, "-c", "pass")
    assert result.exit_code == 0, result.output
    assert out.is_dir()
    (tmp_path / "file").write_text("x")
    refused = invoke("capture", "-o", tmp_path / "file", "--", sys.executable, "-c", "pass")
    assert refused.exit_code == 2 and "is a file" in refused.stderr


def test_pack_of_an_archive_says_it_is_one_already(tmp_path):
    archive = pack_chain(tmp_path / "x.tar.zst", 8)
    result = invoke("pack", archive, "--json")
    assert result.exit_code == 4, result.output
    assert "already a compressed archive" in result.stderr and "reproarchive inspect" in result.stderr
    assert "line None" not in result.stderr and json.loads(result.stdout)["exit_code"] == 4


def test_inspect_names_every_input_symints_included(tmp_path):
    path = tmp_path / "dyn.tar.zst"

    def backend(gm, inputs):
        reproarchive.pack(gm, list(inputs), path)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(lambda x, n: x * n + x.shape[0], backend=backend, dynamic=True)(torch.randn(5, 2), 3)
    rows = reproarchive.inspect(path).to_plain()["inputs"]
    assert any(r["kind"] == "symint" for r in rows)
    assert all(r["name"] for r in rows), rows
    symint = next(r for r in rows if r["kind"] == "symint")
    assert symint["name"] in invoke("inspect", path).stdout


def test_a_pending_crash_says_its_signal_was_not_recorded(tmp_path):
    path = pack_chain(tmp_path / "crash.tar.zst", 8, failure=pending_crash_record(backend="inductor"))
    shown = invoke("inspect", path)
    assert shown.exit_code == 0, shown.output
    line = next(line for line in shown.stdout.splitlines() if line.startswith("failure:"))
    assert line.startswith("failure: crash (signal not recorded): the process died")


def test_doctor_calls_an_applied_testing_only_setting_out(tmp_path):
    with torch._inductor.config.patch({"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"}):
        config = config_snapshot()
    path = pack_chain(tmp_path / "injected.tar.zst", 8, config=config)
    lines = invoke("doctor", path).stdout.splitlines()
    row = next(line for line in lines if INJECTOR in line)
    assert row.startswith("= ") and "testing-only" in row and "`run` applies it" in row
    assert "unlikely" not in lines[-1] and "none is likely" not in lines[-1]
    assert f"{INJECTOR} is set in the archive" in lines[-1] and "applied by `reproarchive run`" in lines[-1]


def test_a_broken_pipe_elsewhere_is_still_an_error():
    """Only stdout's reader going away is quiet: the check looks at stdout, not at the error."""
    from reproarchive.cli.app import _stdout_closed

    started = time.monotonic()
    assert _stdout_closed() is False  # pytest's captured stdout is open
    assert time.monotonic() - started < 1


def test_debug_is_taken_after_the_command_too(tmp_path):
    """``reproarchive run --debug X``: the traceback, as with ``reproarchive --debug run X``;
    a program's own ``--debug`` (after ``--``, or after ``capture``'s program) stays its own."""
    from reproarchive.cli.app import _debug_first, main

    missing = tmp_path / "missing.tar.zst"
    for args in (["--debug", "inspect", missing], ["inspect", "--debug", missing], ["inspect", missing, "--debug"]):
        res = invoke(*args)
        assert res.exit_code == 4 and "Traceback (most recent call last)" in res.output, args
    assert "Traceback" not in invoke("inspect", missing).output
    assert _debug_first(main, ["capture", "python", "prog.py", "--debug"]) == ["capture", "python", "prog.py",
                                                                                "--debug"]
    assert _debug_first(main, ["capture", "--debug", "python", "prog.py"]) == ["--debug", "capture", "python",
                                                                                "prog.py"]
    assert _debug_first(main, ["pack", "x", "--", "--debug"]) == ["pack", "x", "--", "--debug"]
