"""``reproarchive capture -- python prog.py`` and ``reproarchive pack`` through the click CLI."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import reproarchive
from reproarchive.cli import main
from reproarchive.format.schema import CaptureSource
from reproarchive.testing.machine_paths import machine_paths_in
from reproarchive.testing.sources import Captured, SourceTests
from support import dump_programs as progs


def _runner() -> CliRunner:
    try:
        return CliRunner(mix_stderr=False)  # click < 8.2
    except TypeError:
        return CliRunner()


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """One real capture run of a program whose compiled graph fails at runtime: its folder, the
    archives' folder, the CLI's result, what was left in the cwd, and the ``CaptureResult``
    that ``reproarchive.capture_program`` returned to the command."""
    folder = tmp_path_factory.mktemp("capture")
    (folder / "prog.py").write_text(progs.dynamo_program("runtime_error"))
    out = folder / "archives"
    out.mkdir()
    runner = _runner()
    returned = []
    real = reproarchive.capture_program

    def capture_program(*args, **kwargs):
        returned.append(real(*args, **kwargs))
        return returned[-1]

    with runner.isolated_filesystem(temp_dir=folder) as cwd, pytest.MonkeyPatch.context() as patch:
        patch.setattr(reproarchive, "capture_program", capture_program)
        Path(cwd, "prog.py").write_text(progs.dynamo_program("runtime_error"))
        result = runner.invoke(main, ["capture", "-o", str(out), "--keep-dumps", "--",
                                      sys.executable, "prog.py"])
        leftovers = sorted(p.name for p in Path(cwd).iterdir())
    yield folder, out, result, leftovers, returned[0] if returned else None
    kept = [line.split(" in ", 1)[1].strip() for line in result.stderr.splitlines() if "dumps kept in" in line]
    for dumps in kept:
        shutil.rmtree(dumps, ignore_errors=True)


def test_capture_packs_the_failure_and_keeps_exit_code(captured):
    folder, out, result, leftovers, _ = captured
    assert result.exit_code == 1, result.output + result.stderr  # the program's own exit code
    archives = sorted(out.glob("*.tar.zst"))
    assert [a.name for a in archives] == ["repro.tar.zst"]
    assert str(archives[0]) in result.output
    assert "failure: forward" in result.output and "ReluRuntimeError" in result.output
    assert "4 real / 0 absent" in result.output
    # PyTorch's dumps went to capture's scratch folder, not into the user's directory
    assert leftovers == ["inputs.pt", "prog.py"]
    assert machine_paths_in(archives[0], folder) == []  # one redaction for every capture path
    repro = reproarchive.load(archives[0])
    assert repro.records.failure.stage == "forward"
    assert repro.records.backend == "relu_runtime_error_TESTING_ONLY"
    assert repro.fidelity == ["real"] * 4
    # (format 1.7) each op's model line, the program's folder redacted
    ops = [n for n in repro.gm.graph.nodes if n.op in ("call_function", "call_method")]
    assert ops and all(n.meta.get("stack_trace", "").startswith('  File "./prog.py", line ') for n in ops), \
        [n.meta.get("stack_trace") for n in ops]
    # what capture set itself to watch the program is not the program's: nothing to list here
    assert "TORCH_COMPILE_DEBUG_DIR" not in repro.records.environment.variables
    assert not [r for r in reproarchive.doctor(archives[0]).differences if "TORCH_COMPILE_DEBUG" in r["name"]]


def test_pack_cli_json_on_kept_dump(captured, tmp_path):
    folder, out, result, _, _ = captured
    kept = next(line.split(" in ", 1)[1].strip() for line in result.stderr.splitlines()
                if "dumps kept in" in line)
    runner = _runner()
    res = runner.invoke(main, ["pack", kept, "-o", str(tmp_path / "p.tar.zst"), "--no-replay", "--json"])
    assert res.exit_code == 0, res.output + res.stderr
    report = json.loads(res.stdout)
    assert report["archive"] == str(tmp_path / "p.tar.zst")
    assert report["kind"] == "after_dynamo"
    assert report["failure"]["stage"] == "unknown"
    assert report["inputs"]["real"] == 4
    assert report["size"] == (tmp_path / "p.tar.zst").stat().st_size


def test_pack_cli_without_dump_exits_4(tmp_path):
    runner = _runner()
    with runner.isolated_filesystem(temp_dir=tmp_path):
        res = runner.invoke(main, ["pack"])
    assert res.exit_code == 4
    assert res.stderr.startswith("error: no PyTorch repro dump found")
    assert "Traceback" not in res.output + res.stderr


def test_capture_passing_and_failing_programs_without_torch(tmp_path):
    runner = _runner()
    ok = runner.invoke(main, ["capture", "-o", str(tmp_path), "--", sys.executable, "-c", "pass"])
    assert ok.exit_code == 0
    assert "no torch.compile failure was captured" in ok.stderr
    assert "capture one with --accuracy" in ok.stderr  # an accuracy bug raises nothing: the way to catch one
    bad = runner.invoke(main, ["capture", "-o", str(tmp_path), "--", sys.executable, "-c",
                               "import sys; sys.exit(3)"])
    assert bad.exit_code == 3
    assert "wrote no repro dump" in bad.stderr
    # a program killed by a signal outside what capture guards: said so, not "not inside a backend"
    killed = runner.invoke(main, ["capture", "-o", str(tmp_path), "--", sys.executable, "-c",
                                  "import os; os.abort()"])
    assert killed.exit_code == 134 and "wrote no repro dump" not in killed.stderr
    assert ("the program was killed by SIGABRT (exit 134) outside every compiled graph's compile and call that "
            "capture saw, and nothing was archived") in killed.stderr, killed.stderr
    assert list(tmp_path.iterdir()) == []
    missing = runner.invoke(main, ["capture", "--", str(tmp_path / "no-such-program")])
    assert missing.exit_code == 4 and "not found" in missing.stderr


def test_a_dump_that_could_not_be_packed_is_not_called_no_failure(capsys):
    """The pack's error is printed first; the closing line said "no torch.compile failure was
    captured", which read as if the program had not failed in a compiled graph."""
    from cli.capture_cmds import _say_nothing_captured
    from reproarchive.sources.program.program_capture import CaptureResult

    _say_nothing_captured(CaptureResult(exit_code=1, errors=["run_x: importing the dump failed"]), accuracy=False)
    said = capsys.readouterr().err
    assert "no torch.compile failure was captured" not in said
    assert "a failure was dumped, but no archive could be made of it (the error above says why)" in said


