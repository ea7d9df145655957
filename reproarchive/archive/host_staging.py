"""How a spool reads storages: CPU ones in place, device ones through reused pinned buffers.

Capture writes what a crash would leave before a graph first runs, in jobs that may hold most
of their accelerator's memory in weights: capture must take none of it. So a device storage is
never copied on the device, nor whole to the host (``storage.cpu()`` would take its full size
in host memory at once): it is copied in chunks of ``CHUNK`` bytes into a page-locked host
buffer (``non_blocking`` copies on a side stream that first waits for the job's current
stream, so the copies overlap the job's own kernels), and each chunk is hashed or written
before the next is copied. The buffers are lent out and given back, one per thread reading a
device storage at once: the spool hashes up to ``MAX_BUFFERS`` device storages side by side
(one core hashes about 1 GB/s, and a graph's first call waits for its inputs' digests), so
host memory is at most ``MAX_BUFFERS * CHUNK`` per device, reused for every storage the
process spools. Device memory used: none.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import torch

from reproarchive.archive.packing import is_zero_bytes
from reproarchive.codec.tensors import storage_view
from reproarchive.format import digests

CHUNK = 8 << 20
#: The most device storages read at once (and so pinned buffers held) per device.
MAX_BUFFERS = 8


class HostStaging:
    """The reused host buffers of one process: a free list per device, each buffer lent to one
    reader at a time."""

    def __init__(self, chunk: int = CHUNK):
        self.chunk = chunk
        self._free: dict[Any, list[Any]] = {}
        self._made: list[Any] = []
        self._lock = threading.Lock()

    @property
    def buffers(self) -> list[Any]:
        """Every buffer made so far (what this process holds in page-locked memory)."""
        with self._lock:
            return list(self._made)

    def chunks(self, storage: Any) -> Iterator[memoryview]:
        """The bytes of ``storage`` in order: a CPU storage in one piece, in place; a device
        storage chunk by chunk, each valid until the next is asked for."""
        if storage.nbytes() == 0:
            return
        if storage.device.type == "cpu":
            yield storage_view(storage)
            return

        source = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
        buffer = self._borrow(storage.device)
        try:
            yield from device_chunks(source, buffer, self.chunk)
        finally:
            with self._lock:
                self._free[storage.device].append(buffer)

    def digest(self, storage: Any, algorithm: str) -> str | None:
        """``algorithm:hex`` of ``storage``'s bytes, or None when they are all zero (stored as
        a fill, as ``pack`` stores them)."""
        hasher = digests.new_hasher(algorithm)
        zero = storage.nbytes() > 0
        for chunk in self.chunks(storage):
            zero = zero and is_zero_bytes(chunk)
            hasher.update(chunk)
        return None if zero else f"{algorithm}:{hasher.hexdigest()}"

    def _borrow(self, device: Any) -> Any:
        with self._lock:
            free = self._free.setdefault(device, [])
            if free:
                return free.pop()
        buffer = host_buffer(self.chunk)  # outside the lock: pinning takes a while
        with self._lock:
            self._made.append(buffer)
        return buffer


def host_buffer(size: int) -> Any:
    """``size`` bytes of page-locked host memory (plain memory where pinning is unavailable)."""

    try:
        return torch.empty(size, dtype=torch.uint8, pin_memory=True)
    except RuntimeError:  # no accelerator to pin for
        return torch.empty(size, dtype=torch.uint8)


def device_chunks(source: Any, buffer: Any, chunk: int) -> Iterator[memoryview]:
    """``source`` (a 1-D uint8 tensor) through ``buffer`` (host, at least ``chunk`` bytes),
    ``chunk`` bytes at a time, each copy on a side stream of the source's device."""
    streams = _side_stream(source.device)
    total = source.numel()
    for start in range(0, total, chunk):
        n = min(chunk, total - start)
        if streams is None:
            buffer[:n].copy_(source[start:start + n])
        else:
            module, side = streams
            with module.stream(side):
                buffer[:n].copy_(source[start:start + n], non_blocking=True)
            side.synchronize()
        yield storage_view(buffer.untyped_storage())[:n]


def _side_stream(device: Any) -> tuple[Any, Any] | None:
    """(torch.<device type> module, a stream that waits for the device's current one), or
    None for devices without streams (CPU, meta)."""

    module = getattr(torch, device.type, None)
    if device.type in ("cpu", "meta") or module is None or not hasattr(module, "Stream"):
        return None
    side = module.Stream(device=device)
    side.wait_stream(module.current_stream(device))
    return module, side
