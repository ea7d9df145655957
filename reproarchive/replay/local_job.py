"""Every rank of a job in this one process: ``run --single-process``.

PyTorch's ``LocalTensorMode`` simulates the ranks of an SPMD program in one process: a
``LocalTensor`` holds one tensor per rank, every op runs on each, and the functional collectives
compute their real result across the simulated ranks (a sum for ``all_reduce``, the
concatenation for ``all_gather``), where a fake process group returns made-up values. The job's
graph runs once under it, eagerly, on every rank's real inputs; each rank's graph is then judged
by the one judge (``runner.replay_graph``: compile, run, and with ``--accuracy`` compiled
against eager against fp64) with its collectives replaced by the values they produced for that
rank. So an accuracy verdict needs no N processes; what it does not exercise is the compiler's
handling of the collectives themselves, and a hang cannot happen: the launched ``run`` is for
those, and the outcome says so.

The ranks must have compiled one SPMD graph: the same graph on every rank, up to the names of
the groups its collectives use (each rank names its own group of a mesh dimension). Ranks that
compiled different graphs are refused with a one-line error.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
import torch.fx as fx
from torch.fx.node import map_arg

from reproarchive.compat.distributed import LocalTensor, LocalTensorMode, local_tensor_of
from reproarchive.errors import ReproArchiveError
from reproarchive.replay import launch as _launch
from reproarchive.replay import ranks as _ranks
from reproarchive.replay.faithfulness import as_replayed, generated_inputs
from reproarchive.replay.runner import replay_graph


def spmd_structure(gm: Any) -> list[tuple]:
    """A graph's nodes with collective group names left out: equal for ranks of one SPMD graph."""
    out = []
    for node in gm.graph.nodes:
        collective = _ranks.is_collective(node)
        args = tuple("<group>" if collective and isinstance(a, str) else str(a) for a in node.args)
        out.append((node.op, str(node.target), args, tuple(sorted((k, str(v)) for k, v in node.kwargs.items()))))
    return out


def collective_values(gm: Any, per_rank_args: dict[int, list], world_size: int) -> dict[int, dict[str, Any]]:
    """Run ``gm`` once under LocalTensorMode on every rank's arguments: rank -> {collective
    node name -> the value it produced on that rank}. The groups the graph names must be
    registered (a fake process group of ``world_size``, ``ranks.recreate_groups``)."""

    ranks = sorted(per_rank_args)
    collective = {n.name for n in gm.graph.nodes if _ranks.is_collective(n)}
    found: dict[int, dict[str, Any]] = {r: {} for r in ranks}

    class _Recorder(fx.Interpreter):
        def run_node(self, n):
            result = super().run_node(n)
            if n.name in collective and isinstance(result, LocalTensor):
                for r in ranks:
                    found[r][n.name] = local_tensor_of(result, r).detach().clone()
            return result

    with LocalTensorMode(world_size), torch.no_grad():
        args = []
        for i, first in enumerate(per_rank_args[ranks[0]]):
            if isinstance(first, torch.Tensor):
                args.append(LocalTensor({r: per_rank_args[r][i].detach() for r in ranks}))
            else:
                if any(per_rank_args[r][i] != first for r in ranks):
                    raise ReproArchiveError(f"input {i} is a {type(first).__name__} that differs between ranks",
                                            "--single-process needs every rank's graph to take the same scalars; "
                                            "replay the job launched (without --single-process)")
                args.append(first)
        _Recorder(gm).run(*args)
    return found


def without_collectives(gm: Any, args: list, values: dict[str, Any]) -> tuple[Any, list]:
    """``gm`` with every collective read from ``values`` instead (a new input per collective
    whose value a non-collective node uses), and the arguments to match. What the graph sent
    into a collective becomes an output, so the compute that fed it is still compiled, run and
    judged (otherwise everything upstream of the last collective would be dead code)."""

    graph = fx.Graph()
    env: dict[Any, Any] = {}
    extra: list = []
    nodes = list(gm.graph.nodes)
    collective = {n for n in nodes if _ranks.is_collective(n)}
    for node in nodes:
        if node.op == "placeholder":
            env[node] = graph.node_copy(node, lambda a: env[a])
    for node in nodes:
        if node in collective and any(u not in collective for u in node.users):
            env[node] = graph.placeholder(f"{node.name}_value")
            extra.append(values[node.name])
    sent = [a for n in nodes if n in collective for a in n.all_input_nodes
            if a not in collective and a.op != "placeholder"]
    for node in nodes:
        if node.op == "placeholder" or node in env or node in collective:
            continue
        if node.op == "output":
            returned = node.args[0] if isinstance(node.args[0], (tuple, list)) else (node.args[0],)
            extra_out = [n for n in dict.fromkeys(sent) if n not in returned]
            graph.output(tuple(map_arg(tuple(returned), lambda a: env[a])) + tuple(env[n] for n in extra_out))
            continue
        env[node] = graph.node_copy(node, lambda a: env[a])
    new = fx.GraphModule(gm, graph)
    new.graph.eliminate_dead_code()
    new.recompile()
    return new, [*args, *extra]


