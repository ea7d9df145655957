"""The process-wide spool (issue 27.2): each storage written once, entries completed into
ordinary archives only when kept, nothing left after a normal exit; and ``pack SPOOL`` on the
spool a killed process left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.fx as fx

import reproarchive
from reproarchive.archive.spool import Spool, is_spool
from reproarchive.archive.writing import Capture
from reproarchive.context.failure import pending_crash_record
from reproarchive.errors import PackError
from reproarchive.format.schema import Records
from support.cli import invoke


def _graph():
    return fx.symbolic_trace(lambda x, w: torch.relu(x @ w))


def _records():
    return Records(backend="eager", failure=pending_crash_record(backend="eager"))


def test_shared_storages_are_written_once_and_entries_complete_into_archives(tmp_path):
    spool = Spool(tmp_path / "spool-1")
    w = torch.randn(128, 128)  # the "weights" two recompiles share
    xs = [torch.randn(4, 128), torch.randn(8, 128)]
    for n, x in enumerate(xs, 1):
        spool.add(str(n), Capture(_graph(), [x, w], _records()))
    distinct = w.untyped_storage().nbytes() + sum(x.untyped_storage().nbytes() for x in xs)
    assert spool.bytes_written == distinct
    assert spool.names() == ["1", "2"]
    spool.discard("1")  # its graph ran without crashing
    archive = spool.complete("2", tmp_path / "a.tar.zst")
    reproarchive.verify(archive)
    repro = reproarchive.load(archive)
    assert repro.fidelity == ["real", "real"] and torch.equal(repro.args[0], xs[1]) and torch.equal(repro.args[1], w)
    assert repro.records.failure.stage == "crash"
    spool.remove()
    assert not (tmp_path / "spool-1").exists()


def test_a_damaged_object_is_refused_in_one_line(tmp_path):
    spool = Spool(tmp_path / "spool-1")
    spool.add("1", Capture(_graph(), [torch.randn(4, 64), torch.randn(64, 64)], _records()))
    (obj,) = [p for p in (tmp_path / "spool-1" / "objects").rglob("*") if p.is_file() and p.stat().st_size == 64 * 256]
    obj.write_bytes(b"\0" * obj.stat().st_size)
    with pytest.raises(PackError, match="does not hash to its name"):
        spool.complete("1", tmp_path / "a.tar.zst")
    assert not (tmp_path / "a.tar.zst").exists()
    assert not is_spool(tmp_path)


# A job that recompiles (two batch sizes: two graphs over the same weights) and is killed in
# its second graph's first call, under the crash guard (as `capture --` runs a program).
_KILLED = """
import os, signal, torch

def killing_backend(gm, example_inputs):
    def run(*args):
        if args[-1].shape[0] == 8:
            os.kill(os.getpid(), signal.SIGKILL)
        return gm(*args)
    return run

