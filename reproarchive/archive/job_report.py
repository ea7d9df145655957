"""What a job archive says about its ranks, without running anything: who failed and how, each
rank's collectives side by side, and the first collective at which they diverge (a hang's cause).

A hang in a multi-rank job is ranks waiting in collectives that do not match: one rank took
another branch, recompiled, or skipped a step, and from there its collectives (operator, group,
shapes) stop lining up with the others'. The recorded schedules say where: the first position
at which the ranks' collectives differ, or at which one rank has none left. The rank that
diverged is the one in the minority there; between two ranks, the one whose schedule ended (it
skipped a collective the other waits in). ``inspect``, ``diff`` and ``view`` print this report;
a replay of the hang can say the same from it.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import field

from reproarchive.context.environment import machine_specific
from reproarchive.format.plain import PlainData, PlainRecord, to_plain
from reproarchive.format.schema import CollectiveRecord, DTensorInput, JobRecord, PlacementRecord, Records

_OMIT_NONE = {"omit": "none"}


def collective_text(c: CollectiveRecord | None) -> str | None:
    """One collective as people read it: ``all_reduce on group '0' float32[4]``."""
    if c is None:
        return None
    tensors = ", ".join(f"{d}{list(s)}" for s, d in zip(c.shapes, c.dtypes))
    group = f" on group {c.group!r}" if c.group is not None else ""
    return f"{c.op}{group}" + (f" {tensors}" if tensors else "")


def _key(c: CollectiveRecord | None):
    return None if c is None else (c.op, c.group, c.shapes, c.dtypes)


@dataclasses.dataclass(frozen=True)
class Divergence(PlainRecord):
    """The first collective at which the ranks' schedules differ: the group whose members stop
    matching, which collective on that group (``index``, 0-based) and where it stands in the
    schedule of a rank that issued it (``position``, 0-based); the rank that diverged (and
    every rank in the minority), what the others issued there and what it issued (None: it
    had none left on that group: it skipped the collective the others wait in)."""

    group: str | None
    index: int
    position: int
    rank: int
    ranks: tuple[int, ...]
    expected: str | None
    got: str | None
    summary: str


def first_divergence(job: JobRecord) -> Divergence | None:
    """Where the recorded ranks' collectives first stop matching, or None when they agree.

    Collectives match per process group: the members of a group must issue the same
    collectives on it, in the same order (a sub-group's collectives are no business of ranks
    outside it). Of the groups whose members disagree, the one that disagrees earliest in the
    ranks' schedules is reported."""
    ranks = {r.rank: r for r in job.ranks}
    members_of = {g.name: [r for r in g.ranks if r in ranks] for g in job.groups}
    found: list[tuple[int, Divergence]] = []
    for group in dict.fromkeys(c.group for r in job.ranks for c in r.schedule):
        members = members_of.get(group, sorted(ranks)) if group is not None else sorted(ranks)
        if len(members) < 2:
            continue
        seqs = {m: [(p, c) for p, c in enumerate(ranks[m].schedule) if c.group == group] for m in members}
        divergence = _group_divergence(group, seqs, {m: len(ranks[m].schedule) for m in members})
        if divergence is not None:
            found.append(divergence)
    return min(found, key=lambda f: f[0])[1] if found else None


def _group_divergence(group: str | None, seqs: dict[int, list], lengths: dict[int, int]
                      ) -> tuple[int, Divergence] | None:
    """``seqs``: each member's (position, collective) on ``group``; a member with none left
    stands at the end of its schedule (``lengths``)."""
    for i in range(max(len(s) for s in seqs.values())):
        entries = {m: (s[i] if i < len(s) else (lengths[m], None)) for m, s in seqs.items()}
        keys = {m: _key(c) for m, (_, c) in entries.items()}
        if len(set(keys.values())) == 1:
            continue
        counts = Counter(keys.values())
        # the majority's collective is the expected one; on a tie, a collective issued beats none
        expected = max(counts, key=lambda k: (counts[k], k is not None))
        minority = tuple(m for m, k in keys.items() if k != expected)
        rank = minority[0]
        position, want = next((p, c) for p, c in entries.values() if _key(c) == expected)
        want_text, got = collective_text(want), collective_text(entries[rank][1])
        others = [m for m in keys if m not in minority]
        who = f"rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))}"
        on = f"on group {group!r}" if group is not None else "without a group"
        if got is None:
            summary = (f"rank {rank} issued no collective #{i + 1} {on}, where {who} issued {want_text}: "
                       f"rank {rank} skipped it (the others wait in it)")
        elif want_text is None:
            summary = f"rank {rank} issued {got} as collective #{i + 1} {on}, where {who} had none left"
        else:
            summary = f"collective #{i + 1} {on}: rank {rank} issued {got}, where {who} issued {want_text}"
        earliest = min(p for p, _ in entries.values())
        return earliest, Divergence(group=group, index=i, position=position, rank=rank, ranks=minority,
                                    expected=want_text, got=got, summary=summary)
    return None


