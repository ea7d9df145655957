"""Every error reproarchive raises on purpose, its stable code, and the spec's rule ids.

Each error carries one line that says what is wrong and what to do about it, because the
people who meet these errors are handed an archive by someone else and cannot read our code
to guess. The CLI prints ``str(err)`` and exits with ``err.exit_code``; nothing here knows
about click.

Every class has a stable ``code`` (an ``ErrorCode``: what a script or a second reader of the
format matches on, never the message) and an error that refuses an archive names the ``Rule``
of spec/FORMAT.md it broke (``err.rule``, also at the end of the message). Codes and rule ids
are a promise like the format: a new one may be added, an existing one never changes meaning.

This module is public (``__all__``, docs/api.md "Errors"): catch ``reproarchive.ReproArchiveError``
for any of them, or a class from here for one kind. The other classes below are raised and
caught inside the library and are not part of the API.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "ErrorCode",
    "Rule",
    "ReproArchiveError",
    "ArchiveError",
    "NotAnArchiveError",
    "TruncatedArchiveError",
    "UnsupportedVersionError",
    "CorruptArchiveError",
    "DigestMismatchError",
    "LimitExceededError",
    "IndexSchemaError",
    "UnsafeArchiveError",
    "NotReplayableHereError",
    "PackError",
    "SourceError",
    "DeviceUnavailableError",
    "BackendUnavailableError",
    "ExportError",
    "NotReproducedError",
    "StoreError",
    "StoreNotFoundError",
    "StoreURLError",
    "CorruptStoreError",
]


class ErrorCode(StrEnum):
    """Stable error codes (README "Exit codes", spec §5.2). The last four are the CLI's own
    failures that are not our errors: a usage error, a file system error, Ctrl-C and a bug."""

    ERROR = "E_ERROR"
    ARCHIVE = "E_ARCHIVE"
    NOT_AN_ARCHIVE = "E_NOT_ARCHIVE"
    TRUNCATED = "E_TRUNCATED"
    VERSION = "E_VERSION"
    CORRUPT = "E_CORRUPT"
    DIGEST = "E_DIGEST"
    LIMIT = "E_LIMIT"
    SCHEMA = "E_SCHEMA"
    UNSAFE = "E_UNSAFE"
    NOT_REPLAYABLE = "E_NOT_REPLAYABLE"
    STORE_CORRUPT = "E_STORE_CORRUPT"
    STORE = "E_STORE"
    STORE_NOT_FOUND = "E_STORE_NOT_FOUND"
    STORE_URL = "E_STORE_URL"
    PACK = "E_PACK"
    SOURCE = "E_SOURCE"
    DEVICE = "E_DEVICE"
    BACKEND = "E_BACKEND"
    LAUNCH = "E_LAUNCH"
    NOT_REPRODUCED = "E_NOT_REPRODUCED"
    NOT_FAILING = "E_NOT_FAILING"
    EAGER = "E_EAGER"
    EXPORT = "E_EXPORT"
    VIEW = "E_VIEW"
    USAGE = "E_USAGE"
    IO = "E_IO"
    INTERRUPTED = "E_INTERRUPTED"
    INTERNAL = "E_INTERNAL"


class Rule(StrEnum):
    """Rule ids of the reader (spec §2, §5–§8, ``R<section>-<n>``): every refusal names one."""

    HEADER_BYTES = "R2.1-1"
    LAYOUT_MEMBER = "R2.2-1"
    NOT_AN_ARCHIVE = "R5-1"
    SEEK_TABLE = "R5-2"
    VERSION = "R5-3"
    FRAME_OFFSETS = "R5-4"
    INDEX_FRAME = "R5-5"
    INDEX_HEADER = "R5-6"
    MEMBERS = "R5-7"
    FRAME_SIZES = "R5-8"
    INDEX_ORDER = "R5-9"
    MEMBER_DATA = "R5-10"
    MSGPACK_EXTENSION = "R5.1-1"
    MSGPACK_DEPTH = "R5.1-2"
    MSGPACK_TRAILING = "R5.1-3"
    MSGPACK_BOMB = "R5.1-4"
    MSGPACK_MEMORY = "R5.1-5"
    MSGPACK_INVALID = "R5.1-6"
    INT64 = "R5.1-7"
    FIELD_TYPES = "R6-1"
    DIGEST_ALGORITHM = "R6.1-1"
    DIGEST_SYNTAX = "R6.1-2"
    BLOB_DIGEST = "R6.1-3"
    STORAGE_SIZE = "R6.2-1"
    STORAGE_DEVICE = "R6.2-2"
    STORAGE_FIDELITY = "R6.2-3"
    STORAGE_BLOB = "R6.2-4"
    STORAGE_TOTAL = "R6.2-5"
    TENSOR_STORAGE = "R6.3-1"
    TENSOR_DTYPE = "R6.3-2"
    TENSOR_GEOMETRY = "R6.3-3"
    TENSOR_FITS = "R6.3-4"
    TENSOR_GRAD = "R6.3-5"
    TENSOR_DYNAMIC = "R6.3-6"
    VALUE_KIND = "R6.3-7"
    VALUE_DEPTH = "R6.3-8"
    INPUTS = "R6.3-9"
    DERIVED_INPUT = "R6.3-10"
    GRAPH_DEPTH = "R7-1"
    NODE_OP = "R7.1-1"
    NODE_NAME = "R7.1-2"
    NODE_OUTPUT = "R7.1-3"
    NODE_KWARG_NAME = "R7.1-4"
    NODE_PLACEHOLDER = "R7.1-5"
    NODE_FUNCTION_NAME = "R7.1-6"
    NODE_METHOD_NAME = "R7.1-7"
    NODE_ATTRIBUTE = "R7.1-8"
    NODE_STACK = "R7.1-9"
    ARG_TAG = "R7.2-1"
    ARG_REF = "R7.2-2"
    CALL_TARGET = "R7.3-1"
    STATE_PATH = "R7.4-1"
    STATE_MODULE = "R7.4-2"
    FAILURE_STAGE = "R8-1"
    SHAPE_POLICY = "R8-2"
    JOB_RANKS = "R8-3"
    JOB_GROUPS = "R8-4"
    JOB_REFS = "R8-5"
    RNG_STATE = "R8-6"
    TRITON_KERNEL = "R8-7"


class ReproArchiveError(Exception):
    """Base class. ``exit_code`` is what the CLI returns for it, ``code`` its stable code;
    ``rule`` the spec rule an archive broke, where one applies."""

    exit_code = 2
    code = ErrorCode.ERROR

    def __init__(self, what: str, hint: str | None = None, *, rule: Rule | str | None = None):
        self.what = what
        self.hint = hint
        self.rule = Rule(rule) if rule is not None else None
        named = f"{what} (rule {self.rule})" if self.rule else what
        super().__init__(f"{named}; {hint}" if hint else named)


class ArchiveError(ReproArchiveError):
    """The archive cannot be trusted or read: malformed, damaged, unsafe or too new."""

    code = ErrorCode.ARCHIVE


class NotAnArchiveError(ArchiveError):
    """No reproarchive footer: an empty file, random bytes, or some other kind of file."""

    code = ErrorCode.NOT_AN_ARCHIVE


class TruncatedArchiveError(ArchiveError):
    """The file ends before the structures it declares."""

    code = ErrorCode.TRUNCATED


class UnsupportedVersionError(ArchiveError):
    """The archive's major format version is newer than this reader."""

    code = ErrorCode.VERSION


