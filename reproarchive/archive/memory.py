"""How much memory a load may take, checked before it allocates anything (spec §9).

An archive's index declares every storage's size, real and absent alike, and a 1.5 KB archive
can declare gigabytes of absent data that load would generate. Allocating first and failing
later means an OOM kill without a word (Linux overcommits, so the allocation itself succeeds);
so ``load`` adds up what the records declare per device and refuses, with one line that says
how much and where, when it exceeds what this machine has available or the caller's
``max_memory``.
"""

from __future__ import annotations

from typing import Iterable

from reproarchive.codec.device_runtime import free_memory
from reproarchive.errors import LimitExceededError


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def check_declared_memory(sizes: Iterable[tuple[int, object]], *, max_memory: int | None = None) -> None:
    """Refuse before allocating when the storages (``(bytes, torch.device)`` pairs) need more
    than ``max_memory`` in all, or more than a device (host memory for CPU storages) has free."""
    by_device: dict[str, int] = {}
    devices = {}
    for size, device in sizes:
        key = "cpu" if device.type in ("cpu", "meta") else str(device)
        if device.type == "meta":
            continue  # meta storages take no memory
        by_device[key] = by_device.get(key, 0) + size
        devices[key] = device
    total = sum(by_device.values())
    if max_memory is not None and total > max_memory:
        raise LimitExceededError(
            f"the archive's storages need {_size(total)}, more than the --max-memory limit of {_size(max_memory)}",
            "raise --max-memory if this machine can hold them, or check the archive with `reproarchive inspect`",
        )
    for key, need in by_device.items():
        free = free_memory(devices[key])
        if free is not None and need > free:
            where = "memory available on this machine" if key == "cpu" else f"free memory on {key}"
            raise LimitExceededError(
                f"the archive's storages need {_size(need)} on {key}, more than the {_size(free)} of {where}",
                "replay on a machine with more memory, or check the archive with `reproarchive inspect`",
            )
