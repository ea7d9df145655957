"""The archives of one capture backend, kept apart from the checks that decide when to write
them: whatever the first call's check does, every failure it finds must end in one archive
named and placed the same way, written (or its crash record set aside, restored or dropped)
without ever raising in place of the user's own failure.

The crash record: a native crash (segfault, abort from C++, fatal device assert) ends the
process where nothing can be written any more, so the archive it would leave is prepared
before the compiled code first runs, as a spool entry (``process_spool``) or, with
``spool=False``, a whole archive, and dropped once the run ended any other way. A failure
that raises is written here too, from the spool entry where its inputs cannot be read any
more, and pushed to the backend's store when it has one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from reproarchive.compat.dynamo import AccuracyError
from reproarchive.context import failure as _failure
from reproarchive.format.schema import AccuracyReport, ConfigRecord, FailureRecord
from reproarchive.sources.capture import call_marks
from reproarchive.sources.capture.call_guard import GraphWrites
from reproarchive.sources.capture.capture_options import is_file_target
from reproarchive.sources.capture.failure_notes import annotate as _annotate
from reproarchive.sources.capture.failure_notes import archive_path
from reproarchive.sources.capture.failure_records import capture_of, write_archive
from reproarchive.sources.capture.job_capture import failed as job_failed
from reproarchive.sources.capture.job_capture import rank_context
from reproarchive.sources.capture.process_spool import spool_in
from reproarchive.store.push import push

log = logging.getLogger("reproarchive.capture")

ARCHIVE_SUFFIX = ".tar.zst"


class CaptureWarning(UserWarning):
    """Capture wrote an archive (or could not) without raising: shown once per archive."""


class BackendArchives:
    """Where a capture backend's archives go, the one a crash would leave and those its
    failures leave: a base of ``backend._CaptureBackend``, which sets ``target``, ``settings``,
    ``backend_name``, ``store``, ``written``, ``pushed`` and ``_made_folder``."""

    @property
    def file_target(self) -> bool:
        return is_file_target(self.target)

    @property
    def folder(self) -> Path:
        """Where this backend's archives and spool go: ``path``, or a file target's folder."""
        return self.target.parent if self.file_target else self.target

    # -- a crash: the archive written before the compiled code runs ----------------------------

    def _write_pending(self, gm: Any, inputs: list[Any], config: ConfigRecord) -> Path | None:
        """Write the archive a native crash would leave, before the compiled code first runs.

        A crash (segfault, abort from C++, fatal device assert) ends the process with no chance
        to write anything afterwards, so the archive is written first, with a ``crash`` failure
        whose signal is not known yet; ``_discard`` removes it once the check has run to its
        end. Never raises: a write that fails costs the crash record, not the user's run. A
        file target that already holds an archive is not overwritten by a pending one.
        """
        record = _failure.pending_crash_record(backend=self.backend_name)
        folder = self.folder
        self._made_folder = self._made_folder or not folder.exists()
        try:
            destination = self._destination(gm, inputs, record)
            if is_file_target(self.target) and destination.exists():
                return None
            written = write_archive(gm, inputs, destination, config=config, failure=record, backend=self.backend_name,
                                     accuracy=self.settings["accuracy"], capture_settings=self.settings)
        except Exception as err:  # noqa: BLE001 - never in place of the user's own run
            log.warning("reproarchive.capture could not write the archive a crash would leave: %s: %s",
                        type(err).__name__, err)
            return None
        log.debug("reproarchive: %s written before the first run (removed when it does not crash)", written)
        return Path(written)

    def _spool_pending(self, gm: Any, inputs: list[Any], config: ConfigRecord, writes: GraphWrites) -> str | None:
        """With ``spool=True``: start spooling the archive a crash would leave while the backend
        compiles (``process_spool``: each storage once per process, in the background; the
        first call waits for the entry and its small objects, the weights written while it runs).
        Never raises."""
        if not (self.settings["spool"] and self.settings["crash"] and self.settings["check_runtime"]):
            return None
        try:
            record = _failure.pending_crash_record(backend=self.backend_name)
            capture = capture_of(gm, inputs, config=config, failure=record, backend=self.backend_name,
                                 accuracy=self.settings["accuracy"], capture_settings=self.settings)
            name = None if self._file_taken() else self._archive_name(gm, inputs, record)
            return self._spool().submit(capture, written=writes.of(inputs), archive=name)
        except Exception as err:  # noqa: BLE001 - never in place of the user's own run
            log.warning("reproarchive.capture could not spool the archive a crash would leave: %s: %s",
                        type(err).__name__, err)
            return None

    def _spool(self) -> Any:
        return spool_in(self.folder, guarded=True, store=self.store)

    def _marker(self, gm: Any, spooled: Path | str | None) -> call_marks.Marker | None:
        """Where a spooled graph's later calls mark themselves (``call_marks``): in the spool,
        whose guardian names the call a crash died in. None without a spool entry."""
        if not isinstance(spooled, str):
            return None
        try:
            return call_marks.Marker(self._spool().spool.folder / call_marks.MARKS_DIR, call_marks.label_of(gm))
        except Exception as err:  # noqa: BLE001 - never in place of the user's own run
            log.debug("reproarchive: later calls are not marked: %s", err)
            return None

    def _discard(self, pending: Path | str | None) -> None:
        if isinstance(pending, str):  # a spool entry
            self._spool().discard(pending)
            return
        if pending is None or pending in self.written:  # a real failure was written over it
            return
        try:
            pending.unlink()
            if self._made_folder and not self.written:  # leave no trace of a run that passed
                pending.parent.rmdir()
                self._made_folder = False
        except OSError:
            pass

    def _pending(self, pristine_gm: Any, args: list[Any], config: ConfigRecord,
                 spooled: str | None, *, fork: bool = True) -> Path | str | None:
        """The archive a crash in the first run would leave (a spool entry, or written now).
        ``fork=False``: for a check run, the spool entry finished before it, not by a writer
        forked through it (``ProcessSpool.wait``)."""
        if spooled is not None:
            return spooled if self._spool().wait(spooled, fork=fork) else None
        return self._write_pending(pristine_gm, args, config) if self.settings["crash"] else None

    def _set_aside(self, pending: Path | str | None) -> None:
        if isinstance(pending, str):  # a spool entry (``ProcessSpool.set_aside``)
            self._spool().set_aside(pending)

    def _restore(self, pending: Path | str | None) -> None:
        if isinstance(pending, str):
            self._spool().restore(pending)

    # -- failure paths ---------------------------------------------------------------------------

    def _fail(self, gm: Any, inputs: list[Any], modified: list[int], exc: BaseException, stage: str,
              config: ConfigRecord, rng_states: dict | None = None,
              pending: Path | str | None = None) -> tuple[Path | None, str | None]:
        if (ctx := rank_context()) is not None:  # a rank: its part, and the job's archive
            job_failed(self, gm, inputs, config, exc, stage, ctx)
            return archive_path(exc), None
        record = _failure.record_from_exception(exc, stage, backend=self.backend_name)
        path, error = self._write(gm, inputs, modified, record, config, rng_states, pending)
        _annotate(exc, path, error)
        return path, error

    def _accuracy_failed(self, gm: Any, inputs: list[Any], modified: list[int], report: AccuracyReport,
                         config: ConfigRecord) -> None:
        record = _failure.accuracy_record(report, backend=self.backend_name)
        path, error = self._write(gm, inputs, modified, record, config)
        where = f"archive written to {path}" if path else f"no archive written: {error}"
        message = f"compiled result differs from eager: {report.summary}\n[reproarchive] {where}"
        if self.settings["on_accuracy"] == "warn":
            warnings.warn(message, CaptureWarning, stacklevel=6)
            return
        err = AccuracyError(message)
        err.reproarchive_path = str(path) if path else None  # type: ignore[attr-defined]
        err.reproarchive_record = record  # type: ignore[attr-defined]
        raise err

    def _write(self, gm: Any, inputs: list[Any], modified: list[int], record: FailureRecord,
               config: ConfigRecord, rng_states: dict | None = None,
               pending: Path | str | None = None) -> tuple[Path | None, str | None]:
        """Write the archive; never let a problem here hide the user's original failure.
        ``rng_states``: the generator states the failing call started from (None: read now).
        ``pending``: the spool entry of the failing first call, which holds its inputs as they
        were before it: the archive comes from there when the inputs cannot be read now (a
        device-side assert leaves every later use of the device failing)."""
        if modified:
            record = dataclasses.replace(record, inputs_modified=tuple(modified))
        try:
            destination = self._destination(gm, inputs, record)
            written = write_archive(
                gm, inputs, destination, config=config, failure=record, backend=self.backend_name,
                accuracy=self.settings["accuracy"], capture_settings=self.settings, rng_states=rng_states,
            )
        except Exception as err:  # noqa: BLE001 - reported on the user's exception instead
            written = self._kept(pending, gm, inputs, record, err) if isinstance(pending, str) else None
            if written is None:
                log.warning("reproarchive.capture could not write an archive: %s: %s", type(err).__name__, err)
                return None, f"{type(err).__name__}: {err}"
        self.written.append(Path(written))
        log.warning("reproarchive: %s failure captured in %s", record.stage, written)
        if self.store:
            self._push(Path(written))
        return Path(written), None

    def _kept(self, entry: str, gm: Any, inputs: list[Any], record: FailureRecord, err: Exception) -> Path | None:
        """Spool entry ``entry`` completed into the failure's archive (None: it could not be)."""
        try:
            completed = self._spool().keep(entry, record, self._destination(gm, inputs, record))
        except Exception as again:  # noqa: BLE001 - the caller reports the first error
            log.debug("reproarchive: the spool entry could not be kept either: %s", again)
            return None
        if completed is None:
            return None
        first = str(err).splitlines()[0] if str(err) else ""
        log.warning("reproarchive: the archive could not be written from the inputs after the failure (%s: %s): it "
                    "holds them as spooled before the call%s", type(err).__name__, first, completed.unwritten)
        return completed.path

    def _push(self, written: Path) -> None:
        """Share the archive; a store that fails costs a log line, never the user's failure."""

        try:
            (result,) = push([written], self.store)
        except Exception as err:  # noqa: BLE001 - the archive is on disk; the failure must surface
            log.warning("reproarchive.capture could not push %s to %s: %s: %s", written, self.store,
                        type(err).__name__, err)
            return
        self.pushed.append(result)
        log.warning("reproarchive: pushed to %s/%s", result.store, result.name)

    def _destination(self, gm: Any, inputs: list[Any], record: FailureRecord) -> Path:
        folder = self.folder
        folder.mkdir(parents=True, exist_ok=True)
        return folder / self._archive_name(gm, inputs, record)

    def _file_taken(self) -> bool:
        """A file target that holds an archive already: a crash's is named beside it instead."""
        return is_file_target(self.target) and self.target.exists()

    def _archive_name(self, gm: Any, inputs: list[Any], record: FailureRecord) -> str:
        if is_file_target(self.target):
            return self.target.name
        return f"repro-{_short_hash(gm, inputs, record)}{ARCHIVE_SUFFIX}"


def _short_hash(gm: Any, inputs: Sequence[Any], record: FailureRecord) -> str:
    h = hashlib.sha256()
    try:
        h.update(gm.code.encode())
    except Exception:
        h.update(repr(gm.graph).encode())
    for a in inputs:
        if isinstance(a, torch.Tensor):
            h.update(f"T{tuple(a.shape)}{a.stride()}{a.dtype}{a.device.type}{a.requires_grad};".encode())
        else:
            h.update(f"V{type(a).__name__}:{a!r};".encode())
    h.update(record.signature.encode())
    return h.hexdigest()[:12]
