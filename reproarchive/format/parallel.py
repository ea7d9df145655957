"""How many threads the byte layer's pools use.
"""

from __future__ import annotations

import os


def worker_threads() -> int:
    """Threads for hashing and compressing: the cores this process may use, at most 4."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(4, cores))
