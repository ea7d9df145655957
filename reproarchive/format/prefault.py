"""Faulting in fresh memory in one call before writing into it.

Memory a loader allocates for its result is new, so each 4 KiB page would fault on its first
write, one trap each. ``MADV_POPULATE_WRITE`` maps a whole range in one system call instead
(measured in the VM of benchmarks/README.md: 0.3-0.65 s vs 0.5-0.95 s of system time per
GiB). Transparent huge pages (``MADV_HUGEPAGE``) were measured too and cost more there
(1.4-1.9 s per GiB in a fresh process), so they are not asked for.
"""

from __future__ import annotations

import ctypes
import sys

MADV_POPULATE_WRITE = 23  # Linux 5.14+
_PAGE = 4096
_madvise = None


def prefault(address: int, size: int) -> None:
    """Populate the whole pages of ``[address, address + size)``; a hint, silently skipped
    where unsupported (other systems, older kernels)."""
    global _madvise
    if size < (1 << 20):
        return
    if _madvise is None:
        _madvise = False
        if sys.platform.startswith("linux"):
            try:
                fn = ctypes.CDLL(None, use_errno=True).madvise
                fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
                fn.restype = ctypes.c_int
                _madvise = fn
            except (OSError, AttributeError):
                pass
    if _madvise:
        start = (address + _PAGE - 1) & ~(_PAGE - 1)
        end = (address + size) & ~(_PAGE - 1)
        if end > start:
            _madvise(start, end - start, MADV_POPULATE_WRITE)  # EINVAL on older kernels is fine