# A user's training step (conv + batch norm + MLP, an optimizer, a batch size that changes, so
# Dynamo recompiles with dynamic shapes): PyTorch's level-4 accuracy hook fails on it in torch
# 2.13 ("sources must not be empty for symbol s..."), `capture --accuracy` must not.
_TRAINING = """
import torch
torch.manual_seed(0)

class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))

m = M()
opt = torch.optim.SGD(m.parameters(), lr=0.1)
f = torch.compile(m, backend=BACKEND)
for n in (4, 5, 6):
    loss = f(torch.randn(n, 3, 16, 16)).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
print("trained", n)
"""


def _capture_accuracy(tmp_path, backend: str):
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "prog.py").write_text(_TRAINING.replace("BACKEND", repr(backend)))
    out = tmp_path / "archives"
    out.mkdir()
    cli = [sys.executable, "-c", "from reproarchive.cli import main; main()"]
    done = subprocess.run([*cli, "capture", "--accuracy", "--json", "-o", str(out), "--", sys.executable, "prog.py"],
                          cwd=folder, capture_output=True, text=True, timeout=600)
    return done, out


def test_capture_accuracy_leaves_a_working_program_working(tmp_path):
    done, out = _capture_accuracy(tmp_path, "aot_eager")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trained 6" in done.stdout
    assert json.loads(done.stdout[done.stdout.index("{"):])["archives"] == []
    assert list(out.iterdir()) == []


def test_capture_accuracy_archives_an_accuracy_bug_that_replays(tmp_path):
    """The bug is archived and the program goes on to its end: its exit status is its own (0),
    not an error capture raised in it (``--on-accuracy raise`` asks for that)."""
    done, out = _capture_accuracy(tmp_path, "relu_accuracy_error_TESTING_ONLY")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trained 6" in done.stdout and "compiled result differs from eager" in done.stderr
    report = json.loads(done.stdout[done.stdout.index("{"):])
    assert report["archives"] and all(a["failure"]["stage"] == "accuracy" for a in report["archives"])
    packed = report["archives"][0]
    archive = Path(packed["archive"])
    assert sorted(p.name for p in out.iterdir()) == sorted(Path(a["archive"]).name for a in report["archives"])
    assert machine_paths_in(archive, tmp_path) == []
    outcome = reproarchive.run(archive)
    assert outcome.status == "reproduced" and outcome.kind == "accuracy failure"


