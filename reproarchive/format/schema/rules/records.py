"""The rules of the §8 record sections that point into the rest of the index: the shape policy
names stored inputs and their dimensions, generator states are real host storages, a failure's
stage is one of the set; a rank's own records (1.5) pass the same rules."""

from __future__ import annotations

from reproarchive.errors import Rule, SchemaViolation
from reproarchive.format.schema import (
    DERIVED_KINDS,
    SHAPE_DIM_KINDS,
    SHAPE_INPUT_KINDS,
    FailureRecord,
    Records,
    RngRecord,
    ShapePolicy,
    Stage,
    StorageRecord,
    SubclassValue,
    TensorValue,
)
from reproarchive.format.schema.rules.names import DEVICE_RE

_STAGES = frozenset(Stage)


def check_shapes(shapes: ShapePolicy, inputs) -> None:
    """§8 ``shapes``: each entry names a stored input of its kind, a tensor's entry has one
    dimension per dimension of the stored tensor, kinds are the closed sets, every
    ``equal_to`` names a dimension the record describes, and (1.6) ``entry`` counts no more
    shape guards than the policy records."""
    def bad(problem: str, *path) -> SchemaViolation:
        return SchemaViolation(problem, ("shapes", *path), Rule.SHAPE_POLICY)

    described = set()
    for k, entry in enumerate(shapes.inputs):
        if not 0 <= entry.input < len(inputs):
            raise bad(f"names input {entry.input}, but the index stores {len(inputs)} inputs", "inputs", k, "input")
        value = inputs[entry.input]
        if entry.kind not in SHAPE_INPUT_KINDS:
            raise bad(f"kind {entry.kind!r} is not one of {', '.join(SHAPE_INPUT_KINDS)}", "inputs", k, "kind")
        is_tensor = isinstance(value, (TensorValue, SubclassValue))
        rank = len(value.shape) if isinstance(value, TensorValue) else len(value.size) if is_tensor else 1
        # a symbol, or the plain value a source that saw only its hint stored (a trace import),
        # or (1.3) a size or stride of another input (a nested jagged tensor's ragged size)
        plain = {"symint": ("int", *DERIVED_KINDS), "symfloat": ("float",), "symbool": ("bool",)}.get(entry.kind, ())
        matches = is_tensor if entry.kind == "tensor" else getattr(value, "kind", None) in (entry.kind, *plain)
        if not matches or len(entry.dims) != rank:
            raise bad(f"describes {len(entry.dims)} dimension(s) of a {entry.kind}, but input {entry.input} "
                      f"is a {getattr(value, 'kind', 'tensor')} with {rank}", "inputs", k, "dims")
        for d, dim in enumerate(entry.dims):
            if dim.kind not in SHAPE_DIM_KINDS:
                raise bad(f"kind {dim.kind!r} is not one of {', '.join(SHAPE_DIM_KINDS)}", "inputs", k, "dims", d)
            if (dim.kind == "static") == (dim.expr is not None):
                raise bad("a static dimension has no expr, a symbolic one has one", "inputs", k, "dims", d)
            described.add(f"{entry.input}.{d}")
    for k, entry in enumerate(shapes.inputs):
        for d, dim in enumerate(entry.dims):
            for other in dim.equal_to:
                if other not in described:
                    raise bad(f"equal_to names {other!r}, a dimension the record does not describe",
                              "inputs", k, "dims", d, "equal_to")
    for k, symbol in enumerate(shapes.symbols):
        if symbol.kind not in ("backed", "unbacked"):
            raise bad(f"kind {symbol.kind!r} is not backed or unbacked", "symbols", k, "kind")
    if shapes.entry is not None and not 0 <= shapes.entry.shape_guards <= len(shapes.shape_guards):
        raise bad(f"says the backend was entered with {shapes.entry.shape_guards} shape guard(s), but the policy "
                  f"records {len(shapes.shape_guards)}", "entry", "shape_guards")


def check_rank_records(records: Records, inputs: tuple, storages: tuple[StorageRecord, ...]) -> None:
    """(1.5) A rank's own records, by the rules of the index's (R8-1, R8-2, R8-6)."""
    if records.failure is not None:
        check_failure(records.failure)
    if records.shapes is not None:
        check_shapes(records.shapes, inputs)
    if records.rng is not None:
        check_rng(records.rng, storages)


def check_rng(rng: RngRecord, storages: tuple[StorageRecord, ...]) -> None:
    """(R8-6) Each generator state is a real storage on the host, of a generator on a device."""
    for i, generator in enumerate(rng.generators):
        where = ("rng", "generators", i)
        if not DEVICE_RE.match(generator.device):
            raise SchemaViolation(f"{generator.device[:40]!r} is not a device name", (*where, "device"),
                                  Rule.RNG_STATE)
        if not 0 <= generator.storage < len(storages):
            raise SchemaViolation(f"storage {generator.storage} does not exist", (*where, "storage"), Rule.RNG_STATE)
        storage = storages[generator.storage]
        if not storage.is_real or storage.device != "cpu":
            raise SchemaViolation("a generator state is a real storage on cpu", (*where, "storage"), Rule.RNG_STATE)


def check_failure(failure: FailureRecord) -> None:
    if failure.stage not in _STAGES:
        raise SchemaViolation(f"stage must be one of {', '.join(Stage)}", ("failure", "stage"), Rule.FAILURE_STAGE)
