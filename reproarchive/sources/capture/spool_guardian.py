"""The process that turns a spool into archives when the capturing process dies.

A native crash (segfault, abort, fatal device assert) in a compiled graph's first call ends the
process where nothing can be written any more. The spool (``process_spool``) already holds what
the archive needs, but completing it takes a process that is alive: this one. It is started
with the process's first spool, is told of each spool the process makes, imports nothing
heavy, and waits. When the process is gone it
looks at the spool: a process that ended normally removed it (nothing to do); one that died
left its entries, the graphs that were in their first call, and each is completed into the
archive the backend would have written (the backend names each entry after its archive:
``repro-<hash>.tar.zst`` in the capture's folder, or its file target), then the spool is
removed. So the in-process backend keeps the promise of the archive written before the first
run: a process that dies leaves an archive, not a spool to pack by hand.

What ``multiprocessing``'s resource tracker does for shared memory, for the same reason: the
process that should clean up cannot. The guardian learns of the death from a pipe whose write
end only the capturing process holds (the end is not inherited by programs it starts), and, in
case a forked child of the process still holds it, from being adopted by another parent. It
ignores Ctrl-C (the process decides), has its own session, runs at the lowest priority (it
idles beside the job, and completes once the job's cores are free), and says what it wrote on
the stderr it shares with the process, one line per archive, as a crash handler would. Where the
capture shares its failures (``capture(store=...)``), each archive is pushed to that store too,
so a job that dies in CI shares its crash as it shares its other failures; a push that fails is
one line, and the archive stays on disk for ``reproarchive push``.

A process cannot tell another how it died, and the guardian is not its parent (it cannot wait
for its exit status). So, unless the program turned faulthandler on itself, the process has
faulthandler write a fatal signal's report (``Fatal Python error: Segmentation fault`` and the
crashing thread's Python stack) to a file the guardian reads once the process is gone: its
archives then record the signal and that stack, as a replay would (spec §8). Death by a signal
faulthandler does not catch (``SIGKILL``: the out-of-memory killer) leaves the signal unknown,
as before.

``capture --`` completes its program's spool itself and starts no guardian.
"""

from __future__ import annotations

# Imports inside functions: this module is also the guardian process's entry point, started
# beside every capturing process before anything fails; what turning a spool into archives needs
# is imported only when there is one.
import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

ARCHIVE_SUFFIX = ".tar.zst"
_POLL_S = 0.5  # how often an adoption is looked for, when the pipe is held open by a fork


class Guardian:
    """This process's guardian: ``guard(spool, store)`` adds a spool (and a store its archives
    go to); if this process dies, each entry left in a guarded spool is completed into ``<the
    spool's folder>/<entry name>`` (the backend names an entry after its archive), and pushed to
    each store named with it. One per process, whatever the number of spools."""

    def __init__(self):
        from reproarchive.child import python_path

        read_end, self._write_end = os.pipe()  # both non-inheritable: no program we start holds them
        self.pid = os.getpid()
        self._fault = _watch_for_a_fatal_signal()
        env = dict(os.environ, PYTHONPATH=python_path())
        try:
            self.proc = subprocess.Popen([*_lowest_priority(), sys.executable, "-m", __name__, str(read_end),
                                          str(self.pid), self._fault.name if self._fault else ""], env=env,
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, pass_fds=(read_end,),
                                         start_new_session=True)
        except BaseException:
            os.close(self._write_end)
            if self._fault is not None:  # nobody would read it
                with contextlib.suppress(OSError):
                    os.unlink(self._fault.name)
            raise
        finally:
            os.close(read_end)

    def guard(self, spool: Path, store: str | None = None) -> None:
        os.write(self._write_end, json.dumps({"spool": str(spool), "store": store}).encode() + b"\n")

    def close(self) -> None:
        """This process is ending normally (its spools removed first): the guardian ends too,
        finding nothing to complete."""
        if self._write_end < 0:
            return
        os.close(self._write_end)
        self._write_end = -1
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # a loaded machine: it ends on its own
            pass


def _watch_for_a_fatal_signal() -> Any:
    """A file faulthandler writes this process's fatal signal to (open for the life of the
    process), or None where the program has faulthandler on already (its report goes where
    the program said: ``fault_handler``) or no file can be made."""
    import faulthandler
    import tempfile

    from reproarchive.sources.capture import fault_handler

    if faulthandler.is_enabled():
        return None
    try:
        fault = tempfile.NamedTemporaryFile("w", prefix="reproarchive-fault-", suffix=".txt", delete=False)
    except OSError:
        return None
    if not fault_handler.watch(fault):
        fault.close()
        os.unlink(fault.name)
        return None
    return fault


