"""How long work reports its progress: a callback, no text.

Packing, loading and checking gigabytes take seconds; people want a bar, scripts want silence,
and the library knows neither. So the library only counts: functions that do such work take
``progress``, a callable ``progress(task, done, total)`` called as work advances (``task`` is
"pack", "load", "verify" or "unpack"; ``done`` and ``total`` are bytes). Drawing a bar is the
CLI's business (``reproarchive.cli.progress``). ``None`` (or False) means nobody is listening.
"""

from __future__ import annotations

from typing import Callable, Optional

ProgressFn = Callable[[str, int, int], None]


class Tracker:
    """Counts bytes of one task and reports the running total to a ``ProgressFn``."""

    def __init__(self, progress: Optional[ProgressFn], task: str, total: int):
        self._fn = progress or None
        self._task = task
        self.total = total
        self.done = 0
        if self._fn is not None:
            self._fn(task, 0, total)

    def update(self, n: int) -> None:
        self.done += n
        if self._fn is not None:
            self._fn(self._task, self.done, self.total)
