"""``run --minify`` of a multi-rank job archive: every rank's graph shrunk by the same cut, judged
by replaying the whole job through torch.distributed's launcher.

How the ranks stay consistent. The job is first launched once to record, on every rank, the value
each collective gave that rank (``rank_worker``'s ``record`` mode: the graphs run eagerly with real
collectives). Each rank's graph then reads those values in place of its collectives
(``local_job.without_collectives``): the collectives are *replaced by their recorded per-rank
values*, so no cut can leave one rank waiting in a collective another rank no longer issues, and
the failing rank's graph can be searched by the ordinary minifier (``search``: cuts, truncation,
bypasses, every candidate judged once). A candidate is the set of node names the failing rank's
graph keeps (and its outputs); the same names are kept on every rank, whose cut inputs hold that
rank's own recorded values, and the job of all ranks' candidates is packed and judged. Where the
search inlines a higher-order operator (a ``cond``'s branch) on the failing rank, every rank's
graph is inlined the same way first (``_SameCuts``), so names from inside the branch are found
on every rank, and the inputs cut there keep the symbols their sizes had (``_inner_values``).

The oracle is the launcher, and its processes are reused across candidates
(``launch.LaunchedJob``): candidates hold no collectives, so a candidate leaves nothing pending
in the process group that could change the next verdict; a candidate that takes a rank down
ends the job and the next candidate gets a fresh launch. A failure that needs the collectives
themselves (the compiler's handling of a collective, a hang) does not reproduce once they are
replaced, and is refused with a one-line error rather than minified into something else.

A recording made on PyTorch's fake process group (one process playing one rank; the others never
ran) is minified as it ran: its rank alone, in one launched process, against the fake group, whose
collectives' values are recorded and replaced in the same way.
"""

from __future__ import annotations

import dataclasses
import itertools
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
import torch.fx as fx

from reproarchive.archive.job_archive import RankCapture, pack_job
from reproarchive.archive.packing import as_records
from reproarchive.child import temp_folder
from reproarchive.codec.graphs import readable_code
from reproarchive.codec.inner_shapes import cut_from, inner_dims
from reproarchive.context.failure import faults_the_device
from reproarchive.errors import NotReproducedError, ReproArchiveError
from reproarchive.minifier import NotFailingError, minify_with_stats
from reproarchive.minifier.candidate import Recording
from reproarchive.minifier.minified_records import labelled, minified_records, not_original_positions
from reproarchive.minifier.report import MinifyReport, output_path
from reproarchive.minifier.subgraphs import inlined_alike, inlining_steps
from reproarchive.replay import launch as _launch
from reproarchive.replay.local_job import without_collectives
from reproarchive.replay.ranks import is_collective
from reproarchive.replay.settings import ReplaySettings


def _plan(job: Any, request: dict[str, Any], timeout_s: float, warm: bool) -> _launch.LaunchPlan:
    """The launch of ``job``'s ranks: every rank of its world, or the one rank a recording on the
    fake process group played, alone against that group (as recorded)."""
    if job.on_fake_group:
        request = {**request, "fake_rank": job.failing_rank, "world_size": job.world_size, "fake_when_recorded": True}
        return _launch.LaunchPlan(request, _launch.launcher_options(1), timeout_s, warm=warm)
    return _launch.LaunchPlan(request, _launch.launcher_options(job.world_size), timeout_s, warm=warm)


def _record_values(path, settings: ReplaySettings, job: Any, timeout_s: float, folder: Path,
                   warm: bool) -> dict[int, dict]:
    """Launch the job once in ``record`` mode: rank -> {collective node name -> tensor}."""

    request = {"archive": str(Path(path).resolve()), "settings": settings.to_plain(), "timeout_s": timeout_s,
               "mode": "record"}
    folder.mkdir(parents=True, exist_ok=True)
    _launch.launch(_plan(job, request, timeout_s, warm), folder)
    values = {}
    for rank in (r.rank for r in job.ranks):
        try:
            values[rank] = torch.load(folder / f"values-{rank}.pt", weights_only=True)
        except OSError:
            said = _launch._read(folder / f"rank-{rank}.json") or {}
            raise NotReproducedError(
                f"rank {rank}'s graph does not run eagerly with real collectives "
                f"({said.get('error', 'it ended without its values')})",
                "the failure is not the compiler's; `reproarchive run --backend eager` shows it") from None
    return values


def _names(gm: Any) -> tuple[set[str], list[str]]:
    """(the op nodes ``gm`` keeps, the names it returns), by original node name."""

    kept = {n.name for n in gm.graph.nodes if n.op not in ("placeholder", "output", "get_attr")}
    outs: list[str] = []
    output = next(n for n in gm.graph.nodes if n.op == "output")
    fx.node.map_arg(output.args, lambda a: outs.append(a.name) or a)
    return kept, outs


