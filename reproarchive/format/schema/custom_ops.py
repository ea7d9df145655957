"""Code from outside torch, as data (spec §8, 1.3 and 1.4), part of the schema: custom ops
(their schema, provenance and recorded calls) and user Triton kernels (source, configurations,
launches). Nothing here is ever compiled or run from an archive (spec §9).

Data only, like every schema module (``schema_check`` refuses anything else here).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any  # noqa: F401 - open records' ``extra`` field type is resolved here

from reproarchive.format.plain import PlainData, omit_none, open_record
from reproarchive.format.schema.values import Value

# -- §8 custom ops (1.3) -------------------------------------------------------------------------


@open_record
class OpProvenance:
    """(1.3) Where a custom op's implementation came from, so a replaying machine can tell
    whether it has the same one: ``kind`` ``python`` (``module`` and ``digest``: the sha256 of
    the defining function's source), ``library`` (``library``: the shared library's file name,
    never its path, and ``digest``: the file's sha256) or ``unknown``."""

    kind: str = "unknown"
    module: str | None = omit_none()
    library: str | None = omit_none()
    digest: str | None = omit_none()


@dataclass(frozen=True)
class CustomOpCall:
    """(1.3) One call of a custom op in the failing run: each schema argument by content
    (``arguments``: a tensor as ``<dtype>[<shape>] <digest of its contiguous bytes>``, any
    other argument as its plain value) and the op's real outputs, as value records whose
    tensors are storages of the table (deduplicated like any storage)."""

    arguments: tuple[PlainData, ...] = ()
    outputs: tuple[Value, ...] = ()


@dataclass(frozen=True)
class CustomOpRecord:
    """(1.3) An operator of the graph that is not torch's own: ``name`` (``ns::op.overload``),
    its ``schema`` as torch prints it, the dispatch keys it had kernels for, whether it had a
    fake (meta) implementation, where its implementation came from, and its calls in the
    failing run (none when the source could not run it on real data)."""

    name: str
    schema: str
    dispatch_keys: tuple[str, ...] = ()
    fake: bool = False
    provenance: OpProvenance | None = omit_none()
    calls: tuple[CustomOpCall, ...] = ()

    def tensors(self):
        for call in self.calls:
            for value in call.outputs:
                yield from value.tensors()


# -- §8 user Triton kernels (1.4) -----------------------------------------------------------------


@dataclass(frozen=True)
class TritonConfig:
    """(1.4) One autotuning configuration of a user Triton kernel, as data: its meta-parameters
    and launch options. Informative: a reader never compiles or launches anything from it; a
    kernel the user brings is bound only when its configurations equal these."""

    kwargs: dict[str, PlainData] = field(default_factory=dict)
    num_warps: int | None = omit_none()
    num_stages: int | None = omit_none()
    num_ctas: int | None = omit_none()


@dataclass(frozen=True)
class TritonCall:
    """(1.4) One launch of a user Triton kernel in the failing run: which ``constants`` entry of
    its record it used, each tensor argument before the launch by content (``arguments``: name ->
    ``<dtype>[<shape>] <digest>``, as custom-op calls key them) and the tensors the launch changed,
    as they were after it (``written``: name -> value record over the storage table)."""

    constants: int
    arguments: dict[str, str] = field(default_factory=dict)
    written: dict[str, Value] = field(default_factory=dict)


@dataclass(frozen=True)
class TritonKernelRecord:
    """(1.4) A user Triton kernel the graph launches (``triton_kernel_wrapper_mutation`` /
    ``_functional`` with ``kernel_idx`` = ``index``): its source as data with the digest that
    identifies it, its parameters, constexprs and autotuning configurations, the non-tensor
    arguments of each call site (``constants``, named by the nodes' ``constant_args_idx``) and
    its launches in the failing run. The source is never compiled from the archive (spec §9)."""

    index: int
    name: str
    source: str
    digest: str
    arg_names: tuple[str, ...] = ()
    constexprs: tuple[str, ...] = ()
    module: str | None = omit_none()
    configs: tuple[TritonConfig, ...] = ()
    autotune_key: tuple[str, ...] = ()
    constants: tuple[dict[str, PlainData], ...] = ()
    calls: tuple[TritonCall, ...] = ()

    def tensors(self):
        for call in self.calls:
            for value in call.written.values():
                yield from value.tensors()
