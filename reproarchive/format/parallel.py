"""How many threads the byte layer's pools use, and the one way they run a batch of work.
"""

from __future__ import annotations

import concurrent.futures
import os
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")


def worker_threads() -> int:
    """Threads for hashing and compressing: the cores this process may use, at most 4."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(4, cores))


def run_all(work: Callable[[T], object], items: Sequence[T], *, jobs: int, name: str) -> None:
    """Run ``work`` on every item on up to ``jobs`` threads; the first failure cancels what has
    not started and is raised (a transfer that fails stops the others instead of finishing them)."""
    with concurrent.futures.ThreadPoolExecutor(max(1, min(jobs, len(items))), thread_name_prefix=name) as pool:
        futures = [pool.submit(work, item) for item in items]
        try:
            for f in concurrent.futures.as_completed(futures):
                f.result()
        except BaseException:
            for f in futures:
                f.cancel()
            raise