def _same_cut(recording: Any, kept: set[str], outs: list[str]) -> tuple[Any, list, list[dict[str, Any]]]:
    """Rank r's graph cut like the failing rank's candidate (the same node names kept and
    returned), its inputs, and their provenance (``Recording.input_provenance``)."""
    index = {n.name: i for i, n in enumerate(recording.nodes)}
    keep = [index[name] for name in kept if name in index and recording.is_op[index[name]]]
    outputs = [index[name] for name in outs if name in index]
    cand = recording.normalise(keep, outputs=outputs or None)
    gm, inputs = recording.build(cand)
    return gm, inputs, recording.input_provenance(cand)


class _SameCuts:
    """Every rank's graph cut like the lead rank's candidate: rank -> (its cut, inputs, their
    provenance, the graph the cut was made from). Where the lead's search inlined a higher-order
    operator (``minifier.subgraphs``), each rank's graph is inlined alike first, so the names
    the lead's candidate keeps from inside a subgraph are found on every rank."""

    def __init__(self, free: dict[int, tuple[Any, list]], lead: int):
        self.free, self.lead = free, lead
        self.recordings: dict[tuple, Recording] = {}

    def recording(self, rank: int, steps: list) -> Recording:
        if (rank, tuple(steps)) not in self.recordings:
            gm, args = self.free[rank]
            inlined = inlined_alike(gm, steps) if steps else None
            self.recordings[rank, tuple(steps)] = (self.recording(rank, []) if steps and inlined is None else
                                                   Recording(gm if inlined is None else inlined, args))
        return self.recordings[rank, tuple(steps)]

    def __call__(self, gm: Any, inputs: list) -> dict[int, tuple[Any, list, list, Any]]:
        kept, outs = _names(gm)
        parent = cut_from(gm, gm)  # the lead's graph, or that graph with operators inlined
        steps = inlining_steps(parent)
        return {rank: (gm, list(inputs), [], parent) if rank == self.lead else
                (*_same_cut(self.recording(rank, steps), kept, outs), self.recording(rank, steps).gm)
                for rank in self.free}


def _generated(job: Any, free: dict[int, tuple[Any, list]]) -> dict[int, set[int]]:
    """rank -> positions of its collective-free graph's inputs (``free``) that are not original
    data: its own generated inputs, and every collective's recorded value when any rank's input
    was generated (a collective's value is computed from every rank's)."""
    own = {r.rank: not_original_positions(r.fidelity, r.records) for r in job.ranks}
    if not any(own.values()):
        return own
    return {r.rank: own[r.rank] | set(range(len(r.args), len(free[r.rank][1]))) for r in job.ranks}


class _JobOracle:
    """Judges a candidate job (every rank's graph and inputs) in a reused launched job, launched
    anew after a candidate that crashed a rank or faulted a rank's device."""

    def __init__(self, job: Any, settings: ReplaySettings, timeout_s: float, folder: Path, warm: bool):
        self.job, self.settings, self.timeout_s, self.folder, self.warm = job, settings, timeout_s, folder, warm
        self.launched: _launch.LaunchedJob | None = None
        self.launches = 0
        self.counter = itertools.count(1)
        self.recorded = {r.rank: (r.outcome.failure if r.outcome is not None else None) for r in job.ranks}

    def __call__(self, parts: dict[int, tuple[Any, list]], parents: dict[int, Any]) -> bool:
        archive = self.folder / f"candidate-{next(self.counter)}.tar.zst"
        pack_parts(self.job, parts, archive, records=self.job.records, parents=parents)
        try:
            if self.launched is None or not self.launched.alive:
                self.launches += 1
                request = {"archive": str(archive), "settings": self.settings.to_plain(),
                           "timeout_s": self.timeout_s, "mode": "candidates"}
                self.launched = _launch.LaunchedJob(_plan(self.job, request, self.timeout_s, self.warm),
                                                    self.folder / f"launch-{self.launches}")
            outcomes = self.launched.judge(archive, self.settings.to_plain(), sorted(self.recorded), self.recorded)
            # a rank whose device faulted fails every later use of it: the next candidate gets a new job
            if any(o.outcome is not None and faults_the_device(o.outcome.observed) for o in outcomes):
                self.launched.close()
                self.launched = None
        finally:
            archive.unlink(missing_ok=True)
        status, _, rank = _launch.job_verdict(outcomes, self.job.failing_rank)
        return status == "reproduced" and rank == self.job.failing_rank

    def close(self) -> None:
        if self.launched is not None:
            self.launched.close()


