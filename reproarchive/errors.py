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
