"""Storages and values (spec §6.2, §6.3), part of the schema: what a graph's inputs, its tensor
attributes and the recorded outputs of custom ops and Triton kernels are stored as.

Data only, like every schema module (``schema_check`` refuses anything else here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar, Union

from reproarchive.format.plain import PlainData, Tagged, _Dim, omit_none
from reproarchive.format.schema.sets import DERIVED_KINDS, SCALAR_KINDS, SYMBOL_KINDS, Fidelity

# -- §6.2 storages -------------------------------------------------------------------------------


@dataclass(frozen=True)
class StorageRecord:
    """One distinct storage. ``digest`` names its blob (real data) unless ``fill`` is 0 (all zero
    bytes, no blob); an ``absent`` storage has neither: the source never had its data."""

    size: int
    device: str
    fidelity: Fidelity
    digest: str | None = None
    fill: int | None = None

    @property
    def is_real(self) -> bool:
        return self.fidelity == "real"


# -- §6.3 values ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorValue:
    TAG_KEY: ClassVar[str] = "kind"
    TAG: ClassVar[str] = "tensor"
    storage: int
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    requires_grad: bool
    is_leaf: bool
    dynamic: tuple[_Dim, ...] = ()
    name: str | None = None

    def tensors(self):
        yield self


@dataclass(frozen=True)
class ScalarValue:
    """``int``, ``float``, ``bool`` or ``str`` with its ``value``, or ``none``."""

    kind: str
    value: PlainData = omit_none()

    def tensors(self):
        return iter(())


@dataclass(frozen=True)
class SymValue:
    """A symbolic ``symint``, ``symfloat`` or ``symbool``: its recorded ``hint`` and ``expr`` (``s0``)."""

    kind: str
    hint: PlainData
    expr: str

    def tensors(self):
        return iter(())


@dataclass(frozen=True)
class SequenceValue:
    """A ``tuple`` or ``list`` of value records."""

    kind: str
    items: tuple["Value", ...]

    def tensors(self):  # the tensor records inside, depth first
        for item in self.items:
            yield from item.tensors()


@dataclass(frozen=True)
class SubclassValue:
    """(1.3) A traceable tensor subclass (``TwoTensor``, a nested jagged tensor) as its flatten
    protocol gives it: ``cls`` its qualified class name, ``attrs`` the inner tensors' attribute
    names and ``items`` their values, ``context`` its plain-data context, ``size``/``stride`` the
    outer geometry as text (a nested jagged tensor's ragged size is a symbol, ``j1``)."""

    TAG_KEY: ClassVar[str] = "kind"
    TAG: ClassVar[str] = "subclass"
    cls: str
    attrs: tuple[str, ...]
    items: tuple["Value", ...]
    context: PlainData
    size: tuple[str, ...]
    stride: tuple[str, ...]
    requires_grad: bool
    name: str | None = None

    @property
    def kind(self) -> str:
        return self.TAG

    def tensors(self):
        for item in self.items:
            yield from item.tensors()


@dataclass(frozen=True)
class DerivedValue:
    """(1.3) An input that is a size (``kind`` ``size``) or stride (``stride``) of another
    input: ``input`` indexes the index's ``inputs`` (a tensor or subclass), ``dim`` one of its
    dimensions, ``expr`` the symbol the recording named it (``s21``; informative). What Dynamo
    passes next to a nested jagged tensor: its ragged size is a nested int (``j1``) that exists
    only as a property of that tensor, so a loader computes it from the rebuilt input."""

    kind: str
    input: int
    dim: int
    expr: str | None = omit_none()

    def tensors(self):
        return iter(())


Value = Annotated[
    Union[TensorValue, ScalarValue, SymValue, SequenceValue, SubclassValue, DerivedValue],
    Tagged("kind", {"tensor": TensorValue, "tuple": SequenceValue, "list": SequenceValue, "subclass": SubclassValue,
                    **{k: ScalarValue for k in SCALAR_KINDS}, **{k: SymValue for k in SYMBOL_KINDS},
                    **{k: DerivedValue for k in DERIVED_KINDS}}),
]
