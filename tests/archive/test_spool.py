"""The process-wide spool (spec §13): each storage written once, entries completed into
ordinary archives only when kept, nothing left after a normal exit; and ``pack SPOOL`` on the
spool a killed process left."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.fx as fx

import reproarchive
from reproarchive.archive.spool import Spool, is_spool
from reproarchive.archive.writing import Capture
from reproarchive.context.failure import pending_crash_record
from reproarchive.errors import PackError
from reproarchive.format.schema import Records
from support.captures import archives_after_death
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
    archive = spool.complete("2", tmp_path / "a.tar.zst").path
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
    from reproarchive.sources.program.program_capture import capture_env

    (tmp_path / "prog.py").write_text(textwrap.dedent(source))
    env = capture_env(tmp_path / "scratch")
    done = subprocess.run([sys.executable, "prog.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    return done, tmp_path / "scratch" / "crash"


_IN_PROCESS = """
import reproarchive
killing = killing_backend
killing_backend = reproarchive.capture(killing, path="archives", spool=True, store="store")
"""


@pytest.mark.slow
def test_a_killed_process_leaves_a_spool_that_pack_turns_into_the_archive(tmp_path):
    done, folder = _guarded_run(tmp_path, _KILLED)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    (spool,) = folder.glob("spool-*")
    Spool(spool).wait_for_writers()  # the killed graph's entry finished by its forked writer
    # a half-written object of the first graph's writer, killed when its call ended, may be left
    # when the process died before its reaper ran (a loaded machine): a name no entry reads
    objects = [p for p in (spool / "objects").rglob("*") if p.is_file() and not p.name.endswith(".partial")]
    # the weight and bias once, never twice; the killed graph's input and the CPU generator
    # state its call started from (format 1.3 ``rng``). The first graph's own input and state
    # are there only if its writer finished before its call ended (it is killed then).
    state = torch.get_rng_state().numel()
    sizes = sorted(p.stat().st_size for p in objects if not p.name.startswith("."))
    assert sizes.count(64 * 64 * 4) == 1 and sizes.count(64 * 4) == 1 and 8 * 64 * 4 in sizes
    assert sizes.count(state) in (1, 2) and sizes.count(4 * 64 * 4) in (0, 1)
    assert set(sizes) <= {64 * 64 * 4, 64 * 4, 8 * 64 * 4, 4 * 64 * 4, state}
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
def test_in_process_a_killed_process_leaves_the_archive_its_guardian_completed(tmp_path):
    """The in-process backend (spool by default): the guardian completes the killed graph's
    entry into the archive the backend names, says so on the program's stderr, and removes the
    spool; the graph whose first call had ended is not archived."""
    source = _KILLED.replace("torch.manual_seed(0)", _IN_PROCESS + "torch.manual_seed(0)")
    (tmp_path / "prog.py").write_text(textwrap.dedent(source))
    with subprocess.Popen([sys.executable, "prog.py"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True) as program:
        assert program.wait(timeout=300) == -signal.SIGKILL
        # the guardian shares the program's stderr: its line comes after the program is gone
        stderr = program.stderr.read()
    (archive,) = archives_after_death(tmp_path / "archives")
    assert re.fullmatch(r"repro-[0-9a-f]{12}\.tar\.zst", archive.name)
    reproarchive.verify(archive)
    repro = reproarchive.load(archive)
    assert repro.records.failure.stage == "crash" and repro.records.source.written_before_run
    assert [tuple(a.shape) for a in repro.args][-1] == (8, 64) and repro.fidelity == ["real"] * 3
    assert repro.records.backend == "prog:killing_backend"
    assert repro.records.failure.exception_type == ""  # SIGKILL: no report, the signal is not guessed
    assert f"archive written to {archive}" in stderr
    assert list((tmp_path / "archives").iterdir()) == [archive]
    # shared as the backend's own failures are (``store=``)
    from reproarchive.store.listing import list_store

    assert "reproarchive: pushed to" in stderr and list_store(tmp_path / "store")["archives"] == 1


@pytest.mark.slow
def test_in_process_a_normal_end_leaves_nothing_and_ends_the_guardian(tmp_path):
    source = _KILLED.replace("torch.manual_seed(0)", _IN_PROCESS + "torch.manual_seed(0)")
    source = source.replace("os.kill(os.getpid(), signal.SIGKILL)", "pass")
    source += "\nimport os\nfrom reproarchive.sources.capture import process_spool\n"
    source += "guardian = process_spool._guardians[os.getpid()].proc.pid\n"
    source += "print(os.getpriority(os.PRIO_PROCESS, guardian), guardian)\n"
    (tmp_path / "prog.py").write_text(textwrap.dedent(source))
    done = subprocess.run([sys.executable, "prog.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    niceness, guardian = map(int, done.stdout.split()[-2:])
    if shutil.which("nice"):  # it idled at the lowest priority, off the job's cores
        assert niceness == 19
    for _ in range(200):  # it saw the pipe close and the spool gone
        if not Path(f"/proc/{guardian}").exists() or "Z" in Path(f"/proc/{guardian}/stat").read_text().split()[2]:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the guardian outlived the process it guarded")
    assert not (tmp_path / "archives").exists()  # the folder the spool made went with it
    assert not (tmp_path / "store").exists()  # nothing to share


def _guardian_after_death(spool: Spool, stores: list, fault: Path | None = None) -> int:
    """The guardian's run, here, told of ``spool`` once per store, then of its process's end
    (``fault``: the file faulthandler wrote as the process died)."""
    from reproarchive.sources.capture import spool_guardian

    read, write = os.pipe()
    for store in stores:
        os.write(write, json.dumps({"spool": str(spool.folder), "store": store}).encode() + b"\n")
    os.close(write)  # the process is gone: end of the pipe
    interrupt = signal.getsignal(signal.SIGINT)
    try:
        return spool_guardian.main([str(read), str(os.getpid()), str(fault or "")])
    finally:
        signal.signal(signal.SIGINT, interrupt)
        os.close(read)


def test_a_spool_its_guardian_cannot_complete_is_said_in_one_line_and_left_for_pack(tmp_path, capfd):
    """A damaged object: the guardian says so in one line (naming ``reproarchive pack``), exits
    1, writes no archive and leaves the spool as it was."""
    spool = Spool(tmp_path / "spool-4242")
    spool.add("repro-x.tar.zst", Capture(_graph(), [torch.randn(4, 64), torch.randn(64, 64)], _records()))
    (obj,) = [p for p in (spool.folder / "objects").rglob("*") if p.is_file() and p.stat().st_size == 64 * 256]
    obj.write_bytes(b"\0" * obj.stat().st_size)
    assert _guardian_after_death(spool, [None]) == 1
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "could not complete the spool" in err and "reproarchive pack" in err
    assert spool.names() == ["repro-x.tar.zst"] and not (tmp_path / "repro-x.tar.zst").exists()


def test_the_guardian_records_the_signal_and_stack_faulthandler_reported(tmp_path, capfd):
    """The process died by a signal faulthandler caught: its report names the signal and the
    crashing thread's stack, and the archive records both (as a replay would), with the backend
    the entry was written for; the report's file is removed."""
    spool = Spool(tmp_path / "archives" / "spool-4242")
    spool.add("repro-x.tar.zst", Capture(_graph(), [torch.randn(4, 64), torch.randn(64, 64)], _records()))
    fault = tmp_path / "reproarchive-fault-x.txt"
    fault.write_text('Fatal Python error: Segmentation fault\n\nThread 0x00007f0000000001 (most recent call first):\n'
                     '  File "/job/loader.py", line 9 in _poll\n\n'
                     'Current thread 0x00007f0000000002 (most recent call first):\n'
                     '  File "/job/train.py", line 41 in step\n  File "/job/train.py", line 60 in <module>\n')
    assert _guardian_after_death(spool, [None], fault) == 0
    archive = tmp_path / "archives" / "repro-x.tar.zst"
    reproarchive.verify(archive)
    failure = reproarchive.load(archive).records.failure
    assert failure.stage == "crash" and failure.exception_type == "SIGSEGV" and failure.signature == "crash|SIGSEGV|"
    assert "died by SIGSEGV" in failure.message and failure.backend == "eager"
    assert "train.py\", line 41 in step" in failure.traceback and "loader.py" not in failure.traceback
    assert "died by SIGSEGV" in capfd.readouterr().err
    assert not fault.exists()


