"""Every error reproarchive raises on purpose.

Each error carries one line that says what is wrong and what to do about it, because the
people who meet these errors are handed an archive by someone else and cannot read our code
to guess. The CLI prints ``str(err)`` and exits with ``err.exit_code``; nothing here knows
about click.
"""

from __future__ import annotations


class ReproArchiveError(Exception):
    """Base class. ``exit_code`` is what the CLI returns for it."""

    exit_code = 2

    def __init__(self, what: str, hint: str | None = None):
        self.what = what
        self.hint = hint
        super().__init__(f"{what}; {hint}" if hint else what)


class ArchiveError(ReproArchiveError):
    """The archive cannot be trusted or read: malformed, damaged, unsafe or too new."""


class NotAnArchiveError(ArchiveError):
    """No reproarchive footer: an empty file, random bytes, or some other kind of file."""


class TruncatedArchiveError(ArchiveError):
    """The file ends before the structures it declares."""


class UnsupportedVersionError(ArchiveError):
    """The archive's major format version is newer than this reader."""


class CorruptArchiveError(ArchiveError):
    """A checksum, digest, size or layout check failed: the bytes were changed or damaged."""


class DigestMismatchError(CorruptArchiveError):
    """A blob's bytes do not hash to the name it is stored under."""


class LimitExceededError(ArchiveError):
    """A declared size or count is beyond what the spec allows a reader to accept."""


class IndexSchemaError(ArchiveError):
    """The index decodes but breaks a rule of the schema (types, references, ranges)."""


class UnsafeArchiveError(ArchiveError):
    """The archive asks for something the security model forbids (a path, a target)."""


class CorruptStoreError(CorruptArchiveError):
    """An object in a store does not match what names it (a digest, a size, the grammar of
    spec §11): refused exactly like a damaged or hostile archive (exit 2)."""


class StoreError(ReproArchiveError):
    """A store cannot be reached, refused a request, or answered with an error (exit 5)."""

    exit_code = 5


class StoreNotFoundError(StoreError):
    """The store, or the name or digest asked for, is not there (exit 4, like a missing file)."""

    exit_code = 4


class StoreURLError(StoreError):
    """The store location is not one this installation can use: an unknown URL scheme, or a
    URL fsspec cannot parse (exit 2, a usage error: retrying cannot help)."""

    exit_code = 2


class PackError(ReproArchiveError):
    """The graph or inputs handed to ``pack`` cannot be represented in the format."""


class SourceError(ReproArchiveError):
    """A PyTorch repro dump, input file or output folder is missing or unusable (exit 4)."""

    exit_code = 4


class DeviceUnavailableError(ReproArchiveError):
    """The requested device does not exist on this machine (replay exits 125: cannot run here)."""

    exit_code = 125


class BackendUnavailableError(ReproArchiveError):
    """The requested compiler backend cannot be found on this machine (exit 125)."""

    exit_code = 125


class NotReproducedError(ReproArchiveError):
    """The archive does not reproduce its recorded failure here: there is nothing to minify."""

    exit_code = 3


class NotFailingError(ReproArchiveError):
    """The graph handed to ``minify`` does not fail, so there is nothing to minify."""


class EagerRunError(ReproArchiveError):
    """The original graph cannot be run eagerly, so there are no intermediate values to cut to."""


class ExportError(ReproArchiveError):
    """The graph uses something a standalone script cannot recreate."""


class ViewError(ReproArchiveError):
    """``view`` cannot draw: no graph layout engine here, or the page cannot be written (exit 4)."""

    exit_code = 4


# ---------------------------------------------------------------------------------------------
# Signals between parts of reproarchive: caught inside the library, never shown to a user as is.


class SchemaViolation(Exception):
    """A value does not fit the schema; ``path`` names where (outermost first).

    Neutral on purpose: reading an archive turns it into ``IndexSchemaError`` (the archive is
    bad), writing one into ``PackError`` (the caller handed us something the format cannot
    hold).
    """

    def __init__(self, problem: str, path: tuple = ()):
        super().__init__(problem)
        self.problem = problem
        self.path = path

    def at(self, step) -> "SchemaViolation":
        return SchemaViolation(self.problem, (step, *self.path))

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
