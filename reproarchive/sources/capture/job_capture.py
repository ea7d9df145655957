"""Capture on every rank of a multi-rank job: one part per rank, one archive for the job.

When ``reproarchive.capture(...)`` runs in a process of a torch.distributed job (the default
group initialised, world size above one), each rank keeps what only it can see:

* at each compile, the collectives its graph issues in order (the ``_c10d_functional`` calls
  Dynamo traced: operator, group name, shapes, dtypes) and the compile id (``note_compile``);
* at the first call of each compiled graph, *before* it runs, its part: an ordinary archive of
  its graph and real inputs (a DTensor input as its local shard, its mesh and placements as
  data) whose ``job`` record lists this rank as ``running``, in a folder shared by the job's
  ranks and named after its rendezvous (``TORCHELASTIC_RUN_ID``, else ``MASTER_ADDR:PORT``).
  A rank that dies there (a native crash; a launcher that kills it) leaves that part, and the
  signal, when faulthandler could write it (``rank-<r>.fault``);
* how the call ended: passed (a status file beside the part), or failed — its own exception,
  or a collective timeout (stage ``timeout``: the hang, seen from a rank that waited).

A rank that fails rewrites its part with the failure and merges every part of the folder into
the job archive (``archive.job_merge``, under a file lock), after waiting a bounded time
(``REPROARCHIVE_JOB_WAIT_S``, default 10 s) for ranks that have not written theirs yet; a later
failure of another rank merges again. When every rank of the world has passed, the last one
removes the folder: a job that passed leaves nothing. A job whose failing rank died before it
could merge (a crash) leaves the folder; ``reproarchive pack FOLDER`` (or ``capture --``, after
its launcher exits) merges it.

A graph that issues collectives waits (bounded by the same setting) until every rank has
written its part before its first call: it would meet them at its first collective anyway, and a
rank that dies at once then finds the others' parts there.

In a job the first call runs once, for real, guarded (not on copies first, as in a single
process): running a graph twice issues its collectives twice, and the ranks stay matched only if
all of them do; a hang would then show in the second run, outside the guard. The part written
before the call holds the inputs as they were; how the call ended goes into a status file
beside it (``rank-<r>.status.json``), which the merge reads, so nothing is copied or rewritten.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reproarchive.archive.job_merge import lost_a_peer
from reproarchive.compat.distributed import groups_in_creation_order
from reproarchive.compat.dynamo import current_compile_id
from reproarchive.compat.fake import hint_of
from reproarchive.context.failure import as_collective_timeout, pending_crash_record, record_from_exception
from reproarchive.context.redaction import redacted, working_folder
from reproarchive.errors import SourceError
from reproarchive.format.schema import (
    FAKE_PROCESS_GROUP,
    CollectiveRecord,
    CompileRecord,
    DTensorInput,
    JobRecord,
    MeshRecord,
    PlacementRecord,
    ProcessGroupRecord,
    RankOutcome,
    RankRecord,
    Records,
)
from reproarchive.sources.capture import fault_handler
from reproarchive.sources.capture.failure_notes import annotate as _annotate
from reproarchive.sources.capture.job_parts import (
    folder_parts,
    forget_when_all_ended,
    merge_folder,
    set_status,
    wait_for_parts,
)
from reproarchive.sources.pack_report import archive_report

log = logging.getLogger("reproarchive.capture")

#: Where ``capture --`` puts a job's archive once the launcher has exited (its ``-o`` folder):
#: a rank names that place, not the private folder it writes to meanwhile
JOB_OUT_ENV = "REPROARCHIVE_JOB_OUT"
PARTS_SUFFIX = ".parts"


@dataclasses.dataclass
class _RankState:
    """What this process has compiled so far: its compile ids and collectives, in order."""

    compiles: list[CompileRecord] = dataclasses.field(default_factory=list)
    schedule: list[CollectiveRecord] = dataclasses.field(default_factory=list)
    fault_file: Any = None


_STATE = _RankState()
_STARTED = time.time()  # when this process began capturing (this module is loaded by the capture backend)


@dataclasses.dataclass(frozen=True)
class RankContext:
    """This process as a rank of its job."""

    rank: int
    local_rank: int | None
    world_size: int
    backend: str | None
    host: str
    key: str

    @property
    def writers(self) -> tuple[int, ...]:
        """The ranks that write parts: every rank of the world, or this one alone on PyTorch's fake
        process group (one process plays one rank; no other rank exists to wait for)."""
        return (self.rank,) if self.backend == FAKE_PROCESS_GROUP else tuple(range(self.world_size))


def rank_context() -> RankContext | None:
    """The rank this process is, or None outside a multi-rank job."""
    try:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
            return None
        backend = str(dist.get_backend())
        rank, world = dist.get_rank(), dist.get_world_size()
    except Exception:  # noqa: BLE001 - a half-initialised job: captured as a single process
        return None
    local = os.environ.get("LOCAL_RANK")
    rendezvous = os.environ.get("TORCHELASTIC_RUN_ID") or \
        f"{os.environ.get('MASTER_ADDR', '')}:{os.environ.get('MASTER_PORT', '')}"
    key = hashlib.sha256(f"{rendezvous}|{world}".encode()).hexdigest()[:12]
    host = "sha256:" + hashlib.sha256(socket.gethostname().encode()).hexdigest()
    return RankContext(rank, int(local) if local and local.isdigit() else None, world, backend, host, key)


# -- what the rank compiled ------------------------------------------------------------------------


def note_compile(gm: Any) -> None:
    """Record a compile of this rank: its compile id and the collectives its graph issues."""
    compile_id = _compile_id()
    _STATE.compiles.append(CompileRecord(compile_id=compile_id or f"#{len(_STATE.compiles)}"))
    _STATE.schedule.extend(schedule_of(gm, compile_id))


def last_compile_id() -> str:
    """The compile id of this rank's newest compile ("?" before any)."""
    return _STATE.compiles[-1].compile_id if _STATE.compiles else "?"


