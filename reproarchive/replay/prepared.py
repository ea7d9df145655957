"""What every command that replays does first, once: ``prepared(path, settings)``.

``run`` (one graph or a job, in this process or a child), ``run --minify``, ``bisect compiler``
and a job's replay all begin the same way, and where each had its own copy the copies drifted
(one answered 125 for a device this machine lacks, another 3). Here, in this order:

1. the index is decoded, once (the reader that answers every later question);
2. the devices are resolved (``codec.devices``): a recorded device this machine lacks is 125
   unless ``settings.device`` moves it;
3. the user's implementations are brought (``--import``, ``--load-library``): a module may
   register the backend the next step looks for;
4. the backend and accuracy mode are chosen for the recorded ones (``for_recorded``), and the
   backend is found here or it is 125;
5. whether the replay only compiles (``replay.compile_only``): a compile-stage failure recorded
   on a GPU this machine lacks is compiled for that GPU's recorded description, its storages
   loaded onto ``meta``.

Loading the data is left to the caller (``Prepared.load``, ``Prepared.load_job``): a parent
that replays in a child never reads the tensors itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings
from typing import Any

from reproarchive.archive.job_archive import load_job, rank_records
from reproarchive.archive.loading import load
from reproarchive.codec.checks import recorded_devices
from reproarchive.codec.devices import DevicePlan, resolve_devices
from reproarchive.codec.stand_ins import bring_implementations
from reproarchive.format.reader import ContainerReader
from reproarchive.format.schema import Index, Records
from reproarchive.progress import ProgressFn
from reproarchive.replay.backends import resolve_backend
from reproarchive.replay.compile_only import CompileOnly, decided, planned
from reproarchive.replay.ranks import as_a_rank_alone
from reproarchive.replay.settings import ReplaySettings


def is_job(index: Index) -> bool:
    """Whether an archive holds a multi-rank job (spec §8 ``job``) of more than one rank: a job
    of one rank is one graph."""
    return index.job is not None and index.job.world_size > 1


@dataclasses.dataclass(frozen=True)
class Prepared:
    """An archive ready to replay here: its decoded index, its device plan, and the settings
    with the backend and accuracy mode chosen for the recorded ones (``asked``: as given)."""

    path: str
    index: Index
    digest: str
    plan: DevicePlan
    settings: ReplaySettings
    asked: ReplaySettings
    compile_only: CompileOnly | None = None
    rank: int | None = None  # the job's rank this replay is (a rank worker's); None: the archive's graph

    @property
    def records(self) -> Records:
        """The records this replay is judged under: the archive's, or its rank's own."""
        return self.index.records if self.rank is None else rank_records(self.index, self.rank)

    @property
    def is_job(self) -> bool:
        return is_job(self.index)

    def load(self, *, progress: ProgressFn | None = None, reader: ContainerReader | None = None) -> Any:
        """The graph and its inputs on the planned devices (``archive.loading.load``); of a
        rank, its ``RankRepro`` (``archive.job_archive.load_job``), a ``Repro`` as well."""

        remap = self.compile_only is None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the same notes are in repro.warnings
            if self.rank is None:
                repro = load(self.path, device=self.plan, progress=progress, max_memory=self.asked.max_memory,
                             reader=reader, remap_graph=remap)
            else:  # its own rank only
                repro = load_job(self.path, device=self.plan, max_memory=self.asked.max_memory, ranks=[self.rank],
                                 remap_graph=remap).rank(self.rank)
        repro.compile_only = self.compile_only
        return repro

    def as_its_rank(self) -> Any:
        """Where this replay runs a job's failing rank in this process (``bisect compiler``'s
        replays; a compile-only job's ``run --minify``): joined to a fake process group as that
        rank, every recorded group registered under its recorded name, so its collectives
        compile as they did. For a job compiled only, or one whose recorded failure is a compile
        error (a compile reads no collective's value: PyTorch's own way, as ``run --rank`` is).
        Nothing for one graph."""
        failure = self.records.failure
        if self.is_job and (self.compile_only is not None or (failure is not None and failure.stage == "compile")):
            return as_a_rank_alone(self.index.job, self.index.job.primary_rank)
        return contextlib.nullcontext()

    def load_job(self) -> Any:
        """Every rank's graph and inputs (``archive.job.load_job``) on the asked device."""

        return load_job(self.path, device=self.asked.device, max_memory=self.asked.max_memory)


def prepared(path: str | os.PathLike, settings: ReplaySettings, *, reader: ContainerReader | None = None,
             here: bool = True, plan: DevicePlan | None = None, rank: int | None = None) -> Prepared:
    """The archive at ``path`` prepared under ``settings`` (module docstring); ``reader``: one
    open already. ``here=False``: the replay runs in a child, which prepares it again, so the
    user's implementations are not brought into this process (a library that crashes takes
    the child, not the caller), and the backend is looked for here only where none of them
    could define it. ``plan``: the devices as a parent resolved them. ``rank``: a job's rank
    (a rank worker's replay), prepared under its own records: its backend, its system.
    Raises DeviceUnavailableError or BackendUnavailableError (125), an ArchiveError (2) for an
    unreadable archive, ReproArchiveError (2) for a rank the job does not record."""
    if reader is None:
        with ContainerReader(path) as own:
            return prepared(path, settings, reader=own, here=here, plan=plan, rank=rank)
    index = reader.index
    records = index.records if rank is None else rank_records(index, rank)
    if plan is None:
        only = decided(index, settings)
        plan = only.plan(recorded_devices(index)) if only is not None else resolve_devices(recorded_devices(index),
                                                                                            settings.device)
    else:  # a child: the parent's decision
        only = planned(records.system, settings, plan)
    chosen = settings.for_recorded(records.backend, records.accuracy)
    if here:
        bring_implementations(settings.imports, settings.libraries)
    if here or not (settings.imports or settings.libraries):  # else a module the child imports may define it
        resolve_backend(chosen.backend)
    return Prepared(os.fspath(path), index, reader.index_digest, plan, chosen, settings, only, rank)