def _generated(job: Any, part: Any, *, collectives_replaced: bool) -> list[str]:
    """The inputs of ``part``'s replay that hold generated values: its own, and (where its
    collectives were replaced by their values) those values when any rank's inputs were
    generated, for a collective's value is computed from every rank's."""
    own = generated_inputs(part.gm, list(part.fidelity), part.records)
    if not collectives_replaced:
        return own
    sources = [f"rank {r.rank}'s" for r in job.ranks if generated_inputs(r.gm, list(r.fidelity), r.records)]
    return [*own, *([f"the collectives' values (computed from {', '.join(sources)} generated inputs)"]
                    if sources else [])]


def run_local(ready: Any) -> _launch.JobOutcome:
    """``run --single-process`` of the job archive ``ready`` (``replay.prepared``, in this
    process: the user's implementations brought, the devices resolved)."""

    start = time.monotonic()
    settings, world_size, recorded_rank = ready.asked, ready.index.job.world_size, ready.index.job.failing_rank
    job = ready.load_job()
    lead = job.ranks[0]
    shape = spmd_structure(lead.gm)
    odd = [r.rank for r in job.ranks if spmd_structure(r.gm) != shape]
    if odd:
        raise ReproArchiveError(f"ranks {odd} compiled another graph than rank {lead.rank}: --single-process "
                                "runs one SPMD graph for every rank",
                                "replay the job launched (reproarchive run without --single-process)")

    if dist.is_initialized():
        raise ReproArchiveError("this process already belongs to a process group: --single-process simulates the "
                                "job's ranks in a process of its own", "run it from a process without one")
    def replayed(part: Any, gm: Any, args: list, note: str) -> _launch.RankOutcome:
        # each rank under its own records (its backend among them), judged against its own failure
        chosen = settings.for_recorded(part.records.backend, part.records.accuracy)
        whole = gm is part.gm
        outcome = as_replayed(replay_graph(gm, args, chosen, part.records, report_differences=False,
                                           input_records=part.input_records if whole else None,
                                           rng_states=part.rng_states), list(part.stand_ins),
                              _generated(job, part, collectives_replaced=not whole))
        return _launch.RankOutcome(part.rank, outcome.status, outcome, note=note)

    _ranks.init_fake(lead.rank, world_size)
    try:
        _ranks.recreate_groups(_ranks.group_specs(job.job))
        try:
            values = collective_values(lead.gm, {r.rank: list(r.args) for r in job.ranks}, world_size)
        except ReproArchiveError:
            raise
        except Exception as exc:  # noqa: BLE001 - a rank's graph raised before its collectives had values
            # the recorded failure may be exactly that (an index out of range before a collective):
            # each rank then runs its whole graph against the fake group, whose values are made up
            outcomes = [replayed(part, part.gm, list(part.args), "collectives answered by a fake process group")
                        for part in job.ranks]
            warning = (f"the job's graph raised before its collectives had values ({type(exc).__name__}: "
                       f"{(str(exc).splitlines() or [''])[0][:160]}): every rank ran against a fake process "
                       "group, whose collectives return made-up values, so only a failure in the compiler or "
                       "before the first collective is evidence")
        else:
            outcomes, warning = None, None
    finally:
        dist.destroy_process_group()
    if outcomes is None:
        outcomes = [replayed(part, *without_collectives(part.gm, list(part.args), values[part.rank]),
                             "collectives replaced by their LocalTensorMode values") for part in job.ranks]
        warning = ("every rank ran in this process (LocalTensorMode): the collectives' values are real, but the "
                   "compiler did not see the collectives and nothing can hang here; run without --single-process "
                   "to replay them")
    status, code, rank = _launch.job_verdict(outcomes, recorded_rank)
    return _launch.JobOutcome(
        status=status, exit_code=code, rank=rank, world_size=world_size, ranks=outcomes, recorded_rank=recorded_rank,
        wall_s=round(time.monotonic() - start, 3), warnings=[warning])
