"""Killing a writer mid-write never leaves a truncated archive or half-written folder under the
final name.

Each case runs the writer (library ``pack``, ``unpack``, ``export``) in a child process on a
large-ish input and SIGKILLs it at a chosen moment: as soon as its temporary output appears,
and once that output has grown past a threshold. SIGKILL runs no cleanup, so what may remain
is the temporary itself, which must be hidden and named after the final name (``.NAME.*``;
``.partial`` for ``atomic_write``); the final name must be absent (or, if the kill came after
the rename, complete and valid).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from support.shared_fixture import built_once

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20

CHILD = textwrap.dedent(
    """
    import sys, torch, torch.fx as fx, reproarchive
    kind, src, dst = sys.argv[1:4]
    def build():
        def f(x, y, z, w):
            return torch.relu(x) + y.sum() + z.mean() + w.max()
        torch.manual_seed(0)
        ins = [torch.randn(3 * 1024 * 1024) for _ in range(4)]  # 4 x 12 MiB of incompressible data
        return fx.symbolic_trace(f), ins
    print("ready", flush=True)
    if kind == "pack":
        gm, ins = build()
        reproarchive.pack(gm, ins, dst, progress=False, frame_size=1 << 20)
    elif kind == "unpack":
        reproarchive.unpack(src, dst, progress=False)
    elif kind == "export":
        reproarchive.export(src, dst)
    elif kind == "minify":
        from reproarchive.context.failure import record_from_exception
        from reproarchive.cli import main
        backend = "relu_compile_error_TESTING_ONLY"
        def g(x):
            return torch.cos(torch.relu(torch.sin(x) * 2)) + 1
        gm, x = fx.symbolic_trace(g), torch.randn(8)
        try:
            torch.compile(gm, backend=backend)(x)
            sys.exit("the bug injector did not fail")
        except Exception as exc:
            record = record_from_exception(exc, "compile", backend=backend)
        reproarchive.pack(gm, [x], src, backend=backend, failure=record, progress=False)
        print("packed", flush=True)
        main(["run", "--minify", "-q", src, "-o", dst], standalone_mode=False)
    print("done", flush=True)
    """
)


def _size(path: Path) -> int:
    """Bytes under ``path`` now; 0 for what the child renamed or removed while it was looked at."""
    try:
        if path.is_file():
            return path.stat().st_size
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    except FileNotFoundError:  # renamed into place between the listing and the stat
        return 0


def _temps(folder: Path, final: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.name.startswith(f".{final.name}.")]


def kill_during(kind: str, src: Path | None, final: Path, threshold: int, timeout: float = 120) -> dict:
    """Run the child; SIGKILL it once a temporary output of >= threshold bytes exists."""
    scratch = tempfile.mkdtemp(prefix="kill-during-")  # SIGKILL cleans nothing: the child's temporaries go here
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1", TMPDIR=scratch)
    proc = subprocess.Popen([sys.executable, "-c", CHILD, kind, str(src or ""), str(final)], cwd=final.parent,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    killed_at = None
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            temps = _temps(final.parent, final)
            if temps and sum(_size(t) for t in temps) >= threshold:
                proc.send_signal(signal.SIGKILL)
                killed_at = sum(_size(t) for t in temps)
                break
            time.sleep(0.001)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(scratch, ignore_errors=True)
    return {"killed_at": killed_at, "returncode": proc.returncode, "stderr": proc.stderr.read().decode()[-2000:]}


def _check_outcome(final: Path, result: dict, temp_suffix: str | None) -> None:
    import reproarchive

    leftovers = _temps(final.parent, final)
    for t in leftovers:  # stale temporaries: hidden, named after the final name
        assert t.name.startswith(f".{final.name}."), t
        if temp_suffix:
            assert t.name.endswith(temp_suffix), t
    if result["killed_at"] is None:
        assert result["returncode"] == 0, result["stderr"]
    if final.exists():
        # only possible when the kill came after the rename: then it must be complete
        if final.is_file():
            reproarchive.verify(final, progress=False)
        else:
            assert any(final.iterdir())
    else:
        assert result["killed_at"] is not None, "the writer finished but its output is missing"


def _build_big_archive(folder: Path) -> str:
    """What the child's ``pack`` writes (the same graph, inputs and frames), written here: this
    archive is only the readers' input, never killed, so it needs no process of its own."""
    import torch
    import torch.fx as fx

    import reproarchive

    def f(x, y, z, w):
        return torch.relu(x) + y.sum() + z.mean() + w.max()

    with torch.random.fork_rng():  # the child's seed, without moving this process's generator
        torch.manual_seed(0)
        ins = [torch.randn(3 * 1024 * 1024) for _ in range(4)]  # 4 x 12 MiB of incompressible data
    final = folder / "big.tar.zst"
    reproarchive.pack(fx.symbolic_trace(f), ins, final, progress=False, frame_size=1 << 20)
    return str(final)