def test_the_guardian_pushes_what_it_completes_to_the_captures_stores(tmp_path, capfd):
    """``capture(store=...)``: the archive the guardian completes is shared as the backend's own
    failures are; a store that fails is one line and exit 1, the archive left on disk."""
    from reproarchive.store.listing import list_store

    spool = Spool(tmp_path / "archives" / "spool-4242")
    spool.add("repro-x.tar.zst", Capture(_graph(), [torch.randn(4, 64), torch.randn(64, 64)], _records()))
    good, bad = tmp_path / "store", tmp_path / "not-a-folder"
    bad.write_text("a file")
    assert _guardian_after_death(spool, [str(good), str(good), str(bad)]) == 1  # as backends tell it
    archive = tmp_path / "archives" / "repro-x.tar.zst"
    reproarchive.verify(archive)
    (group,) = list_store(good)["groups"]
    (row,) = group["archives"]  # pushed once, though named twice
    assert row["name"].startswith("repro-x-")
    lines = capfd.readouterr().err.splitlines()
    assert len(lines) == 3 and f"archive written to {archive}" in lines[0] and "pushed to" in lines[1]
    assert f"could not push 1 archive(s) to {bad}" in lines[2] and "reproarchive push" in lines[2]
    assert not spool.folder.exists()


@pytest.mark.slow
def test_a_process_that_ends_normally_leaves_no_spool(tmp_path):
    done, crash = _guarded_run(tmp_path, _KILLED.replace("os.kill(os.getpid(), signal.SIGKILL)", "pass"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert list(crash.glob("spool-*")) == []


def _cli(*args) -> tuple[int, str]:
    result = invoke(*[str(a) for a in args])
    return result.exit_code, result.output


def test_pack_of_a_folder_that_is_no_spool_is_not_mistaken_for_one(tmp_path):
    assert not reproarchive._internal.is_spool(tmp_path)
    with pytest.raises(reproarchive.errors.SourceError, match="not a reproarchive spool"):
        reproarchive._internal.pack_spool(tmp_path, tmp_path / "out")
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


def test_staging_buffers_are_lent_one_per_reader_and_reused():
    """Readers of device storages at once each hold a buffer of their own; a buffer given back
    is lent again, so the host memory held is the most readers there were at once."""
    from reproarchive.archive.host_staging import HostStaging

    staging = HostStaging(chunk=4096)
    device = torch.device("cuda", 0)  # a key only: nothing is copied here
    first, second = staging._borrow(device), staging._borrow(device)
    assert first is not second and len(staging.buffers) == 2
    staging._free[device] += [first, second]
    again = staging._borrow(device)
    assert any(again is b for b in (first, second)) and len(staging.buffers) == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_storages_are_spooled_through_pinned_chunks_and_no_device_memory(tmp_path):
    """What a GPU machine checks (as tests/support/capture_gpu_check.py does): device storages are
    spooled with no device memory beyond the job's own, through pinned host buffers (at most one
    per storage read at once), and complete into an archive whose weights are the device tensors'
    bytes."""
    from reproarchive.archive.host_staging import CHUNK

    weights = [torch.randn(4096, 6144, device="cuda") for _ in range(3)]  # 96 MiB each
    x = torch.randn(8, 4096, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    spool = Spool(tmp_path / "spool-1")
    graph = fx.symbolic_trace(lambda x, a, b, c: torch.relu(x @ a) + x @ b + x @ c)
    spool.add("1", Capture(graph, [x, *weights], _records()))
    assert torch.cuda.max_memory_allocated() == before  # capture took no device memory
    buffers = spool.staging.buffers
    assert 1 <= len(buffers) <= 4 and all(b.is_pinned() and b.numel() == CHUNK for b in buffers)
    archive = spool.complete("1", tmp_path / "a.tar.zst").path
    reproarchive.verify(archive)
    repro = reproarchive.load(archive, device="cpu")
    assert all(torch.equal(got, w.cpu()) for got, w in zip(repro.args[1:], weights))
    assert repro.records.failure.stage == "crash"


def test_the_first_call_waits_for_the_entry_and_small_objects_and_the_weights_follow(tmp_path, monkeypatch):
    """(27.3) Where no fork can snapshot the storages (device ones; here CPU ones told so), with
    the written inputs copied, the first call may run once the entry and its small objects are
    on disk; a crash before the weights are written completes with them absent, and the end of
    the first call stops the writes it no longer needs."""
    import threading

    from reproarchive.sources.capture import process_spool, snapshot_writer

    monkeypatch.setattr(snapshot_writer, "can_fork", lambda storages, inputs_copied: False)
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
    name = spool.submit(Capture(_graph(), [x, w], _records()), written=frozenset())
    assert spool.wait(name) and started.wait(10)  # the first call may run: the weights are not written
    crashed = spool.spool.complete(name, tmp_path / "crash.tar.zst").path  # what `pack SPOOL` does after a crash
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


def _held_in_this_process(monkeypatch, method: str, hold):
    """``Spool.<method>`` replaced in this process only: a forked writer runs the real one."""
    parent, real = os.getpid(), getattr(Spool, method)

    def replaced(self, *args, **kwargs):
        if os.getpid() == parent:
            return hold(real, self, *args, **kwargs)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Spool, method, replaced)


def _unfinished(real, self, draft, stop=None, views=None, **kwargs):
    """A writer thread that never finishes hashing before it is told to stop."""
    from reproarchive.archive.spool import Stopped

    while not stop():
        time.sleep(0.002)
    raise Stopped


def test_a_first_call_waits_for_no_hashing_and_a_forked_writer_keeps_its_inputs_as_they_were(tmp_path,
                                                                                             monkeypatch):
    """(27.1, 27.3) Host storages: the first call waits for no hash or write. Its thread unfinished,
    the spool forks a writer, a copy-on-write snapshot: inputs the call then writes in place
    (the graph's writes not even known here, so nothing was copied) are completed as they were,
    every storage real, by a writer that outlives the call (``pack SPOOL`` waits for it)."""
    from reproarchive.sources.capture import process_spool

    _held_in_this_process(monkeypatch, "hash", _unfinished)
    spool = process_spool.ProcessSpool(tmp_path)
    x, w = torch.randn(4, 64), torch.randn(64, 256)
    x0, w0 = x.clone(), w.clone()
    name = spool.submit(Capture(_graph(), [x, w], _records()))
    assert spool.wait(name) and spool._pending[name].writer is not None
    x.mul_(2)
    w.add_(1)  # the call writes both, in place, while the writer may still be reading them
    assert spool.spool.names() == [name]  # (waits for the writer, as a crash's `pack SPOOL` does)
    repro = reproarchive.load(spool.spool.complete(name, tmp_path / "crash.tar.zst").path)
    assert repro.fidelity == ["real", "real"]
    assert torch.equal(repro.args[0], x0) and torch.equal(repro.args[1], w0)
    spool.close()
    assert not spool.spool.folder.exists()


@pytest.mark.parametrize("held", ["small", "large"])
def test_an_input_the_graph_writes_is_never_copied_nor_read_before_the_call_and_archived_as_it_was(tmp_path,
                                                                                                  monkeypatch, held):
    """(27.1) The graph writes x: the spool copies nothing; its thread hashes and writes only w
    (which the call does not write). At the first call x is read as it was: hashed and written
    there and then when it is small (no fork), else by the writer forked then."""
    from reproarchive.sources.capture import process_spool

    if held == "large":
        monkeypatch.setattr(process_spool, "HELD_HERE_BYTES", 1024 - 1)  # x's 1 KiB
    spool = process_spool.ProcessSpool(tmp_path)
    x, w = torch.randn(4, 64), torch.randn(64, 256)
    x0 = x.clone()
    name = spool.submit(Capture(_graph(), [x, w], _records()), written=frozenset({0}))
    entry = spool._pending[name]
    assert [s.data_ptr() for s in entry.draft.storages] == [x.untyped_storage().data_ptr(),
                                                             w.untyped_storage().data_ptr()]  # not copies
    entry.future.result(10)  # the thread is done with what it may read
    objects = [p for p in (spool.spool.folder / "objects").rglob("*") if p.is_file()]
    assert [o.stat().st_size for o in objects] == [w.untyped_storage().nbytes()] and not entry.done
    assert spool.wait(name)  # the first call
    if held == "small":
        assert entry.done and entry.writer is None  # x written before it ran, nothing forked
    else:
        assert entry.writer is not None  # x is left to the fork
    x.mul_(2)
    assert spool.spool.names() == [name]
    repro = reproarchive.load(spool.spool.complete(name, tmp_path / "crash.tar.zst").path)
    assert repro.fidelity == ["real", "real"] and torch.equal(repro.args[0], x0) and torch.equal(repro.args[1], w)
    spool.close()


def test_a_check_run_has_its_entry_finished_before_it_and_forks_no_writer(tmp_path, monkeypatch):
    """(27.1, 27.3) A first call that runs a check before the real call (``wait(fork=False)``):
    the lowest-priority thread, unfinished, is stopped, and what it left is hashed and written
    on the caller's thread. No writer is forked (none alive through the check's backward
    compile), and the entry is complete before the check runs, so a crash in the check leaves
    every storage real: the input the graph writes as it was before the call."""
    from reproarchive.sources.capture import process_spool

    real_hash, callers = Spool.hash, []

    def hash_(self, draft, stop=None, *args, **kwargs):
        callers.append(threading.current_thread().name)
        if callers[-1].startswith("reproarchive-spool-low"):  # the thread: stopped before it is done
            return _unfinished(real_hash, self, draft, stop, *args, **kwargs)
        return real_hash(self, draft, stop, *args, **kwargs)

    monkeypatch.setattr(Spool, "hash", hash_)
    spool = process_spool.ProcessSpool(tmp_path)
    x, w = torch.randn(4, 64), torch.randn(64, 256)
    x0 = x.clone()
    name = spool.submit(Capture(_graph(), [x, w], _records()), written=frozenset({0}))
    entry = spool._pending[name]
    assert spool.wait(name, fork=False)
    assert entry.done and entry.writer is None and callers[-1] == threading.current_thread().name
    assert not list(spool.spool.folder.glob("writers/*"))
    x.mul_(2)  # the real call, after the check
    repro = reproarchive.load(spool.spool.complete(name, tmp_path / "crash.tar.zst").path)
    assert repro.fidelity == ["real", "real"] and torch.equal(repro.args[0], x0) and torch.equal(repro.args[1], w)
    spool.close()
    assert not spool.spool.folder.exists()


def test_a_first_call_that_ends_kills_its_forked_writer_and_leaves_nothing(tmp_path, monkeypatch):
    """The call ended without a crash: its writer, still writing, is killed; no half-written
    object, lock or entry is left, and what it held on its own is measured (when asked)."""
    from reproarchive.sources.capture import process_spool, snapshot_writer

    monkeypatch.setattr(snapshot_writer, "measure_memory", True)
    _held_in_this_process(monkeypatch, "hash", _unfinished)
    parent, real_write = os.getpid(), Spool.write

    def stalled_write(self, todo, stop=None, views=None):
        if os.getpid() != parent:  # the forked writer: part of an object, then a long stall
            digest, _ = todo[0]
            from reproarchive.archive.spool import partial

            target = self._object(digest)
            target.parent.mkdir(exist_ok=True)
            partial(target, os.getpid()).write_bytes(b"half")
            time.sleep(60)
        return real_write(self, todo, stop, views)

    monkeypatch.setattr(Spool, "write", stalled_write)
    spool = process_spool.ProcessSpool(tmp_path)
    name = spool.submit(Capture(_graph(), [torch.randn(4, 64), torch.randn(64, 256)], _records()))
    assert spool.wait(name)
    folder = spool.spool.folder
    for _ in range(1000):  # until the writer is stalled in its write
        if list(folder.glob("objects/*/*.partial")):
            break
        time.sleep(0.01)
    assert list(folder.glob("objects/*/*.partial")) and list(folder.glob("writers/*.lock"))
    started = time.monotonic()
    spool.discard(name)
    assert time.monotonic() - started < 5  # killed, not waited for
    spool.settle()  # reaped on a thread
    assert not list(folder.glob("objects/*/*.partial")) and not list(folder.glob("writers/*"))
    assert spool.spool.names() == [] and spool.writer_memory > 0
    spool.close()


def test_a_spool_of_format_1_is_read_and_a_newer_one_refused_in_one_line(tmp_path):
    old = tmp_path / "spool-1"
    Spool(old).add("1", Capture(_graph(), [torch.randn(4, 64), torch.randn(64, 8)], _records()))
    (old / "REPROARCHIVE-SPOOL").write_bytes(b"reproarchive spool 1\n")
    import shutil

    shutil.rmtree(old / "writers")  # spool 1 had none
    assert Spool(old).names() == ["1"]
    (old / "REPROARCHIVE-SPOOL").write_bytes(b"reproarchive spool 3\n")
    with pytest.raises(reproarchive.errors.SourceError, match="spool of a newer reproarchive") as info:
        Spool(old)
    assert "\n" not in str(info.value)
    # through the CLI: exit 4, one line on stderr (a JSON document with --json), nothing written
    said = invoke("pack", str(old), "-o", str(tmp_path / "out"))
    assert said.exit_code == 4 and said.stderr.count("\n") == 1 and "spool of a newer reproarchive" in said.stderr
    assert "Traceback" not in said.output + said.stderr
    document = json.loads(invoke("pack", str(old), "-o", str(tmp_path / "out"), "--json").stdout)
    assert "spool of a newer reproarchive" in json.dumps(document["error"])
    assert not (tmp_path / "out").exists()


def _writer_alive_until_stopped(monkeypatch) -> None:
    """The thread never finishes, so the first call forks a writer, which then stays alive,
    still "writing", until it is killed (what it held on its own measured then)."""
    from reproarchive.sources.capture import snapshot_writer

    monkeypatch.setattr(snapshot_writer, "measure_memory", True)
    _held_in_this_process(monkeypatch, "hash", _unfinished)
    parent, real_write = os.getpid(), Spool.write

    def stalled_write(self, todo, stop=None, views=None):
        if os.getpid() != parent:
            time.sleep(60)
        return real_write(self, todo, stop, views)

    monkeypatch.setattr(Spool, "write", stalled_write)


def _first_call_with_a_live_writer(folder):
    """A spool in ``folder`` whose entry's first call is due: its writer forked and past its
    set-up (``_writer_alive_until_stopped`` keeps it alive). Returns (spool, entry name)."""
    from reproarchive.sources.capture import process_spool

    spool = process_spool.ProcessSpool(folder)
    name = spool.submit(Capture(_graph(), [torch.randn(4, 64), torch.randn(64, 256)], _records()))
    assert spool.wait(name)
    for _ in range(1000):
        if list(spool.spool.folder.glob("pending/*.index")):
            break
        time.sleep(0.01)
    return spool, name


def test_a_forked_writer_does_not_hold_the_heap_the_call_reuses(tmp_path, monkeypatch):
    """(27.1) Memory: the call reuses heap memory freed before the fork for its activations and
    gradients; the forked writer gives its mapping of free heap pages back (``malloc_trim``), so
    those writes copy nothing (without it the writer held about all 64 MiB here)."""

    _writer_alive_until_stopped(monkeypatch)
    freed = [torch.ones(16 << 10) for _ in range(1024)]  # 64 KiB each: heap, not mmap
    del freed
    spool, name = _first_call_with_a_live_writer(tmp_path)
    reused = [torch.full((16 << 10,), 2.0) for _ in range(1024)]  # the call: 64 MiB written
    spool.discard(name)
    assert len(reused) == 1024 and spool.writer_memory < 24 << 20, spool.writer_memory
    spool.close()


@pytest.mark.parametrize("program_froze", [False, True])
def test_a_forked_writer_is_not_copied_the_heap_by_the_parents_garbage_collector(tmp_path, monkeypatch,
                                                                                 program_froze):
    """(27.1) Memory: a full collection in the parent writes the header of every object it
    tracks, which would copy the whole Python heap into a live writer. While a writer lives the
    objects that existed at the fork are frozen (``gc.freeze``), and handed back after. Where
    objects are frozen already (by the program, or a library it loaded: one GPU image's test run
    had 375), they are left frozen, and automatic collections are paused instead."""
    import gc

    if not program_froze and gc.get_freeze_count():
        pytest.skip("objects are frozen in this interpreter already: the case of a program that froze some")
    _writer_alive_until_stopped(monkeypatch)
    objects = [[] for _ in range(400_000)]  # ~30 MiB of objects the collector tracks
    if program_froze:
        gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        spool, name = _first_call_with_a_live_writer(tmp_path)
        if program_froze:  # left frozen (less any frozen object freed meanwhile), collections paused
            assert gc.get_freeze_count() >= len(objects) and not gc.isenabled()
        else:
            assert gc.get_freeze_count() >= len(objects) and gc.isenabled()
        gc.collect()  # the call's collections (an explicit one runs even while paused)
        spool.discard(name)
        assert spool.writer_memory < 12 << 20, spool.writer_memory
        assert gc.isenabled()  # the collector's state given back
        if program_froze:
            assert gc.get_freeze_count() >= len(objects)
        else:  # handed back
            assert gc.get_freeze_count() == frozen
        spool.close()
    finally:
        if program_froze:
            gc.unfreeze()
    assert len(objects) == 400_000