class TestProgramSource(SourceTests):
    """``capture -- python prog.py`` of a program whose compiled graph fails at runtime in its
    first call: that call kept from the crash guard's spool (its inputs and generator states as
    they were before it, and the program's own exception), in place of the dump PyTorch wrote."""

    source_record = CaptureSource
    stage = "forward"

    @pytest.fixture(scope="module")
    def captured(self, captured) -> Captured:  # the module's one capture run
        folder, out, _, _, returned = captured
        assert returned is not None, "the command did not call reproarchive.capture_program"
        return Captured(archives=sorted(out.glob("*.tar.zst")), reports=returned.archives, folders=(folder,))


# A custom backend, a function of the program's own script, whose compiled code fails.
_CUSTOM_BACKEND = """
import sys
import torch

def my_backend(gm, example_inputs):
    def run(*args):
        raise RuntimeError("my backend's kernel failed")
    return run

def counting_backend(gm, example_inputs):
    def run(*args):
        print("counting backend ran", file=sys.stderr)
        return gm(*args)
    return run

if __name__ == "__main__":
    # no input requires grad: the hook's check would be the first call itself, so it runs once
    torch.compile(lambda a: torch.sin(a) * 2, backend=counting_backend)(torch.randn(8))
    torch.compile(lambda a: torch.relu(a) + 1, backend=my_backend)(torch.randn(8))
"""


def _capture_program(tmp_path: Path, source: str) -> tuple[Path, subprocess.CompletedProcess]:
    """``source`` as ``prog.py`` run under ``reproarchive capture --json`` in a child: its folder,
    and the finished run."""
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "prog.py").write_text(source)
    cli = [sys.executable, "-c", "from reproarchive.cli import main; main()"]
    done = subprocess.run([*cli, "capture", "--json", "-o", str(tmp_path / "archives"), "--", sys.executable,
                           "prog.py"], cwd=folder, capture_output=True, text=True, timeout=300)
    return folder, done


def test_a_compile_error_packed_from_pytorch_s_dump_keeps_each_op_s_model_line(tmp_path):
    """(format 1.7) PyTorch's after_dynamo dump prints the graph without its stacks; the crash
    guard notes each compiled graph's calls with theirs, and the dump's rebuilt graph gets them
    back, call for call (the program's folder written ``<cwd>``, as the dump route's records
    write it). Before, the archive of ``capture --``'s default route had none."""
    _, done = _capture_program(tmp_path, progs.dynamo_program("compile_error"))
    assert done.returncode == 1, done.stderr[-3000:]
    (packed,) = json.loads(done.stdout)["archives"]
    assert packed["kind"] == "after_dynamo", packed
    ops = [n for n in reproarchive.load(packed["archive"]).gm.graph.nodes if n.op in ("call_function", "call_method")]
    assert ops and all(n.meta.get("stack_trace", "").startswith('  File "<cwd>/prog.py", line ') for n in ops), \
        [n.meta.get("stack_trace") for n in ops]
    assert any("torch.relu(self.lin(x) + y)" in n.meta["stack_trace"] for n in ops)


def test_capture_records_a_custom_backend_by_its_import_path(tmp_path, monkeypatch):
    folder, done = _capture_program(tmp_path, _CUSTOM_BACKEND)
    assert done.returncode == 1, done.stderr[-3000:]
    # the program's own exception, not one from PyTorch's hook run inside the backend
    assert "RuntimeError: my backend's kernel failed" in done.stderr
    assert "BackendCompilerFailed" not in done.stderr
    assert done.stderr.count("counting backend ran") == 1  # a graph no output of which can require grad
    (packed,) = json.loads(done.stdout)["archives"]
    assert packed["backend"] == "prog:my_backend"
    monkeypatch.syspath_prepend(str(folder))
    outcome = reproarchive.run(packed["archive"], backend="prog:my_backend")
    assert outcome.observed is not None and "my backend's kernel failed" in outcome.observed.message, outcome