def _compile_id() -> str | None:
    try:
        found = current_compile_id()
        return str(found) if found is not None else None
    except Exception:  # noqa: BLE001 - outside Dynamo (a backend called by hand)
        return None


def schedule_of(gm: Any, compile_id: str | None = None) -> list[CollectiveRecord]:
    """The collectives an fx graph issues, in node order, with the shapes and dtypes of the
    tensors each sends (from the values Dynamo recorded on the nodes)."""
    from reproarchive.codec.collectives import collective_of

    out = []
    for node in gm.graph.nodes:
        found = collective_of(node)
        if found is None or found.op == "wait_tensor":
            continue
        shapes, dtypes = [], []
        for arg in node.args[:1]:
            for value in (arg if isinstance(arg, (list, tuple)) else [arg]):
                meta = getattr(value, "meta", {}).get("example_value") if hasattr(value, "meta") else None
                if meta is not None and hasattr(meta, "shape"):
                    # a symbolic size by its hint: int() of it would guard on it, and so specialize the
                    # program's compile to this size (an unbacked size has no value to record)
                    sizes = [hint_of(s) for s in meta.shape]
                    if any(v is None for v in sizes):
                        continue
                    shapes.append(tuple(int(v) for v in sizes))
                    dtypes.append(str(meta.dtype).removeprefix("torch."))
        out.append(CollectiveRecord(op=found.op, group=found.group, shapes=tuple(shapes), dtypes=tuple(dtypes),
                                    compile_id=compile_id, node=node.name))
    return out


# -- the job's groups and meshes, and DTensor inputs -----------------------------------------------


