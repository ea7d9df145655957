"""Custom ops through the other doors: ``capture --`` of a program that defines its own op (the
dump PyTorch writes names the op but cannot define it), and ``export``'s repro.py, with a
stand-in or with the implementation the user names (``--import``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import reproarchive
from reproarchive.format.reader import ContainerReader
from support.custom_op_programs import refusing_library, twice_library
from support.shared_fixture import built_once

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:.*stand-in.*:UserWarning")]

LIBRARY = twice_library("ratest_src")
PROGRAM = '''
import torch
import ratest_src_lib

def f(x):
    return torch.relu(torch.ops.ratest_src.twice(x) + 1)

torch.compile(f, backend="relu_compile_error_TESTING_ONLY")(torch.linspace(-2, 2, 8))
'''


def _cli(*args, cwd) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHDYNAMO_REPRO", "TORCH_COMPILE_DEBUG"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(cwd))
    return subprocess.run([str(Path(sys.executable).parent / "reproarchive"), *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> Path:
    """``capture --`` of a program whose graph calls its own custom op; once for the whole run
    (``built_once``): the archive and the program's folder are read-only."""

    def build(folder: Path) -> Path:
        (folder / "ratest_src_lib.py").write_text(LIBRARY)
        (folder / "prog.py").write_text(PROGRAM)
        result = _cli("capture", "-o", folder / "out", "--", sys.executable, "prog.py", cwd=folder)
        archives = sorted((folder / "out").glob("*.tar.zst"))
        assert result.returncode == 1 and len(archives) == 1, result.stdout + result.stderr[-3000:]
        return archives[0]

    return built_once(tmp_path_factory, "custom_op_program", build, dump=str, load=Path)


def test_capture_records_the_programs_custom_op_calls(captured):
    with ContainerReader(captured) as reader:
        (op,) = reader.index.custom_ops
    assert op.name == "ratest_src::twice.default" and op.provenance.module == "ratest_src_lib"
    assert len(op.calls) == 1 and op.calls[0].outputs
    outcome = reproarchive.run(captured, isolate=False)
    assert outcome.status == "reproduced" and outcome.stand_ins == ["ratest_src::twice.default"]