def pack_parts(job: Any, parts: dict[int, tuple[Any, list]], path: Path, *, records: Any,
               parents: dict[int, Any] | None = None, minify_of: dict[int, Any] | None = None) -> Path:
    """A job archive of ``parts`` (rank -> graph, inputs) with the job's groups, ranks' devices,
    recorded outcomes, generator states and custom-op calls; the graphs issue no collectives, so
    their schedules are empty. Each rank keeps its own records, made by ``minified_records`` as
    one graph's are (``records`` gives the provenance: ``parent``, ``minify``): its shape
    policy for the inputs its cut kept, by placeholder name against ``parents`` (rank -> the
    graph the cut was made from; default: the rank's loaded graph) and its own minify record
    (``minify_of``: the provenance of its own inputs; default: ``records.minify``)."""

    captures = []
    for r in job.ranks:
        gm, inputs = parts[r.rank]
        record = dataclasses.replace(r.record, graph=None, inputs=None, schedule=(), compiles=(), dtensors=())
        parent_gm = (parents or {}).get(r.rank, r.gm)
        minify = (minify_of or {}).get(r.rank, records.minify)
        own = minified_records(r.records, records.parent, parent_gm, gm, list(inputs), minify,
                               _inner_values(r, parent_gm))
        captures.append(RankCapture(gm, list(inputs), record, own, r.rng_states, custom_ops=r.custom_ops))
    return pack_job(captures, path, world_size=job.world_size, backend=job.backend, groups=job.groups,
                    meshes=job.meshes)


def _inner_values(rank: Any, parent: Any) -> Any:
    """The symbols of the inner values (``codec.inner_shapes``) of ``parent``, the graph a rank's
    cut was made from: its graph without collectives, or that graph with an operator inlined. Its
    inputs are the rank's, and its collectives' values (``without_collectives`` names each after
    its collective), whose symbols are those of the collective's output in the rank's graph."""
    fed_by = {f"{n.name}_value": n.name for n in rank.gm.graph.nodes if is_collective(n)}
    return inner_dims(rank.records.shapes, rank.gm, list(rank.args), None if parent is rank.gm else parent, fed_by)


def _failing_job(ready: Any) -> Any:
    """The job, which must name the rank whose failure every cut is judged on."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        job = ready.load_job()
    if job.failing_rank is None:
        raise ReproArchiveError("the job archive records no failing rank to minify against",
                                "replay it with `reproarchive run` to see what happens")
    return job


def minify_job(ready: Any, output, *, timeout_s: float = 60.0, max_time: float | None = None,
               progress: Callable[[Any], None] | None = None) -> MinifyReport:
    """Shrink every rank's graph of the job archive ``ready`` (``replay.prepared``: devices
    resolved, backend found) by one cut while the recorded failure keeps reproducing on the
    recorded rank; write the job archive ``output``."""

    path, settings = ready.path, ready.asked
    output = output_path(path, output)
    job = _failing_job(ready)
    lead = job.failing_rank
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="reproarchive-job-minify-", dir=temp_folder()) as tmp:
        folder = Path(tmp)
        warm = _launch.on_cpu_only(ready.plan.targets)  # ranks on the CPU are forked from warm imports
        values = _record_values(path, settings, job, timeout_s, folder / "record", warm)
        free = {r.rank: without_collectives(r.gm, list(r.args), values[r.rank]) for r in job.ranks}
        oracle = _JobOracle(job, settings, timeout_s, folder, warm)
        cuts_for = _SameCuts(free, lead)

        def fails(gm, inputs) -> bool:
            cuts = cuts_for(gm, inputs)
            return oracle({rank: (g, i) for rank, (g, i, _, _) in cuts.items()},
                          {rank: parent for rank, (_, _, _, parent) in cuts.items()})

        try:
            result = minify_with_stats(free[lead][0], free[lead][1], fails, max_time=max_time, progress=progress,
                                       shrink_inputs=False)
        except NotFailingError:
            raise NotReproducedError(
                f"{path} does not reproduce on rank {lead} once its collectives are replaced by their recorded "
                "values: the failure needs the collectives themselves (or does not reproduce here)",
                "replay the job with `reproarchive run`; a job is minified only when its failure is in its compute",
            ) from None
        finally:
            oracle.close()
        stats = result.stats.as_dict()
        stats.update(wall_s=round(time.monotonic() - started, 3), input_origins=result.input_origins)
        generated = _generated(job, free)
        stats["inputs"] = labelled(stats.get("inputs") or [], generated[lead])
        cuts = cuts_for(result.gm, result.inputs)
        minify_of = {rank: as_records({"minify": stats if rank == lead else
                                       {**stats, "inputs": labelled(provenance, generated[rank])}}).minify
                     for rank, (_, _, provenance, _) in cuts.items()}
        stats.update(launches=oracle.launches + 1, collectives="replaced by their recorded per-rank values",
                     ranks=job.world_size, rank=lead)
        records = dataclasses.replace(job.records, parent=job.digest, minify=minify_of[lead])
        pack_parts(job, {rank: (g, i) for rank, (g, i, _, _) in cuts.items()}, output, records=records,
                   parents={rank: parent for rank, (_, _, _, parent) in cuts.items()}, minify_of=minify_of)
    return MinifyReport(archive=str(path), output=str(output), parent=job.digest,
                        status="minified" if result.stats.accepted else "unchanged", stats=stats,
                        code=readable_code(result.gm), input_origins=result.input_origins)

