"""The public verbs over an archive or a store reference (``STORE/NAME``): ``load``, ``inspect``,
``doctor`` and ``run``.

This is the front door, one layer above archive, replay and store, which know nothing of each
other: a path to a file goes straight to the archive and replay layers; a reference is fetched
first, as little as each verb needs. ``inspect`` and ``doctor`` read the archive object alone (no
blob is downloaded); ``load`` and ``run`` need every blob the graph uses, so they pull the
archive into the cache once (``pull.fetch``) and read it from there. ``run`` checks its
settings here, at the edge, and hands them on unchanged.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

from reproarchive.archive import inspection, loading
from reproarchive.archive.inspection import StoreOrigin
from reproarchive.errors import ReproArchiveError
from reproarchive.format.reader import ContainerReader
from reproarchive.progress import ProgressFn
from reproarchive.replay import differences, runner
from reproarchive.replay.launch import JobOutcome
from reproarchive.replay.outcome import Outcome
from reproarchive.replay.prepared import is_job
from reproarchive.replay.run_job import run_job as _run_job
from reproarchive.replay.settings import ReplaySettings
from reproarchive.store.location import is_reference
from reproarchive.store.pull import archive_view, fetch


def local_archive(path: str | os.PathLike, *, progress=None) -> str | os.PathLike:
    """A path to read: ``path`` itself, or the cached copy of the archive it references."""
    return fetch(os.fspath(path), progress=progress) if is_reference(path) else path


@functools.wraps(loading.load)
def load(path, *args, **kwargs):
    return loading.load(local_archive(path, progress=kwargs.get("progress")), *args, **kwargs)


def _index_report(verb, path, *args, **kwargs):
    """``verb(path)`` for a file; for a reference, ``verb`` of the archive object alone (no blob
    is downloaded), reported under the reference's name and where it came from."""
    if not is_reference(path):
        return verb(path, *args, **kwargs)
    with archive_view(os.fspath(path)) as (view, resolved):
        report = verb(view, *args, **kwargs)
    return dataclasses.replace(report, path=os.fspath(path),
                               store=StoreOrigin(url=resolved.store.url, name=resolved.name, archive=resolved.digest))


@functools.wraps(inspection.inspect)
def inspect(path, *args, **kwargs):
    return _index_report(inspection.inspect, path, *args, **kwargs)


def doctor(path, *args, **kwargs):
    """What differs between an archive's recording machine and this one (a file or a store
    reference); see ``reproarchive.replay.differences.doctor``."""
    return _index_report(differences.doctor, path, *args, **kwargs)


def run(path: str | os.PathLike, settings: ReplaySettings | None = None, *, isolate: bool | None = None,
        progress: ProgressFn | None = None, rank: int | None = None, single_process: bool = False,
        timeout: float | None = None, launcher: tuple[str, ...] = (), **options: Any) -> Outcome | JobOutcome:
    """Replay an archive (a file or a store reference) under ``settings``, or under ``options``
    naming its fields (``backend=``, ``accuracy=``, ``device=``, ``tol=``, ...).

    One graph gives an ``Outcome`` (``reproarchive.replay.runner.run``; ``isolate``: in a child
    process). A multi-rank job gives a ``JobOutcome`` (``reproarchive.replay.run_job.run_job``): every
    rank launched through torch.distributed's launcher (``launcher``: its rendezvous options for
    several machines; ``timeout``: each collective's), ``rank=r`` alone against a fake process
    group, or ``single_process`` under LocalTensorMode. Asking a job's way of one graph is an
    error (2), as is ``isolate`` for a job, whose ranks are processes of their own."""

    settings = ReplaySettings.given(settings, options)
    local = local_archive(path, progress=progress)
    with ContainerReader(local) as reader:  # the index decoded once: which replay, and that replay's
        if not is_job(reader.index) and rank is None and not single_process and timeout is None and not launcher:
            return runner.run(local, settings, isolate=isolate, progress=progress, reader=reader)
        if isolate is not None:
            raise ReproArchiveError("--isolate/--no-isolate do not apply to a multi-rank job: every rank is its "
                                    "own process", "leave --isolate out")
        return _run_job(local, settings, rank=rank, single_process=single_process, timeout_s=timeout,
                        launcher=launcher, reader=reader)