torch.manual_seed(0)
model = torch.nn.Linear(64, 64)
f = torch.compile(model, backend=killing_backend, dynamic=False)
f(torch.randn(4, 64))
f(torch.randn(8, 64))
"""


def _guarded_run(tmp_path, source: str) -> tuple[subprocess.CompletedProcess, object]:
    from reproarchive.sources.program import capture_env

    (tmp_path / "prog.py").write_text(textwrap.dedent(source))
    env = capture_env(tmp_path / "scratch")
    done = subprocess.run([sys.executable, "prog.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    return done, tmp_path / "scratch" / "crash"


_IN_PROCESS = """
import reproarchive
killing = killing_backend
killing_backend = reproarchive.capture(killing, path="archives", spool=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("route", ["capture --", "capture(spool=True)"])
def test_a_killed_process_leaves_a_spool_that_pack_turns_into_the_archive(tmp_path, route):
    source = _KILLED
    if route == "capture(spool=True)":
        source = _KILLED.replace("torch.manual_seed(0)", _IN_PROCESS + "torch.manual_seed(0)")
        (tmp_path / "prog.py").write_text(textwrap.dedent(source))
        done = subprocess.run([sys.executable, "prog.py"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300)
        folder = tmp_path / "archives"
    else:
        done, folder = _guarded_run(tmp_path, source)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    (spool,) = folder.glob("spool-*")
    objects = [p for p in (spool / "objects").rglob("*") if p.is_file()]
    # the weight and bias once, and each graph's input: never the weights twice; beside them the
    # CPU generator state each graph's call started from (format 1.3 ``rng``), one per graph
    state = torch.get_rng_state().numel()
    sizes = [p.stat().st_size for p in objects]
    assert sizes.count(state) == 2
    assert sum(sizes) - 2 * state == (64 * 64 + 64 + 4 * 64 + 8 * 64) * 4
    code, out = _cli("pack", "--json", spool, "-o", tmp_path / "out")
    assert code == 0, out
    (packed,) = json.loads(out)["archives"]
    assert packed["failure"]["stage"] == "crash"
    reproarchive.verify(packed["archive"])
    repro = reproarchive.load(packed["archive"])
    assert [tuple(a.shape) for a in repro.args][-1] == (8, 64) and repro.fidelity == ["real"] * 3
    assert repro.records.backend == "prog:killing_backend"
    assert not spool.exists()


@pytest.mark.slow
def test_a_process_that_ends_normally_leaves_no_spool(tmp_path):
    done, crash = _guarded_run(tmp_path, _KILLED.replace("os.kill(os.getpid(), signal.SIGKILL)", "pass"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert list(crash.glob("spool-*")) == []


def _cli(*args) -> tuple[int, str]:
    result = invoke(*[str(a) for a in args])
    return result.exit_code, result.output


def test_pack_of_a_folder_that_is_no_spool_is_not_mistaken_for_one(tmp_path):
    assert not reproarchive.is_spool(tmp_path)
    with pytest.raises(reproarchive.SourceError, match="not a reproarchive spool"):
        reproarchive.pack_spool(tmp_path, tmp_path / "out")
    assert os.listdir(tmp_path) == []


# The compiler dies (a native crash while compiling) once the graph's entry is on disk but
# while its objects are still being written in the background: a slow disk, made certain by a
# writer that waits for the crash.
_DIES_WHILE_WRITING = """
import os, time, torch
from pathlib import Path
from reproarchive.archive import spool

def slow_write(self, todo):
    time.sleep(600)  # the process dies first

spool.Spool.write = slow_write

def dying_backend(gm, example_inputs):
    crash = Path(os.environ["REPROARCHIVE_CRASH_DIR"])
    for _ in range(2000):  # until the entry (index and code) is on disk
        if list(crash.glob("spool-*/pending/*.index")):
            break
        time.sleep(0.01)
    os.abort()

torch.compile(torch.nn.Linear(64, 64), backend=dying_backend)(torch.randn(4, 64))
"""


@pytest.mark.slow
def test_a_crash_while_the_background_write_is_under_way_leaves_a_complete_archive(tmp_path):
    done, crash = _guarded_run(tmp_path, _DIES_WHILE_WRITING)
    assert done.returncode == -signal.SIGABRT, done.stderr[-2000:]
    (spool,) = crash.glob("spool-*")
    code, out = _cli("pack", "--json", spool, "-o", tmp_path / "out")
    assert code == 0, out
    (packed,) = json.loads(out)["archives"]
    assert "still being written" in packed["warnings"][0]
    reproarchive.verify(packed["archive"])  # complete: every rule of the spec holds
    repro = reproarchive.load(packed["archive"])
    # what was not written is absent, never passed off as real
    assert repro.fidelity == ["absent", "absent", "absent"] and repro.records.failure.stage == "crash"


def test_device_storages_go_through_one_reused_host_chunk():
    """The GPU path's chunking, run on CPU tensors (the copies and the stream are the device's):
    every chunk lands in the same buffer, and the bytes and digest are the storage's."""
    from reproarchive.archive.host_staging import device_chunks, host_buffer
    from reproarchive.format import digests

    source = torch.randint(0, 255, (10_000,), dtype=torch.uint8)
    buffer = host_buffer(4096)
    pieces = []
    for chunk in device_chunks(source, buffer, 4096):
        assert len(chunk) <= 4096
        pieces.append(bytes(chunk))
    assert len(pieces) == 3 and b"".join(pieces) == source.numpy().tobytes()
    assert digests.of_bytes(b"".join(pieces)) == digests.of_bytes(source.numpy().tobytes())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_storages_are_spooled_through_one_pinned_chunk_and_no_device_memory(tmp_path):
    """What a GPU machine checks (issue 27.5): a 96 MiB weight on the device is spooled with no
    device memory beyond the job's own, through one 16 MiB pinned host buffer, and completes
    into an archive whose weight is the device tensor's bytes."""
    from reproarchive.archive.host_staging import CHUNK

    w = torch.randn(4096, 6144, device="cuda")  # 96 MiB
    x = torch.randn(8, 4096, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    spool = Spool(tmp_path / "spool-1")
    spool.add("1", Capture(_graph(), [x, w], _records()))
    assert torch.cuda.max_memory_allocated() == before  # capture took no device memory
    (buffer,) = spool.staging._buffers.values()
    assert buffer.is_pinned() and buffer.numel() == CHUNK
    archive = spool.complete("1", tmp_path / "a.tar.zst")
    reproarchive.verify(archive)
    repro = reproarchive.load(archive, device="cpu")
    assert torch.equal(repro.args[1], w.cpu()) and repro.records.failure.stage == "crash"


def test_the_first_call_waits_for_the_entry_and_small_objects_and_the_weights_follow(tmp_path, monkeypatch):
    """(27.3) With the written inputs copied, the first call may run once the entry and its small
    objects are on disk; a crash before the weights are written completes with them absent, and
    the end of the first call stops the writes it no longer needs."""
    import threading

    from reproarchive.sources import process_spool

    monkeypatch.setattr(process_spool, "FIRST_BYTES", 4096)
    gate, started = threading.Event(), threading.Event()
    real_write = Spool.write

    def write(self, todo, stop=None):
        if any(storage.nbytes() > 4096 for _, storage in todo):  # the weights: held until the gate opens
            started.set()
            gate.wait(10)
        return real_write(self, todo, stop)

    monkeypatch.setattr(Spool, "write", write)
    spool = process_spool.ProcessSpool(tmp_path)
    x, w = torch.randn(4, 64), torch.randn(64, 256)  # 1 KiB of input, 64 KiB of weights
    name = spool.submit(Capture(_graph(), [x, w], _records()), background=True)
    assert spool.wait(name) and started.wait(10)  # the first call may run: the weights are not written
    crashed = spool.spool.complete(name, tmp_path / "crash.tar.zst")  # what `pack SPOOL` does after a crash
    repro = reproarchive.load(crashed)
    assert repro.fidelity == ["real", "absent"] and torch.equal(repro.args[0], x)
    ending = threading.Thread(target=spool.discard, args=(name,))  # the first call ended
    ending.start()
    while name in spool._pending:
        ending.join(0.01)
    gate.set()  # the writer goes on only now, and finds it was told to stop
    ending.join(10)
    assert spool.spool.names() == []
    objects = [p for p in (spool.spool.folder / "objects").rglob("*") if p.is_file()]
    assert [o.stat().st_size for o in objects] == [x.untyped_storage().nbytes()]  # the weights never written
    assert not list((spool.spool.folder / "objects").rglob("*.partial"))
    spool.close()
    assert not spool.spool.folder.exists()