class CorruptArchiveError(ArchiveError):
    """A checksum, digest, size or layout check failed: the bytes were changed or damaged."""

    code = ErrorCode.CORRUPT


class DigestMismatchError(CorruptArchiveError):
    """A blob's bytes do not hash to the name it is stored under."""

    code = ErrorCode.DIGEST


class LimitExceededError(ArchiveError):
    """A declared size or count is beyond what the spec allows a reader to accept."""

    code = ErrorCode.LIMIT


class IndexSchemaError(ArchiveError):
    """The index decodes but breaks a rule of the schema (types, references, ranges)."""

    code = ErrorCode.SCHEMA


class UnsafeArchiveError(ArchiveError):
    """The archive asks for something the security model forbids (a path, a target)."""

    code = ErrorCode.UNSAFE


class NotReplayableHereError(ArchiveError):
    """The archive names something this torch does not have (a tensor function, an operator, a
    module class), where a torch that has it could judge and replay it: not unsafe, not
    replayable here. Exit 125, like a device this machine lacks; ``verify`` and ``inspect``
    report it and pass (they run nothing)."""

    exit_code = 125
    code = ErrorCode.NOT_REPLAYABLE


class CorruptStoreError(CorruptArchiveError):
    """An object in a store does not match what names it (a digest, a size, the grammar of
    spec §11): refused exactly like a damaged or hostile archive (exit 2)."""

    code = ErrorCode.STORE_CORRUPT


