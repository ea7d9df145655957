"""Who faulthandler reports a fatal signal to: the program's choice first, then ours.

A process that dies by a signal cannot say how it died, and only its parent can wait for its
exit status. faulthandler can: turned on, it writes ``Fatal Python error: Segmentation fault``
and the Python stacks to a file as the process dies. Two parts of capture want that report in
a file of their own (the spool's guardian, a rank of a multi-rank job); faulthandler has one.
Where the program turned faulthandler on itself its report goes where the program said and
neither takes it over; between ours, the later one takes it (a rank's report names the rank).
"""

from __future__ import annotations

import faulthandler
from typing import IO

_ours: list[IO[str]] = []  # the files we pointed faulthandler at, latest last (kept open)


def watch(file: IO[str]) -> bool:
    """Have faulthandler report a fatal signal of this process, all threads, to ``file`` (open
    for the life of the process), unless the program turned faulthandler on itself. False then."""
    if faulthandler.is_enabled() and not _ours:
        return False
    faulthandler.enable(file=file, all_threads=True)
    _ours.append(file)
    return True


def watching(file: IO[str] | None) -> bool:
    """Whether faulthandler reports to ``file`` now (never to None)."""
    return bool(_ours) and _ours[-1] is file and faulthandler.is_enabled()
