"""What a compile needs to know of a recorded GPU, from the archive's system record.

A compile-only replay (``replay.compile_only``) compiles for a CUDA device this machine lacks:
Inductor and Triton read the device's properties, and the archive's system record holds them
for each GPU of the recording machine (spec §8 ``system.cuda.devices``): name, compute
capability, SM count, memory, and (open keys of the record, written by captures since this
release) warp size, registers and threads per SM, shared memory per block. Older archives lack
those, and a TORCH_TRACE log names only some of them; they are fixed by the
compute capability on NVIDIA devices (CUDA C Programming Guide, "Technical Specifications per
Compute Capability"), so they are taken from that table and named in ``derived``, never
passed off as recorded. A capability the table does not know, or a device the record does not
describe, cannot be compiled for: ``describe`` says why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from reproarchive.codec.device_runtime import COMPILE_PROPERTIES

#: Per compute capability: (max threads per SM, max shared memory per block with opt-in).
#: Every NVIDIA capability from 5.0 on has a warp of 32, 64K registers per SM and 48 KiB of
#: shared memory per block without opt-in.
_BY_CAPABILITY: Mapping[tuple[int, int], tuple[int, int]] = {
    (7, 0): (2048, 98304), (7, 2): (2048, 98304), (7, 5): (1024, 65536),
    (8, 0): (2048, 166912), (8, 6): (1536, 101376), (8, 7): (2048, 166912), (8, 9): (1536, 101376),
    (9, 0): (2048, 232448), (10, 0): (2048, 232448), (10, 3): (2048, 232448),
    (12, 0): (1536, 101376), (12, 1): (1536, 101376),
}
_FIXED = {"warp_size": 32, "regs_per_multiprocessor": 65536, "shared_memory_per_block": 49152}

#: The properties a device's record may hold beyond ``GpuInfo``'s fields (open keys, spec §8
#: ``system``), which archives written before this release, and logs, lack.
LATER_FIELDS = COMPILE_PROPERTIES


@dataclasses.dataclass(frozen=True)
class GpuDescription:
    """One recorded GPU as a compile sees it: ``properties`` are what torch's
    ``get_device_properties`` gave on the recording machine (the ones a compile reads),
    ``derived`` names those taken from the capability table instead."""

    index: int
    properties: Mapping[str, Any]
    derived: tuple[str, ...] = ()

    @property
    def target(self) -> str:
        return f"sm_{self.properties['major']}{self.properties['minor']}"

    def said(self) -> str:
        """``cuda:0 sm_90 (NVIDIA H200)``, for a verdict."""
        return f"cuda:{self.index} {self.target} ({self.properties['name']})"


class NotDescribed(Exception):
    """The archive does not describe a device well enough to compile for it."""


def describe(system: Any, devices: Iterable[str]) -> list[GpuDescription]:
    """The recorded description of each CUDA device in ``devices`` (``cuda:0`` ...), from the
    typed system record ``system``. Raises NotDescribed, saying what is missing."""
    import torch

    cuda = getattr(system, "cuda", None)
    recorded = {g.index: g for g in (getattr(cuda, "devices", None) or ()) if g.index is not None}
    out: list[GpuDescription] = []
    for name in devices:
        dev = torch.device(name)
        if dev.type != "cuda":
            raise NotDescribed(f"{name} is not a CUDA device; only CUDA devices can be compiled for without them")
        index = 0 if dev.index is None else dev.index  # "cuda" is the current device, 0 in a compile
        if any(g.index == index for g in out):
            continue
        gpu = recorded.get(index)
        if gpu is None:
            raise NotDescribed(f"the archive's system record does not describe {name} (the machine that packed it "
                               "listed no such GPU)")
        if getattr(system, "torch", None) is not None and getattr(system.torch, "hip", None):
            raise NotDescribed(f"{name} was a ROCm device; compiling for it without the device is not supported")
        out.append(_described(index, gpu))
    return out


def _described(index: int, gpu: Any) -> GpuDescription:
    try:
        major, minor = (int(p) for p in str(gpu.capability).split("."))
    except (TypeError, ValueError):
        raise NotDescribed(f"cuda:{index}'s compute capability is not recorded ({gpu.capability!r})") from None
    if not gpu.name or not gpu.multi_processor_count:
        raise NotDescribed(f"cuda:{index}'s name or SM count is not recorded")
    props: dict[str, Any] = {"name": gpu.name, "major": major, "minor": minor,
                             "multi_processor_count": int(gpu.multi_processor_count),
                             "total_memory": int(gpu.total_memory or 0), "gcnArchName": ""}
    derived = []
    extra = dict(getattr(gpu, "extra", None) or {})
    for field in LATER_FIELDS:
        value = getattr(gpu, field, None)
        value = extra.get(field) if value is None else value
        if value is None:
            value = _from_capability(field, (major, minor))
            if value is None:
                raise NotDescribed(f"cuda:{index} has compute capability {major}.{minor}, for which the archive "
                                   f"records no {field} and the capability table has none")
            derived.append(field)
        props[field] = int(value)
    return GpuDescription(index, props, tuple(derived))


def _from_capability(field: str, capability: tuple[int, int]) -> int | None:
    if capability[0] < 7:
        return None
    if field in _FIXED:
        return _FIXED[field]
    row = _BY_CAPABILITY.get(capability)
    if row is None:
        return None
    return row[0] if field == "max_threads_per_multi_processor" else row[1]