class StoreError(ReproArchiveError):
    """A store cannot be reached, refused a request, or answered with an error (exit 5)."""

    exit_code = 5
    code = ErrorCode.STORE


class StoreNotFoundError(StoreError):
    """The store, or the name or digest asked for, is not there (exit 4, like a missing file)."""

    exit_code = 4
    code = ErrorCode.STORE_NOT_FOUND


class StoreURLError(StoreError):
    """The store location is not one this installation can use: an unknown URL scheme, or a
    URL fsspec cannot parse (exit 2, a usage error: retrying cannot help)."""

    exit_code = 2
    code = ErrorCode.STORE_URL


class PackError(ReproArchiveError):
    """The graph or inputs handed to ``pack`` cannot be represented in the format."""

    code = ErrorCode.PACK


class SourceError(ReproArchiveError):
    """A PyTorch repro dump, input file or output folder is missing or unusable (exit 4)."""

    exit_code = 4
    code = ErrorCode.SOURCE


class DeviceUnavailableError(ReproArchiveError):
    """The requested device does not exist on this machine (replay exits 125: cannot run here)."""

    exit_code = 125
    code = ErrorCode.DEVICE


class BackendUnavailableError(ReproArchiveError):
    """The requested compiler backend cannot be found on this machine (exit 125)."""

    exit_code = 125
    code = ErrorCode.BACKEND


class LaunchError(ReproArchiveError):
    """torch.distributed's launcher started no rank of a job to replay (torchrun missing, its
    rendezvous failing): nothing was judged, so nothing passed. Exit 125, like a device this
    machine lacks."""

    exit_code = 125
    code = ErrorCode.LAUNCH


class NotReproducedError(ReproArchiveError):
    """The archive does not reproduce its recorded failure here: there is nothing to minify."""

    exit_code = 3
    code = ErrorCode.NOT_REPRODUCED


class NotFailingError(ReproArchiveError):
    """The graph handed to ``minify`` does not fail, so there is nothing to minify."""

    code = ErrorCode.NOT_FAILING


class EagerRunError(ReproArchiveError):
    """The original graph cannot be run eagerly, so there are no intermediate values to cut to."""

    code = ErrorCode.EAGER


class ExportError(ReproArchiveError):
    """The graph uses something a standalone script cannot recreate."""

    code = ErrorCode.EXPORT


class ViewError(ReproArchiveError):
    """``view`` cannot draw: no graph layout engine here, or the page cannot be written (exit 4)."""

    exit_code = 4
    code = ErrorCode.VIEW


# ---------------------------------------------------------------------------------------------
# Signals between parts of reproarchive: caught inside the library, never shown to a user as is.


class SchemaViolation(Exception):
    """A value does not fit the schema; ``path`` names where (outermost first), ``rule`` which
    rule of the spec (None: a field of the wrong type, rule R6-1).

    Neutral on purpose: reading an archive turns it into ``IndexSchemaError`` (the archive is
    bad), writing one into ``PackError`` (the caller handed us something the format cannot
    hold).
    """

    def __init__(self, problem: str, path: tuple = (), rule: Rule | None = None):
        super().__init__(problem)
        self.problem = problem
        self.path = path
        self.rule = rule

    def at(self, step) -> "SchemaViolation":
        return SchemaViolation(self.problem, (step, *self.path), self.rule)

    @property
    def where(self) -> str:
        out = ""
        for step in self.path:
            out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else str(step))
        return out or "index"

    def __str__(self) -> str:
        return f"{self.where}: {self.problem}"


class BudgetExhausted(Exception):
    """Raised inside the search when ``max_time`` has run out; never escapes ``minify``."""


class EagerFailed(Exception):
    """The eager (reference) run of a graph raised, so accuracy cannot be judged."""


class NotReplayableError(Exception):
    """Packing a dump: its failure cannot be replayed here (no backend, fails eagerly too);
    the archive then records an unknown failure with this reason."""


class UnrepresentableValue(Exception):
    """A config value that is not data (a callable, a class): listed by name, never stored."""