@pytest.fixture(scope="module")
def big_archive(tmp_path_factory):
    """A 64 MiB archive (1 MiB frames) for the readers that write folders (built once per run;
    read-only)."""
    final = Path(built_once(tmp_path_factory, "crash_src", _build_big_archive))
    assert final.exists()
    return final


@pytest.mark.parametrize("threshold", [0, 24 * MIB], ids=["at-start", "24MiB"])
def test_kill_pack(tmp_path, threshold):
    final = tmp_path / "repro.tar.zst"
    result = kill_during("pack", None, final, threshold)
    assert result["killed_at"] is not None, "pack finished before it could be killed; raise the input size"
    assert not final.exists(), "a killed pack left an archive under the final name"
    _check_outcome(final, result, ".partial")


@pytest.mark.parametrize("threshold", [16 * MIB], ids=["16MiB"])
def test_kill_unpack(tmp_path, big_archive, threshold):
    final = tmp_path / "unpacked"
    result = kill_during("unpack", big_archive, final, threshold)
    assert result["killed_at"] is not None, "unpack finished before it could be killed"
    assert not final.exists(), "a killed unpack left a folder under the final name"
    _check_outcome(final, result, ".partial")


@pytest.mark.parametrize("threshold", [8 * MIB], ids=["8MiB"])
def test_kill_export(tmp_path, big_archive, threshold):
    import reproarchive

    assert callable(reproarchive.export), "reproarchive.export is gone: a removed verb is a failure"
    final = tmp_path / "exported"
    result = kill_during("export", big_archive, final, threshold)
    if result["killed_at"] is None and result["returncode"] != 0:
        pytest.fail(f"export failed on a valid archive: {result['stderr']}")
    assert result["killed_at"] is not None, "export finished before it could be killed"
    assert not final.exists(), "a killed export left a folder under the final name"
    # export's temporaries are named .NAME.*.tmp (not .partial)
    _check_outcome(final, result, None)


def test_kill_minify(tmp_path):
    """``run --minify -o OUT`` writes its result through pack: kill it as the output appears."""
    from click.testing import CliRunner

    from reproarchive.cli import main

    assert "run" in main.commands, "`reproarchive run` is gone: a removed command is a failure"
    help_text = CliRunner().invoke(main, ["run", "--help"]).output
    assert "--minify" in help_text, "`reproarchive run --minify` is gone (the child runs it): a removed option fails"
    src, final = tmp_path / "failing.tar.zst", tmp_path / "min.tar.zst"
    result = kill_during("minify", src, final, threshold=0, timeout=180)
    if result["killed_at"] is None:
        pytest.fail(f"minify never started writing {final.name}: rc={result['returncode']} {result['stderr'][-800:]}")
    # the minified archive is small: on a loaded machine its write and rename can both land
    # between seeing the temporary and the signal; then what is there must be whole
    _check_outcome(final, result, ".partial")
