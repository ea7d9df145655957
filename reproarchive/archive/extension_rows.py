"""``inspect``'s rows for what a graph calls that is not torch's own: custom ops and user Triton
kernels, each with what ``run`` does about it on this machine.

A teammate reading ``inspect`` decides from it whether to replay, and with what: a custom op
this process lacks is not a reason to give up, since ``run`` stands in for it from its recorded
calls; but a pass with a stand-in is no evidence (``run`` says 125), so the row names what to
bring. The wording comes from the same comparisons ``doctor`` makes (``custom_ops.differences``,
``triton_kernels.differences``), so the two commands never disagree.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field

from reproarchive.format.plain import PlainRecord
from reproarchive.format.schema import Index

_OMIT_NONE = {"omit": "none"}


@dataclasses.dataclass(frozen=True)
class CustomOpRow(PlainRecord):
    """One custom op (spec §8 ``custom_ops``): its recorded schema and implementation, how many
    calls the archive holds, and ``here``: whether this process has it as recorded, another
    version of it, or ``run`` stands in for it."""

    name: str
    schema: str
    provenance: str
    calls: int
    here: str
    stand_in: bool  # whether ``run`` (without --import / --load-library) replays it from its recorded calls


@dataclasses.dataclass(frozen=True)
class TritonKernelRow(PlainRecord):
    """One user Triton kernel (spec §8 ``triton_kernels``): name, module, source digest, recorded
    launches and autotuning configurations, and ``here``: ``run`` stands in for it unless the
    user brings the same source (``--import MODULE``)."""

    name: str
    digest: str
    launches: int
    configs: int
    here: str
    module: str | None = field(default=None, metadata=_OMIT_NONE)


def custom_op_rows(index: Index) -> tuple[CustomOpRow, ...]:
    from reproarchive.codec import custom_ops as co
    from reproarchive.codec.stand_ins import is_stand_in

    records = index.custom_ops or ()
    # a stand-in an earlier load installed in this process is not the op: it is still missing
    earlier = [r.name for r in records if is_stand_in(r.name)]
    differing = {row["name"]: row["current"] for row in co.differences(records, stand_ins=earlier)}
    rows = []
    for record in records:
        stand_in = record.name in earlier or co.registered_here(record.name) is None
        rows.append(CustomOpRow(
            name=record.name, schema=record.schema, provenance=co.provenance_text(record.provenance),
            calls=len(record.calls), here=differing.get(record.name, "registered here, as recorded"),
            stand_in=stand_in))
    return tuple(rows)


def triton_kernel_rows(index: Index) -> tuple[TritonKernelRow, ...]:
    """Nothing is imported to tell: ``inspect`` brings no module, so every kernel is stood in
    for unless ``run --import`` brings its source."""
    from reproarchive.codec import triton_kernels as tk

    records = index.triton_kernels or ()
    current = {row["name"]: row["current"] for row in tk.differences(records, {})}
    return tuple(TritonKernelRow(name=r.name, digest=r.digest, launches=len(r.calls), configs=len(r.configs),
                                 here=current.get(r.name, ""), module=r.module) for r in records)

