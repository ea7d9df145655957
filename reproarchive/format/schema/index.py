"""The index member itself (spec §5 ``container``, §6), part of the schema: the member list and
``Index``, which holds every other record of the schema.

Data only, like every schema module (``schema_check`` refuses anything else here).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from reproarchive.format.plain import omit_none
from reproarchive.format.schema.custom_ops import CustomOpRecord, TritonKernelRecord
from reproarchive.format.schema.graph import GraphRecord
from reproarchive.format.schema.job import JobRecord
from reproarchive.format.schema.sections import Records
from reproarchive.format.schema.sets import DigestAlgorithm
from reproarchive.format.schema.values import StorageRecord, Value
from reproarchive.format.schema.version import FORMAT_NAME, FORMAT_VERSION

# -- §5 container --------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemberRecord:
    name: str
    size: int
    first_frame: int
    frames: int


@dataclass(frozen=True)
class ContainerRecord:
    frame_size: int
    zstd_level: int | None = None
    zstd_library: str | None = None
    members: tuple[MemberRecord, ...] = ()


# --------------------------------------------------------------------------------------------
# the index


@dataclass(frozen=True)
class Index:
    """The whole index member (spec §6); section order is the order ``decode_index`` checks."""

    container: ContainerRecord
    digest_algorithm: DigestAlgorithm
    storages: tuple[StorageRecord, ...]
    inputs: tuple[Value, ...]
    graph: GraphRecord
    records: Records = field(default_factory=Records, metadata={"inline": True})
    format: str = FORMAT_NAME
    version: str = FORMAT_VERSION
    job: JobRecord | None = omit_none()  # (1.3) absent for a single-process archive
    custom_ops: tuple[CustomOpRecord, ...] | None = omit_none()  # (1.3) absent, not nil, when none
    triton_kernels: tuple[TritonKernelRecord, ...] | None = omit_none()  # (1.4) absent, not nil, when none

    def tensor_records(self):
        """Every tensor record: inputs first, then module state, then the recorded outputs of
        custom ops, then what Triton kernels wrote (the order storages are numbered)."""
        for value in self.inputs:
            yield from value.tensors()
        yield from self.graph.tensors()
        for op in self.custom_ops or ():
            yield from op.tensors()
        for kernel in self.triton_kernels or ():
            yield from kernel.tensors()

    def job_tensor_records(self):
        """The tensor records of the other ranks (§8 ``job``): their inputs, then their graphs'."""
        if self.job is None:
            return
        for rank in self.job.ranks:
            for value in rank.inputs or ():
                yield from value.tensors()
        for graph in self.job.graphs:
            yield from graph.tensors()

    def storage_of(self, value: Any) -> StorageRecord:
        return self.storages[value.storage]

    def not_original_inputs(self, records: Records | None = None, inputs: tuple | None = None) -> dict[int, str]:
        """``Records.not_original_inputs`` of this archive's inputs: every reader that reports
        fidelity reports this too. ``records``/``inputs``: a rank's of a job (default: the index's)."""
        return (records or self.records).not_original_inputs(len(self.inputs if inputs is None else inputs))