def test_export_writes_the_choice_into_repro_py(captured, tmp_path):
    folder = captured.parent.parent
    reproarchive.export(captured, tmp_path / "stand_in")  # this process has no ratest_src: a stand-in
    script = (tmp_path / "stand_in" / "repro.py").read_text()
    assert "_stand_in('ratest_src::twice.default'" in script and "ratest_src_lib" not in script
    ran = subprocess.run([sys.executable, "repro.py"], cwd=tmp_path / "stand_in", capture_output=True, text=True,
                         timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert "ReluCompileError" in ran.stderr and "a stand-in returns its 1 recorded" in ran.stderr, ran.stderr[-2000:]
    # a pass with the op stood in is no evidence either way, as in `run` (125, never 0)
    passed = subprocess.run([sys.executable, "repro.py", "--backend", "eager"], cwd=tmp_path / "stand_in",
                            capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert passed.returncode == 125 and "no failure" in passed.stdout, passed.stderr[-2000:]
    assert "not as recorded: custom op ratest_src::twice.default was stood in" in passed.stderr

    real = _cli("export", captured, "-o", tmp_path / "real", "--import", "ratest_src_lib", cwd=folder)
    assert real.returncode == 0, real.stderr
    script = (tmp_path / "real" / "repro.py").read_text()
    assert "importlib.import_module('ratest_src_lib')" in script
    ran = subprocess.run([sys.executable, "repro.py"], cwd=tmp_path / "real", capture_output=True, text=True,
                         timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(folder)})
    assert "ReluCompileError" in ran.stderr and "stand-in" not in ran.stderr, ran.stderr[-2000:]


def test_inspect_names_the_op_and_what_run_does_about_it(captured):
    """This process has no ``ratest_src``: ``inspect`` calls the archive replayable (``run``
    stands in for the op from its recorded call) and says what to bring for the real one."""
    info = reproarchive.inspect(captured)
    assert info.not_replayable_here == ()
    (row,) = info.custom_ops
    assert row.name == "ratest_src::twice.default" and row.calls == 1 and row.stand_in
    assert "ratest_src_lib" in row.provenance and row.schema.startswith("ratest_src::twice(")
    assert row.here.startswith("not registered here: `run` replays it from its 1 recorded call(s)")
    assert "--import MODULE" in row.here
    assert reproarchive.verify(captured, progress=False).not_replayable_here == ()
    text = _cli("inspect", captured, cwd=captured.parent).stdout
    assert "custom op: ratest_src::twice.default" in text and "not replayable here" not in text


REFUSING_OP = refusing_library("ratest_refuse")
LATER_CALL_PROGRAM = '''
import torch, refuse_lib
f = torch.compile(lambda x: refuse_lib.checked(torch.relu(x) * 2))
for scale in (1.0, 2.0, 100.0):  # the third call's values are refused
    f(torch.ones(8) * scale)
'''


def test_a_dump_whose_replay_cannot_run_the_op_records_no_failure_of_the_stand_ins(tmp_path):
    """A later call fails inside the program's own op. PyTorch's dump names the op but cannot
    define it, and the failing call has no recorded output, so the pack's replay met its own
    stand-in's miss, and the archive recorded that (``compile StandInMiss``) as the program's
    failure: `run` with the real op then said DIFFERENT FAILURE. Now the failure is unknown and
    says what to bring; with ``capture --import`` the replay learns the real one."""
    (tmp_path / "refuse_lib.py").write_text(REFUSING_OP)
    (tmp_path / "prog.py").write_text(LATER_CALL_PROGRAM)
    alone = _cli("capture", "--json", "-o", tmp_path / "out", "--", sys.executable, "prog.py", cwd=tmp_path)
    (written,) = json.loads(alone.stdout)["archives"]
    assert written["failure"]["stage"] == "unknown" and "--import MODULE" in written["failure"]["message"], written
    brought = _cli("capture", "--json", "--import", "refuse_lib", "-o", tmp_path / "brought", "--", sys.executable,
                   "prog.py", cwd=tmp_path)
    (written,) = json.loads(brought.stdout)["archives"]
    assert written["failure"]["exception_type"] == "RuntimeError", written
    assert "a value over 10 was refused" in written["failure"]["message"]


FIRST_CALL_PROGRAM = '''
import torch
import ratest_src_lib
torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY = "runtime_error"

def f(x):
    return torch.relu(torch.ops.ratest_src.twice(x) + 1)

torch.compile(f, backend="inductor")(torch.linspace(-2, 2, 8))
'''


def test_a_first_call_that_fails_after_the_op_is_kept_with_the_op_s_call(tmp_path):
    """Inductor's code fails in the graph's first call, after the program's own op ran. The call
    is kept from the crash guard's spool, written before the call, so it held no call of the op:
    ``run`` without the op was inconclusive (125, "could not run the op") where the capture
    backend's archive of the same failure reproduces. The op is now run on the kept inputs (as
    they were before the call) while the program still has it, and the archive holds its call:
    ``run`` and the exported script reproduce with it stood in (and say so), and with the op
    brought ``run`` reproduces as well."""
    (tmp_path / "ratest_src_lib.py").write_text(LIBRARY)
    (tmp_path / "prog.py").write_text(FIRST_CALL_PROGRAM)
    done = _cli("capture", "--json", "-o", tmp_path / "out", "--", sys.executable, "prog.py", cwd=tmp_path)
    (written,) = json.loads(done.stdout)["archives"]
    assert written["failure"]["stage"] == "forward" and written["replay"]["failure_from"] == "program", written
    (op,) = reproarchive.inspect(written["archive"]).custom_ops
    assert op.calls == 1, op
    alone = json.loads(_cli("run", "--json", written["archive"], cwd=tmp_path / "out").stdout)
    assert (alone["status"], alone["exit_code"]) == ("reproduced", 1), alone
    assert any("was stood in" in u for u in alone["unfaithful"]), alone["unfaithful"]
    brought = _cli("run", "--json", "--import", "ratest_src_lib", written["archive"], cwd=tmp_path)
    assert json.loads(brought.stdout)["status"] == "reproduced" and brought.returncode == 1, brought.stdout[-2000:]
    # the exported script, without the op, stands it in too
    reproarchive.export(written["archive"], tmp_path / "script")
    ran = subprocess.run([sys.executable, "repro.py"], cwd=tmp_path / "script", capture_output=True, text=True,
                         timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert ran.returncode == 1 and "RuntimeError" in ran.stderr, ran.stderr[-2000:]


MAIN_OP_LATER_CALL_PROGRAM = '''
import torch

@torch.library.custom_op("ratest_main::shifted", mutates_args=())
def shifted(x: torch.Tensor) -> torch.Tensor:
    return x + 1

shifted.register_fake(lambda x: torch.empty_like(x))

@torch.compile(backend="eager")
def f(x, i):
    return torch.ops.ratest_main.shifted(x.relu() * 2)[i] + 1

x = torch.arange(4.0)
f(x, torch.tensor([0, 1]))
f(x, torch.tensor([2, 3]))
f(x, torch.tensor([2, 9]))  # the third call indexes out of range
'''


def test_a_later_call_of_a_graph_calling_an_op_the_program_defines_packs_with_the_op_s_call(tmp_path):
    """The op lives in the program's own script, which no pack can import, and the graph's third
    call fails after it ran. PyTorch dumps the call, but the crash guard recorded the op's calls
    only for a failing compile: the dump could not be packed ("importing the dump failed:
    AttributeError: ... has no attribute 'shifted'"), and capture said no failure was captured.
    The op's call on the failing call's inputs is recorded now, and the archive replays with it
    stood in."""
    (tmp_path / "prog.py").write_text(MAIN_OP_LATER_CALL_PROGRAM)
    done = _cli("capture", "--json", "-o", tmp_path / "out", "--", sys.executable, "prog.py", cwd=tmp_path)
    report = json.loads(done.stdout)
    assert report["errors"] == [] and len(report["archives"]) == 1, done.stdout + done.stderr[-3000:]
    (written,) = report["archives"]
    assert "index 9 is out of bounds" in written["failure"]["message"], written
    (op,) = reproarchive.inspect(written["archive"]).custom_ops
    assert (op.name, op.calls) == ("ratest_main::shifted.default", 1), op
    replayed = _cli("run", "--json", written["archive"], cwd=tmp_path / "out")
    assert json.loads(replayed.stdout)["status"] == "reproduced" and replayed.returncode == 1, replayed.stdout[-2000:]