@dataclasses.dataclass(frozen=True)
class DTensorRow(PlainRecord):
    """A rank's input that was a DTensor: its global shape, placements (one per mesh dimension,
    as torch writes them: ``Shard(0)``, ``Replicate()``, ``Partial(sum)``) and mesh."""

    input: int
    shape: tuple[int, ...]
    placements: tuple[str, ...]
    mesh_shape: tuple[int, ...]
    mesh_dim_names: tuple[str, ...] | None = field(default=None, metadata=_OMIT_NONE)

    @property
    def text(self) -> str:
        names = f" ({', '.join(self.mesh_dim_names)})" if self.mesh_dim_names else ""
        return (f"input {self.input}: DTensor {tuple(self.shape)} [{', '.join(self.placements)}] on mesh "
                f"{tuple(self.mesh_shape)}{names}")


def placement_text(p: PlacementRecord) -> str:
    if p.kind == "shard":
        return f"Shard({p.dim})"
    if p.kind == "partial":
        return f"Partial({p.reduce_op or 'sum'})"
    return "Replicate()"


def _dtensor_row(d: DTensorInput, job: JobRecord) -> DTensorRow:
    mesh = job.meshes[d.mesh]  # an index the reader checked (R8-5)
    return DTensorRow(input=d.input, shape=tuple(d.shape), placements=tuple(placement_text(p) for p in d.placements),
                      mesh_shape=tuple(mesh.shape), mesh_dim_names=tuple(mesh.dim_names) if mesh.dim_names else None)


@dataclasses.dataclass(frozen=True)
class RankRow(PlainRecord):
    """One rank of a job archive: how it ended, what it was doing, which graph it ran."""

    rank: int
    status: str
    graph: str  # "primary" (the index's own), "job graph N", or "same as the primary"
    collectives: int
    local_rank: int | None = field(default=None, metadata=_OMIT_NONE)
    doing: str | None = field(default=None, metadata=_OMIT_NONE)
    failure: str | None = field(default=None, metadata=_OMIT_NONE)
    signal: str | None = field(default=None, metadata=_OMIT_NONE)
    dtensors: int = 0
    dtensor_inputs: tuple[DTensorRow, ...] = ()
    # what it recorded otherwise than the primary rank (``records_differ``); empty: the same
    own_records: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class JobSummary(PlainRecord):
    """A job archive's ranks (spec §8 ``job``): ``schedule`` has one row per position, one cell
    per recorded rank (in ``ranks`` order; None where a rank issued no collective there)."""

    world_size: int
    backend: str | None
    primary_rank: int
    failing_rank: int | None
    ranks: tuple[RankRow, ...]
    missing_ranks: tuple[int, ...]
    groups: PlainData
    meshes: PlainData
    schedule: tuple[tuple[str | None, ...], ...]
    divergence: Divergence | None


#: the record sections a rank may hold otherwise than the primary, by name (its failure and its
#: generator states are its own by nature, and said elsewhere)
_COMPARED = ("backend", "accuracy", "execution", "shapes", "system")


def records_differ(own: Records, primary: Records) -> tuple[str, ...]:
    """What a rank recorded otherwise than the primary rank: each torch config setting whose
    value differs (``module.name``), each environment variable a replay sets (``$NAME``; not a
    path or a port, which differ between ranks by nature), and the other sections by name.
    Where a bug injector or a flag was set on one rank alone, this says so."""
    found = []
    a, b = own.config.modules if own.config else {}, primary.config.modules if primary.config else {}
    for module in sorted(set(a) | set(b)):
        mine, theirs = a.get(module, {}), b.get(module, {})
        found += [f"{module}.{k}" for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)]
    va = own.environment.variables if own.environment else {}
    vb = primary.environment.variables if primary.environment else {}
    found += [f"${k}" for k in sorted(set(va) | set(vb)) if va.get(k) != vb.get(k) and not machine_specific(k)]
    return tuple(found + [name for name in _COMPARED if getattr(own, name) != getattr(primary, name)])