def process_groups(mesh_dims: dict[str, str] | None = None) -> tuple[ProcessGroupRecord, ...]:
    """The process groups this rank belongs to, in creation order, under their names."""

    out = []
    for index, (pg, name, members, backend) in enumerate(groups_in_creation_order()):
        if not isinstance(members, dict):
            continue
        out.append(ProcessGroupRecord(
            name=str(name), ranks=tuple(g for g, _ in sorted(members.items(), key=lambda kv: kv[1])),
            backend=str(backend) if backend is not None else None, index=index,
            desc=getattr(pg, "group_desc", None) or None, mesh_dim=(mesh_dims or {}).get(str(name))))
    return tuple(out)


def _mesh_record(mesh: Any) -> tuple[MeshRecord, dict[str, str]]:
    names = tuple(mesh.mesh_dim_names) if mesh.mesh_dim_names else None
    dims: dict[str, str] = {}
    for d in range(mesh.ndim):
        with contextlib.suppress(Exception):
            dims[mesh.get_group(d).group_name] = names[d] if names else str(d)
    record = MeshRecord(shape=tuple(mesh.mesh.shape), ranks=tuple(int(r) for r in mesh.mesh.flatten().tolist()),
                        dim_names=names, device_type=str(mesh.device_type))
    return record, dims


def _placement(p: Any) -> PlacementRecord:
    if p.is_shard():
        return PlacementRecord(kind="shard", dim=int(p.dim))
    if p.is_partial():
        return PlacementRecord(kind="partial", reduce_op=str(getattr(p, "reduce_op", "sum")))
    return PlacementRecord(kind="replicate")


