"""Progress for people: bars on stderr for the library's progress callbacks.

Bars appear only on a terminal and only for work worth one (256 MiB of bytes, or any count of
steps), so scripts and CI logs stay clean; ``--quiet`` and ``--json`` turn them off.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any, Callable, Iterator

AUTO_THRESHOLD_BYTES = 256 << 20


@contextlib.contextmanager
def byte_bars(enabled: bool = True) -> Iterator[Callable[[str, int, int], None] | None]:
    """A ``progress(task, done, total)`` callback drawing one tqdm bar per task, or None."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    bars: dict[str, Any] = {}

    def progress(task: str, done: int, total: int) -> None:
        if total < AUTO_THRESHOLD_BYTES:
            return
        bar = bars.get(task)
        if bar is None:
            from tqdm import tqdm

            bar = bars[task] = tqdm(total=total, desc=task, unit="B", unit_scale=True, unit_divisor=1024,
                                    file=sys.stderr, leave=False, dynamic_ncols=True)
        bar.update(done - bar.n)

    try:
        yield progress
    finally:
        for bar in bars.values():
            bar.close()


@contextlib.contextmanager
def step_bar(enabled: bool, total: int, desc: str) -> Iterator[Callable[[str], None]]:
    """A bar advanced by named stages (what ``pack`` reports while it imports a dump)."""
    if not enabled or not sys.stderr.isatty():
        yield lambda stage: None
        return
    from tqdm import tqdm

    bar = tqdm(total=total, desc=desc, unit="step", file=sys.stderr, leave=False, dynamic_ncols=True)

    def step(stage: str) -> None:
        bar.set_postfix_str(stage)
        bar.update(1)

    try:
        yield step
    finally:
        bar.close()


def minify_status(stream=None) -> Callable[[Any], None]:
    """A one-line minify status on stderr (rewritten in place on a terminal, every 5 s otherwise)."""
    stream = stream or sys.stderr
    tty = stream.isatty()
    last = [0.0]

    def show(p) -> None:
        now = time.monotonic()
        if not tty and now - last[0] < 5:
            return
        last[0] = now
        line = (f"minify: {p.calls} candidates tested, {p.cache_hits} cache hits, "
                f"candidate {p.candidate_ops} ops, best {p.best_ops} ops ({p.pass_name}, {p.elapsed_s:.0f}s)")
        stream.write(("\r\033[K" if tty else "") + line + ("" if tty else "\n"))
        stream.flush()

    return show