# A first call that fails as a device-side assert does (every later read of the device fails),
# simulated on CPU: the spool takes the device's path (no fork), its weights' writes and
# PyTorch's dump of the failure fail once the "assert" has fired.
_UNREADABLE_AFTER_FAILURE = """
import sys
import threading
import torch
import torch._dynamo.repro.after_dynamo as hook
from reproarchive.archive.spool import Spool
from reproarchive.sources.capture import process_spool
from reproarchive.sources.capture import snapshot_writer

MESSAGE = "CUDA error: device-side assert triggered"
fired = threading.Event()
snapshot_writer.can_fork = lambda storages, inputs_copied: False
process_spool.FIRST_BYTES = 4096
real_write = Spool.write

def write(self, todo, stop=None):
    if any(storage.nbytes() > 4096 for _, storage in todo):  # the weights: read after the assert
        fired.wait(10)
        raise RuntimeError(MESSAGE)
    return real_write(self, todo, stop)

def unreadable(*args, **kwargs):
    raise RuntimeError(MESSAGE)

Spool.write = write
hook.dump_backend_state = hook.dump_to_minify_after_dynamo = unreadable

def asserting(gm, example_inputs):
    def run(*args):
        fired.set()
        raise RuntimeError(MESSAGE)
    return run

torch.manual_seed(0)
x, w = torch.randn(4, 64), torch.randn(64, 256)  # 1 KiB, 64 KiB
try:  # its first call is its own check (no output can require grad)
    torch.compile(lambda a, b: torch.relu(a @ b), backend=asserting)(x, w)
except RuntimeError as err:
    print("the first graph failed:", err, file=sys.stderr)
fired.clear()
w.requires_grad_()  # a check runs before the first call
torch.compile(lambda a, b: torch.relu(a @ b) + 1, backend=asserting)(x, w)
"""


def test_capture_keeps_a_first_call_pytorch_could_not_dump_from_the_spool(tmp_path):
    """(27.5) Under ``capture --`` a device-side assert leaves PyTorch's hook unable to dump the
    failure (it reads the inputs after it): the first call's spool entry, its inputs as they
    were before the call, is the archive, with the program's failure; what the device could no
    longer give is absent. Two graphs: one whose first call is its own check, one checked
    before its first call."""
    _, done = _capture_program(tmp_path, _UNREADABLE_AFTER_FAILURE)
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stderr.count("archived the failing first call from its spool") == 2
    assert "RuntimeError: CUDA error: device-side assert triggered" in done.stderr.splitlines()[-1]
    archives = [packed["archive"] for packed in json.loads(done.stdout)["archives"]]
    assert len(archives) == 2
    torch.manual_seed(0)
    x = torch.randn(4, 64)
    for archive in archives:
        reproarchive.verify(archive)
        repro = reproarchive.load(archive)
        assert repro.fidelity == ["real", "absent"] and torch.equal(repro.args[0], x)
        failure = repro.records.failure
        assert failure.stage == "forward" and "device-side assert" in failure.message


def test_on_accuracy_reaches_the_program_and_is_not_recorded_as_the_users(tmp_path):
    from reproarchive.context.environment import environment_snapshot
    from reproarchive.sources.program.crash_guard import ON_ACCURACY_ENV
    from reproarchive.sources.program.program_capture import capture_env, set_by_capture

    assert capture_env(tmp_path, accuracy=True, base={})[ON_ACCURACY_ENV] == "warn"  # the program goes on
    env = capture_env(tmp_path / "reproarchive-capture-1", accuracy=True, on_accuracy="raise", base={})
    assert env[ON_ACCURACY_ENV] == "raise"
    assert ON_ACCURACY_ENV not in environment_snapshot(env).variables  # capture's doing, not the user's
    assert ON_ACCURACY_ENV in set_by_capture({"TORCH_COMPILE_DEBUG_DIR": env["TORCH_COMPILE_DEBUG_DIR"]})
    with pytest.raises(ValueError, match="on_accuracy"):
        capture_env(tmp_path, accuracy=True, on_accuracy="ignore")
    refused = _runner().invoke(main, ["capture", "--accuracy", "--on-accuracy", "ignore", "--", sys.executable, "-c",
                                      "pass"])
    assert refused.exit_code == 2 and "Traceback" not in refused.output


def test_capture_of_a_program_that_left_nothing_imports_no_torch_of_its_own(tmp_path):
    """What ``capture --`` adds to a program is its own start and end: torch (2 s of CPU to
    import) is loaded there only to pack what a failing program left, never to look for it."""
    code = ("import sys\nfrom reproarchive.cli import main\n"
            "try:\n    main(['capture', '-q', '-o', sys.argv[1], '--', sys.executable, '-c', 'pass'])\n"
            "except SystemExit as done:\n    print('exit', done.code)\n"
            "print('torch loaded:', 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    lines = done.stdout.strip().splitlines()
    assert lines[-2:] == ["exit 0", "torch loaded: False"], done.stdout + done.stderr
