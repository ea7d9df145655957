"""One archive for the job a multi-rank TORCH_TRACE folder logged (one log per rank).

``pack`` of such a folder writes one archive per compile and rank, as for one process; when the
compiles it packed come from several ranks it also merges them into one job archive
(``repro-job.tar.zst``, spec §8 ``job``): per rank its failing compile (else its last packed
one), with the collectives its graph issues and how the log says the compile went. With the
default selection (the failed compiles), the other ranks' compiles of the same ids are packed
too, so the job archive holds every rank. What a log cannot say is left out or said: the
process groups' members are the ranks whose graphs use them (``desc`` says so), there are no
shapes in the schedule, and a rank whose compile succeeded has outcome ``unknown``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reproarchive.archive.job_archive import rank_part_job
from reproarchive.archive.job_merge import merge_parts
from reproarchive.codec.collectives import graph_collectives
from reproarchive.format.reader import ContainerReader
from reproarchive.format.schema import CollectiveRecord, CompileRecord, ProcessGroupRecord, RankOutcome, RankRecord
from reproarchive.sources.pack_report import PackReport, archive_report

JOB_ARCHIVE = "repro-job.tar.zst"


def job_companions(trace: Any, chosen: list, *, rank: int | None, explicit: bool) -> list:
    """The other ranks' compiles of the ids chosen, for a multi-rank trace packed with the
    default selection (``explicit``: compile ids or --all were given, ``rank``: one rank)."""
    ranks = {c.rank for c in trace.compiles if c.rank is not None}
    if len(ranks) < 2 or rank is not None or explicit:
        return []
    ids = {c.id for c in chosen}
    have = {(c.rank, c.id) for c in chosen}
    return [c for c in trace.compiles if c.id in ids and c.rank is not None and (c.rank, c.id) not in have]


def write_job_archive(packed: list[PackReport], trace: Any, out_dir: Path) -> PackReport | None:
    """Merge one packed compile per rank into ``out_dir/repro-job.tar.zst``; None for one rank."""
    by_rank: dict[int, PackReport] = {}
    for report in packed:
        if report.rank is None:
            continue
        known = by_rank.get(report.rank)
        if known is None or not known.failure or report.failure:
            by_rank[report.rank] = report
    if len(by_rank) < 2:
        return None
    world_size = max(len({c.rank for c in trace.compiles if c.rank is not None}), max(by_rank) + 1)
    records = {r: _rank_record(r, report) for r, report in sorted(by_rank.items())}
    users: dict[str, list[int]] = {}
    for r, record in records.items():
        for c in record.schedule:
            if c.group is not None and r not in users.setdefault(c.group, []):
                users[c.group].append(r)
    groups = [ProcessGroupRecord(name=name, ranks=tuple(sorted(members)),
                                 desc="members: the ranks whose graphs use it (the log does not list them)")
              for name, members in users.items()]
    parts = [by_rank[r].archive for r in records]
    jobs = {i: rank_part_job(record, world_size=world_size, backend=None, groups=groups)
            for i, record in enumerate(records.values())}
    archive = merge_parts(parts, out_dir / JOB_ARCHIVE, jobs=jobs)
    return archive_report(archive, kind="job")


def _rank_record(rank: int, report: PackReport) -> RankRecord:
    with ContainerReader(report.archive) as reader:
        index = reader.index
    schedule = tuple(CollectiveRecord(op=c.op, group=c.group, compile_id=report.compile_id, node=c.node)
                     for c in graph_collectives(index.graph) if c.op != "wait_tensor")
    failure = index.records.failure
    outcome = RankOutcome(status="failed", failure=failure) if failure is not None else \
        RankOutcome(status="unknown", doing=f"compiled [{report.compile_id}] without error (the log says nothing "
                                            "of the run)")
    return RankRecord(rank=rank, schedule=schedule, outcome=outcome,
                      compiles=(CompileRecord(compile_id=report.compile_id or "?"),))