def job_summary(job: JobRecord, primary: Records | None = None) -> JobSummary:
    """The summary of ``job``; ``primary``: the index's records (the primary rank's), which
    each rank's own records are compared with (None: not compared)."""
    ranks = sorted(job.ranks, key=lambda r: r.rank)
    rows = []
    for r in ranks:
        outcome = r.outcome
        failure = outcome.failure if outcome is not None else None
        graph = "primary" if r.rank == job.primary_rank else \
            "same as the primary" if r.graph is None else f"job graph {r.graph}"
        first = (failure.message.splitlines() or [""])[0][:160] if failure is not None and failure.message else None
        rows.append(RankRow(
            rank=r.rank, status=str(outcome.status) if outcome is not None else "unknown", graph=graph,
            collectives=len(r.schedule), local_rank=r.local_rank, doing=outcome.doing if outcome else None,
            failure=f"{failure.stage}: {failure.exception_type}: {first}" if failure is not None else None,
            signal=outcome.signal if outcome else None, dtensors=len(r.dtensors),
            dtensor_inputs=tuple(_dtensor_row(d, job) for d in r.dtensors),
            own_records=records_differ(job.records[r.records], primary)
            if primary is not None and r.records is not None else ()))
    length = max((len(r.schedule) for r in ranks), default=0)
    schedule = tuple(tuple(collective_text(r.schedule[i]) if i < len(r.schedule) else None for r in ranks)
                     for i in range(length))
    recorded = {r.rank for r in ranks}
    return JobSummary(
        world_size=job.world_size, backend=job.backend, primary_rank=job.primary_rank, failing_rank=job.failing_rank,
        ranks=tuple(rows), missing_ranks=tuple(r for r in range(job.world_size) if r not in recorded),
        groups=[to_plain(g) for g in job.groups], meshes=[to_plain(m) for m in job.meshes],
        schedule=schedule, divergence=first_divergence(job))


def job_lines(summary: JobSummary) -> list[str]:
    """The text ``inspect``, ``diff`` and ``view`` print for a job: ranks, groups, the schedules
    side by side, and the divergence."""
    lines = [f"job: {summary.world_size} ranks ({summary.backend or 'backend unknown'}), "
             f"failing rank {summary.failing_rank if summary.failing_rank is not None else 'none'}, "
             f"graph and inputs above are rank {summary.primary_rank}'s"]
    if summary.missing_ranks:
        lines.append(f"  not recorded: rank {', '.join(map(str, summary.missing_ranks))}")
    for row in summary.ranks:
        what = row.failure or row.doing or ""
        extra = f" [{row.signal}]" if row.signal else ""
        lines.append(f"  rank {row.rank}: {row.status}{extra}, {row.collectives} "
                     f"collective{'s' if row.collectives != 1 else ''}, graph {row.graph}"
                     + (f": {what}" if what else ""))
        lines.extend(f"    {d.text}" for d in row.dtensor_inputs)
        if row.own_records:
            shown = ", ".join(row.own_records[:4]) + (f" (and {len(row.own_records) - 4} more)"
                                                       if len(row.own_records) > 4 else "")
            lines.append(f"    its own records differ from rank {summary.primary_rank}'s in: {shown}")
    for g in summary.groups:
        dim = f", mesh dim {g['mesh_dim']}" if g.get("mesh_dim") else ""
        lines.append(f"  group {g['name']!r}: ranks {g['ranks']}{dim}")
    for m in summary.meshes:
        lines.append(f"  mesh {m['shape']} {m.get('dim_names') or ''}: ranks {m['ranks']}")
    if summary.schedule:
        ranks = [row.rank for row in summary.ranks]
        width = max(12, *(len(c or "-") for row in summary.schedule for c in row))
        width = min(width, 48)
        lines.append("  collectives:  " + "".join(f"{'rank ' + str(r):{width + 2}s}" for r in ranks).rstrip())
        for i, row in enumerate(summary.schedule):
            mark = ">>" if summary.divergence is not None and i == summary.divergence.position else "  "
            cells = "".join(f"{(c or '-')[:width]:{width + 2}s}" for c in row)
            lines.append(f"  {mark}{i + 1:4d}.     {cells}".rstrip())
    if summary.divergence is not None:
        lines.append(f"  diverged: {summary.divergence.summary}")
    elif summary.schedule:
        lines.append("  the ranks' collectives agree")
    return lines
