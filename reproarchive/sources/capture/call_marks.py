"""Which compiled graph's call a process was in when it died (``capture --``, and the in-process
backend, whose guardian reads the marks its process left in its spool).

The crash guard archives a native crash in a graph's compile or first call (the spool entry is
on disk before it). A crash in a later call leaves no archive: writing every call's inputs
first would cost more than the job. It should at least leave the truth: a program killed by
SIGABRT in the third call of a compiled graph is a compiler bug report to file, and one killed
in its own eager code is not. So each later call of a guarded graph marks itself in a small
file mapped into memory (two stores per call, no system call): the graph, the call's number,
and whether it is inside. The process's death leaves the mark as it was, and ``capture --``
(or the spool's guardian) reads it once the process has ended (``in_progress``).

A mark is 64 bytes per process (``calls/<pid>``): a byte that says inside, the call's number
(8 bytes) and the graph's number (4 bytes); the graphs' labels are appended to
``calls/<pid>.labels`` when each is compiled, one per line.
"""

from __future__ import annotations

import itertools
import mmap
import os
import struct
from pathlib import Path
from typing import Any, Callable

from reproarchive.compat import dynamo

MARKS_DIR = "calls"  # beside the crash folder
_SIZE = 64
_LAYOUT = struct.Struct("<BQI")  # inside, the call's number, the graph's number

_mapped: dict[int, mmap.mmap] = {}  # pid -> this process's mark (a forked child makes its own)
_graphs = itertools.count(1)  # the graphs this process compiled, numbered in order


def _mark(folder: Path) -> mmap.mmap:
    pid = os.getpid()
    mark = _mapped.get(pid)
    if mark is None:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / str(pid), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, _SIZE)
            mark = mmap.mmap(fd, _SIZE)
        finally:
            os.close(fd)
        _mapped.clear()  # a forked child does not write its parent's mark
        _mapped[pid] = mark
    return mark


class Marker:
    """The marks of one compiled graph's calls in this process, its label written beside them."""

    def __init__(self, folder: Path, label: str):
        self.graph = next(_graphs)
        self.folder, self.pid, self.mark = folder, 0, None
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / f"{os.getpid()}.labels", "a", encoding="utf-8") as f:
            f.write(f"{self.graph} {' '.join(label.split())}\n")

    def enter(self, call: int) -> None:
        """Mark call number ``call`` as running (a forked child maps a mark of its own)."""
        pid = os.getpid()
        if pid != self.pid:
            self.mark, self.pid = _mark(self.folder), pid
        self.mark[:_LAYOUT.size] = _LAYOUT.pack(1, call, self.graph)

    def leave(self) -> None:
        self.mark[0] = 0


def in_progress(folder: Path) -> list[str]:
    """The calls processes died in, from their marks: "call 3 of the graph compiled as [0/0]
    (...)", one per process whose mark says inside."""
    found = []
    for path in sorted(folder.glob("[0-9]*")):
        if not path.name.isdigit():
            continue
        try:
            inside, call, graph = _LAYOUT.unpack(path.read_bytes()[:_LAYOUT.size])
        except (OSError, struct.error):
            continue
        if inside != 1:
            continue
        labels = {}
        try:
            for line in (folder / f"{path.name}.labels").read_text(encoding="utf-8").splitlines():
                number, _, label = line.partition(" ")
                labels[number] = label
        except OSError:
            pass
        label = labels.get(str(graph), f"number {graph}")
        found.append(f"call {call} of the graph compiled as {label}")
    return found


def label_of(gm: Any) -> str:
    """What a person reads of a compiled graph: the compile's id and the user's line it starts
    at (``[0/0] (train.py:14 in f)``), from Dynamo's graph ``gm``."""
    from reproarchive.codec.stacks import parse_stack  # light, but kept out of every capture process's start-up

    stack = parse_stack(next((n.stack_trace for n in gm.graph.nodes if n.op == "call_function" and n.stack_trace), ""))
    place = f" ({Path(stack[-1].file).name}:{stack[-1].line} in {stack[-1].name})" if stack else ""
    return f"[{dynamo.current_compile_id()}]{place}"


def marked(fn: Callable, args: tuple, kwargs: dict, marker: Marker | None, call: int) -> Any:
    """``fn(*args, **kwargs)``, marked as call ``call`` of ``marker``'s graph while it runs: a
    native crash inside leaves the mark. Marking never stands in the way of the call."""
    if marker is None:
        return fn(*args, **kwargs)
    try:
        marker.enter(call)
    except Exception:  # noqa: BLE001 - never in place of the program's own run
        return fn(*args, **kwargs)
    try:
        return fn(*args, **kwargs)
    finally:
        marker.leave()
