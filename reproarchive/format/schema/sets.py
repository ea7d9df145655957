"""The closed value sets and the limits of format 1 (spec §6–§8), part of the schema.

A closed value set is a ``StrEnum``: on disk and in a decoded record it is the member's plain
string. ``schema_check`` describes every set and limit here, so a new member or a changed limit
needs the version bump it names. Data only, like every schema module.
"""

from __future__ import annotations

from enum import StrEnum

# -- closed value sets ---------------------------------------------------------------------------


class Stage(StrEnum):
    """Where a failure happened (§8 ``failure.stage``); ``timeout`` (1.3): a collective of a
    multi-rank job waited past its process group's timeout (a hang)."""

    (COMPILE, FORWARD, BACKWARD, ACCURACY, CRASH, UNKNOWN, TIMEOUT) = (
        "compile", "forward", "backward", "accuracy", "crash", "unknown", "timeout")


class RankStatus(StrEnum):
    """How one rank of a multi-rank job ended (§8 ``job``, 1.3): ``failed`` with its failure
    record, ``passed``, ``crashed`` (a signal or exit status), ``timeout`` (a collective waited
    past its timeout), ``running`` (still running when its part was taken: blocked, or killed
    by the launcher after another rank failed) or ``unknown``."""

    FAILED, PASSED, CRASHED, TIMEOUT, RUNNING, UNKNOWN = "failed", "passed", "crashed", "timeout", "running", "unknown"


class PlacementKind(StrEnum):
    """How a DTensor is laid out along one mesh dimension (§8 ``job``, 1.3)."""

    SHARD, REPLICATE, PARTIAL = "shard", "replicate", "partial"


class Fidelity(StrEnum):
    """Whether a storage's bytes are the original data (§6.2)."""

    REAL, ABSENT = "real", "absent"


class DigestAlgorithm(StrEnum):
    """Blob digest algorithms (§6.1)."""

    SHA256, BLAKE3 = "sha256", "blake3"


class NodeOp(StrEnum):
    """FX node ops (§7.1)."""

    (PLACEHOLDER, GET_ATTR, CALL_FUNCTION, CALL_METHOD, CALL_MODULE, OUTPUT) = (
        "placeholder", "get_attr", "call_function", "call_method", "call_module", "output")


class ArgTag(StrEnum):
    """The tags ``k`` of a tagged argument map (§7.2)."""

    (NODE, TUPLE, DICT, SLICE, DTYPE, DEVICE, MEMORY_FORMAT, LAYOUT, ELLIPSIS, COMPLEX) = (
        "node", "tuple", "dict", "slice", "dtype", "device", "memory_format", "layout", "ellipsis", "complex")


class ConstantKind(StrEnum):
    """The named torch constants an argument may hold (a subset of ``ArgTag``)."""

    DTYPE, DEVICE, MEMORY_FORMAT, LAYOUT = "dtype", "device", "memory_format", "layout"
    OPERATOR = "operator"  # (1.3) an operator passed as a value, to a higher-order operator that calls it


class MemoryFormat(StrEnum):
    """``torch.memory_format`` names (§7.2)."""

    (CONTIGUOUS_FORMAT, CHANNELS_LAST, CHANNELS_LAST_3D, PRESERVE_FORMAT) = (
        "contiguous_format", "channels_last", "channels_last_3d", "preserve_format")


class Layout(StrEnum):
    """``torch.layout`` names (§7.2)."""

    STRIDED, SPARSE_COO, SPARSE_CSR, JAGGED = "strided", "sparse_coo", "sparse_csr", "jagged"


class TensorKind(StrEnum):
    """Module-state entries that hold a tensor (§7.4)."""

    PARAMETER, BUFFER, CONSTANT = "parameter", "buffer", "constant"


class GraphKind(StrEnum):
    """Which of PyTorch's graphs an archive holds (§8 ``source.kind`` / ``source.graph_kind``)."""

    AFTER_DYNAMO, AFTER_AOT = "after_dynamo", "after_aot"


class CallRoot(StrEnum):
    """The modules a call target's name is resolved from (§7.3)."""

    TORCH, OPERATOR, MATH, BUILTINS = "torch", "operator", "math", "builtins"


# -- constants -----------------------------------------------------------------------------------

#: Node ops that compute (what op counts and histograms count).
COMPUTE_OPS = (NodeOp.CALL_FUNCTION, NodeOp.CALL_METHOD, NodeOp.CALL_MODULE)

#: Limits of the format (a reader's adjustable caps are ``layout.Limits``).
MAX_RANK = 64
MAX_EXTENT = 1 << 62  # sizes, strides, offsets and element counts stay below this
MAX_VALUE_DEPTH = 32
MAX_GRAPH_DEPTH = 8
MAX_TARGET_LENGTH = 300
MAX_ATTRIBUTE_PATH_LENGTH = 500
MAX_STACK_FRAMES = 256  # (1.7) frames of one node's stack trace
MAX_FRAME_TEXT = 4096  # (1.7) characters of a frame's file, name, code or marks

#: Every storable dtype (spec §6.3): name -> (bytes per element, class). Quantized dtypes are
#: not storable; a name not listed here was written by a newer format minor version.
DTYPES: dict[str, tuple[int, str]] = {
    "bool": (1, "bool"),
    "uint8": (1, "int"), "uint16": (2, "int"), "uint32": (4, "int"), "uint64": (8, "int"),
    "int8": (1, "int"), "int16": (2, "int"), "int32": (4, "int"), "int64": (8, "int"),
    **{f"uint{b}": (1, "int") for b in range(1, 8)},
    **{f"int{b}": (1, "int") for b in range(1, 8)},
    "float16": (2, "float"), "bfloat16": (2, "float"), "float32": (4, "float"), "float64": (8, "float"),
    "float8_e4m3fn": (1, "float"), "float8_e4m3fnuz": (1, "float"), "float8_e5m2": (1, "float"),
    "float8_e5m2fnuz": (1, "float"), "float8_e8m0fnu": (1, "float"), "float4_e2m1fn_x2": (1, "float"),
    "complex32": (4, "complex"), "complex64": (8, "complex"), "complex128": (16, "complex"),
    "bits8": (1, "bits"), "bits16": (2, "bits"), "bits1x8": (1, "bits"), "bits2x4": (1, "bits"),
    "bits4x2": (1, "bits"),
}

#: The value kinds of spec §6.3 and the Python type a scalar's value / a symbol's hint has.
SCALAR_KINDS = {"int": int, "float": float, "bool": bool, "str": str, "none": type(None)}
SYMBOL_KINDS = {"symint": int, "symfloat": float, "symbool": bool}
DERIVED_KINDS = ("size", "stride")  # (1.3) an input that is a size or stride of another input
SHAPE_INPUT_KINDS = ("tensor", "symint", "symfloat", "symbool")  # (1.3) §8 shapes.inputs[].kind
SHAPE_DIM_KINDS = ("static", "backed", "unbacked")  # (1.3) §8 shapes.inputs[].dims[].kind