def _lowest_priority() -> list[str]:
    """The guardian idles until the process dies, and then has its cores: started at the lowest
    priority (``nice``), its interpreter's start-up (~0.08 s of CPU) no longer takes a core from
    the compile and first call it is started in (on one core, ~0.05x of an eager first call)."""
    found = shutil.which("nice")
    return [found, "-n", "19"] if found else []


def _guarded_until_death(fd: int, parent: int) -> dict[Path, list[str]]:
    """The spools named on ``fd``, each with the stores its archives go to, until the process
    that named them is gone."""
    spools: dict[Path, list[str]] = {}
    buffer = b""
    while True:
        ready, _, _ = select.select([fd], [], [], _POLL_S)
        if ready:
            data = os.read(fd, 65536)
            if not data:
                return spools
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            for line in filter(None, lines):
                told = json.loads(line)
                stores = spools.setdefault(Path(told["spool"]), [])
                if told.get("store") and told["store"] not in stores:
                    stores.append(told["store"])
        if os.getppid() != parent:
            return spools


def complete_left_spool(spool: Path, folder: Path, fault: str = "") -> list[Path]:
    """Complete every entry a dead process left in ``spool`` into ``folder/<its name>`` (an
    entry named by a number gets ``repro-<pid>-<number>.tar.zst``); remove the spool. Returns
    the archives written (none: the spool held no entry, or was gone; then a later call the
    process died in, marked in the spool by ``call_marks``, is named). ``fault``: faulthandler's
    report of the death, whose signal and stack the archives then record."""
    from reproarchive.archive.spool_folder import SpoolFolder, is_spool
    from reproarchive.context.failure import crash_record, fault_signal
    from reproarchive.sources.capture.call_marks import MARKS_DIR, in_progress

    if not is_spool(spool):
        return []
    crashed_in = in_progress(spool / MARKS_DIR)  # read before the spool goes
    pid = spool.name.rpartition("-")[2]
    signal_name = fault_signal(fault)
    died = f"process {pid} died{f' by {signal_name}' if signal_name else ''}"

    def failure(pending: Any) -> Any:  # the crash each entry was written for, its signal now known
        return crash_record(signal_name, f"{died} while the compiled graph ran for the first time (this archive was "
                            "written just before it ran)", fault, backend=pending.backend)

    written = []
    for done in SpoolFolder(spool).complete_each(  # waits for the forked writers of the process to finish
            lambda name: folder / (name if name.endswith(ARCHIVE_SUFFIX) else f"repro-{pid}-{name}{ARCHIVE_SUFFIX}"),
            failure=failure if signal_name else None):
        written.append(done.path)
        note = f" ({done.absent} storage(s) unwritten at the crash: stored as absent)" if done.absent else ""
        print(f"reproarchive: {died} in a compiled graph's first call; "
              f"archive written to {done.path}{note}", file=sys.stderr, flush=True)
    if not written and crashed_in:
        print(f"reproarchive: {died} in {'; '.join(crashed_in)}, and nothing was archived: capture guards a "
              "compiled graph's first call against a crash, not its later calls (to archive it, make the failing "
              "input that graph's first call: run the failing step alone)", file=sys.stderr, flush=True)
    return written


def share(archives: list[Path], stores: list[str]) -> bool:
    """Push ``archives`` to each of ``stores``, one line each on stderr; False if one failed."""
    if not archives or not stores:
        return True
    from reproarchive.store.push import push

    shared = True
    for store in stores:
        try:
            results = push(archives, store)
        except Exception as err:  # noqa: BLE001 - one line; the archives stay on disk
            print(f"reproarchive: could not push {len(archives)} archive(s) to {store}: {type(err).__name__}: {err}; "
                  f"run `reproarchive push ARCHIVE {store}`", file=sys.stderr, flush=True)
            shared = False
            continue
        for result in results:
            print(f"reproarchive: pushed to {result.store}/{result.name}", file=sys.stderr, flush=True)
    return shared


def main(argv: list[str]) -> int:
    fd, parent = int(argv[0]), int(argv[1])
    fault_file = Path(argv[2]) if len(argv) > 2 and argv[2] else None
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    status = 0
    spools = _guarded_until_death(fd, parent)
    fault = ""
    if fault_file is not None:
        with contextlib.suppress(OSError):
            fault = fault_file.read_text(errors="replace")
        with contextlib.suppress(OSError):
            fault_file.unlink()
    for spool, stores in spools.items():
        try:
            written = complete_left_spool(spool, spool.parent, fault)
        except Exception as err:  # noqa: BLE001 - one line; the spool stays for ``reproarchive pack``
            print(f"reproarchive: could not complete the spool {spool} the dead process {parent} left: "
                  f"{type(err).__name__}: {err}; run `reproarchive pack {spool}`", file=sys.stderr, flush=True)
            status = 1
            continue
        if not share(written, stores):
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