def local_inputs(inputs: list[Any]) -> tuple[list[Any], tuple[DTensorInput, ...], list[MeshRecord], dict[str, str]]:
    """The inputs with each DTensor replaced by its local shard; what each was (placements, mesh,
    global shape); the meshes; the mesh dimension of each group name."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        return list(inputs), (), [], {}
    out, dtensors, meshes, dims = [], [], [], {}
    for i, value in enumerate(inputs):
        if not isinstance(value, DTensor):
            out.append(value)
            continue
        record, mesh_dims = _mesh_record(value.device_mesh)
        if record not in meshes:
            meshes.append(record)
        dims.update(mesh_dims)
        dtensors.append(DTensorInput(input=i, mesh=meshes.index(record),
                                     placements=tuple(_placement(p) for p in value.placements),
                                     shape=tuple(value.shape), stride=tuple(value.stride())))
        out.append(value.to_local())
    return out, tuple(dtensors), meshes, dims


# -- the parts folder --------------------------------------------------------------------------


def job_paths(target: Path, ctx: RankContext, is_file_target: bool) -> tuple[Path, Path]:
    """(parts folder, job archive) for a capture target: a folder gets ``job-<key>.tar.zst`` and
    ``job-<key>.parts/``; a file target is the job archive, its parts beside it."""
    archive = target if is_file_target else target / f"job-{ctx.key}.tar.zst"
    return archive.with_name(archive.name.removesuffix(".tar.zst") + PARTS_SUFFIX), archive


def part_job(ctx: RankContext, outcome: RankOutcome, dtensors, meshes, mesh_dims, device: str | None = None
             ) -> JobRecord:
    """The job record of this rank's part (``archive.job.rank_part_job`` with this process's facts)."""
    from reproarchive.archive.job_archive import rank_part_job

    rank = RankRecord(rank=ctx.rank, local_rank=ctx.local_rank, device=device, host=ctx.host, dtensors=dtensors,
                      schedule=tuple(_STATE.schedule), compiles=tuple(_STATE.compiles), outcome=outcome)
    return rank_part_job(rank, world_size=ctx.world_size, backend=ctx.backend,
                         groups=process_groups(mesh_dims), meshes=meshes)


def watch_for_crash(folder: Path, ctx: RankContext) -> None:
    """Have faulthandler write a fatal signal of this process to ``rank-<r>.fault`` (unless the
    program enabled faulthandler itself: ``fault_handler``)."""

    path = folder / f"rank-{ctx.rank}.fault"
    if fault_handler.watching(_STATE.fault_file) and path.exists():
        return  # watching already (a folder removed since, for a job that passed, is watched anew)
    with contextlib.suppress(OSError):
        fault = open(path, "w")  # noqa: SIM115 - open for the life of the process
        if fault_handler.watch(fault):
            _STATE.fault_file = fault
        else:
            fault.close()
            path.unlink()


# -- the capture backend's job mode ------------------------------------------------------------


def write_part(backend: Any, gm: Any, inputs: list[Any], config: Any, failure: Any, outcome: RankOutcome,
               ctx: RankContext, custom_ops: list | None = None, rng_states: dict | None = None) -> tuple[Path, Path]:
    """Write this rank's part (its graph, its inputs as they were, this job record); returns
    (parts folder, job archive). ``custom_ops``: the calls recorded already; ``rng_states``: the
    generator states the call started from (None: read now, before a first call)."""
    from reproarchive.archive.writing import write_capture

    folder, archive = job_paths(backend.target, ctx, backend.file_target)
    folder.mkdir(parents=True, exist_ok=True)
    local, dtensors, meshes, dims = local_inputs(inputs)
    capture = backend.rank_capture(gm, local, config, failure, custom_ops, rng_states=rng_states)
    device = next((str(t.device) for t in local if hasattr(t, "device") and hasattr(t, "untyped_storage")), None)
    capture = dataclasses.replace(capture, job=part_job(ctx, outcome, dtensors, meshes, dims, device))
    write_capture(capture, folder / f"rank-{ctx.rank}.tar.zst")
    return folder, archive


def first_call(backend: Any, compiled: Any, gm: Any, args: list[Any], config: Any, ctx: RankContext) -> Any:
    """The first call of a compiled graph on a rank: its part first (the inputs, untouched
    yet), then the call, once, for real; its end goes into the status file beside the part."""
    from reproarchive.codec.recorded_calls import record_calls
    from reproarchive.replay.accuracy import stage_of

    doing = f"in the first call of compile {last_compile_id()}"
    try:
        # its custom ops' calls, while its inputs are untouched: a replay's ranks stand in for
        # an op they lack with the calls of every rank, this one's too, though it passed (the
        # recording issues no collective and puts the generators back: the job goes on as it would)
        calls = record_calls(gm, args)
        folder, _ = write_part(backend, gm, args, config, pending_crash_record(backend=backend.backend_name),
                               RankOutcome(status="running", doing=doing), ctx, custom_ops=calls)
        set_status(folder, ctx.rank, None)
        watch_for_crash(folder, ctx)
        if schedule_of(gm):  # it meets the other ranks anyway: first let them write their parts,
            wait_for_parts(folder, len(ctx.writers))  # so that a rank that dies at once finds them there
    except Exception as err:  # noqa: BLE001 - never in place of the user's own run
        log.warning("reproarchive.capture could not write rank %d's part: %s: %s", ctx.rank, type(err).__name__, err)
        return compiled(*args)
    try:
        result = compiled(*args)
    except Exception as exc:
        failed(backend, gm, args, config, exc, stage_of(exc), ctx, part_written=True)
        raise
    with contextlib.suppress(OSError):
        set_status(folder, ctx.rank, RankOutcome(status="passed"))
        forget_when_all_ended(folder, ctx.writers, job_paths(backend.target, ctx, backend.file_target)[1])
    return result


def failed(backend: Any, gm: Any, inputs: list[Any], config: Any, exc: BaseException, stage: str,
           ctx: RankContext, *, part_written: bool = False, call: int = 1,
           ask: Callable[[Path], None] | None = None, rng_states: dict | None = None) -> None:
    """A rank failed (its own exception, or a collective timeout): its status says so (a compile
    failure, which had no part yet, writes its part with it), the parts of the job are merged into
    the job archive, and the exception names that archive. After a first call the part written
    before it stays: it holds the inputs as they were, which the call may have changed. ``ask``:
    called with the parts folder before this rank's part is written (a later call's failure asks
    the other ranks for theirs); ``rng_states``: the generator states a later call started from."""

    record = as_collective_timeout(record_from_exception(exc, stage, backend=backend.backend_name))
    timeout = record.stage == "timeout"
    record = redacted(Records(failure=record), working_folder()).failure  # as write_capture stores it
    first = (record.message.splitlines() or [""])[0][:200]
    compile_id = last_compile_id() + (f" (call {call})" if call > 1 else "")
    outcome = RankOutcome(status="timeout" if timeout else "failed", failure=record)
    doing = (f"waited past the timeout in a collective of compile {compile_id}: {first}" if timeout
             else f"lost a peer rank in a collective of compile {compile_id}: {first}" if lost_a_peer(outcome)
             else f"raised in compile {compile_id} ({record.stage})")
    outcome = dataclasses.replace(outcome, doing=doing)
    folder, archive = job_paths(backend.target, ctx, backend.file_target)
    if (timeout or lost_a_peer(outcome)) and _merged_in_this_job(archive) and not folder.exists():
        # a consequence of a peer's failure, whose archive holds every rank already (this one's
        # part of that call included): merging this rank alone again would lose the others
        shown, when = final_place(archive)
        log.warning("reproarchive: rank %d: %s; the job's archive is %s%s", ctx.rank, doing, shown, when)
        _annotate(exc, shown, None, when)
        return
    try:
        if ask is not None:  # the other ranks' parts of this call (``job_calls``)
            ask(folder)
        if not part_written:
            folder, archive = write_part(backend, gm, inputs, config, record, outcome, ctx, rng_states=rng_states)
        # a part of every rank merged: the folder goes now (the launcher is about to stop the other
        # ranks, which cannot be relied on to tidy up); one with a rank missing stays, for ``pack``
        merged = merge_folder(folder, archive, world_size=len(ctx.writers), forget=True, own=(ctx.rank, outcome))
    except Exception as err:  # noqa: BLE001 - reported on the user's exception instead
        log.warning("reproarchive.capture could not write the job archive: %s: %s", type(err).__name__, err)
        _annotate(exc, None, f"{type(err).__name__}: {err}")
        return
    backend.written.append(merged)
    shown, when = final_place(merged)
    log.warning("reproarchive: rank %d: %s failure captured in %s%s", ctx.rank, record.stage, shown, when)
    _annotate(exc, shown, None, when)


def _merged_in_this_job(archive: Path) -> bool:
    """Whether ``archive`` was written since this process began capturing (not left by an
    earlier job launched at the same rendezvous address)."""
    try:
        return archive.stat().st_mtime >= _STARTED
    except OSError:
        return False


def final_place(merged: Path) -> tuple[Path, str]:
    """Where the user finds the job archive ``merged`` (and, where that is later, when)."""
    out = os.environ.get(JOB_OUT_ENV)
    if not out:
        return merged, ""
    return Path(out) / merged.name, " when the job has ended"


# -- ``pack FOLDER``: the parts a job left -----------------------------------------------------


def is_job_parts(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder of rank parts a job's capture left (``job-<key>.parts``)."""
    path = Path(path)
    return path.is_dir() and bool(folder_parts(path))


def pack_job_parts(folder: str | os.PathLike, out: str | os.PathLike | None = None):
    """Merge the parts a job left into one job archive (``out``: default the folder's name
    without ``.parts``, beside it; a folder gets that name inside) and report it (``PackReport``)."""

    folder = Path(folder)
    if not is_job_parts(folder):
        raise SourceError(f"{folder} holds no rank parts (rank-<r>.tar.zst)",
                          "name the job-<key>.parts folder a multi-rank capture left")
    name = folder.name.removesuffix(PARTS_SUFFIX)
    name = name if name.endswith(".tar.zst") else f"{name}.tar.zst"
    target = folder.with_name(name) if out is None else Path(out)
    if target.is_dir():
        target = target / name
    archive = merge_folder(folder, target)
    return archive_report(archive, kind="job")
