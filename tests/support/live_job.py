"""A live job for the multi-rank replay engine's tests, started by torch.distributed's launcher:
``python -m torch.distributed.run --nproc-per-node N tests/support/live_job.py SCENARIO FOLDER``.

Every rank traces the same small function with functional collectives (what Dynamo hands a
backend), as a captured job's graphs are, and packs it with its own real inputs as its part of the job
(the recorded group table, its recorded failure), and hands that to the replay engine's rank
worker (``rank_worker.loaded``, ``rank_worker.serve``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.fx as fx

import reproarchive
from reproarchive.archive.job_archive import rank_part_job
from reproarchive.format.schema import ProcessGroupRecord, RankOutcome, RankRecord
from reproarchive.replay import rank_worker
from reproarchive.replay.settings import ReplaySettings

c10d = torch.ops._c10d_functional


def sub_groups(x):
    # "1" is [0, 1] and "2" is [2, 3] (created in that order); "3" and "4" are the 2x2 mesh's
    # columns [0, 2] and [1, 3]
    rank = int(os.environ["RANK"])
    row, col = ("1", "3") if rank in (0, 1) else ("2", "3")
    if rank in (1, 3):
        col = "4"
    y = c10d.wait_tensor(c10d.all_reduce(x, "sum", row))
    return (c10d.wait_tensor(c10d.all_reduce(y, "sum", col)),)


@torch.library.custom_op("mrtest::aborts_on_rank_one", mutates_args=())
def aborts_on_rank_one(x: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized() and dist.get_rank() == 1:
        os.abort()
    return x.clone()


@aborts_on_rank_one.register_fake
def _(x):
    return torch.empty_like(x)


def aborting_on_rank_one(x):
    return (torch.ops.mrtest.aborts_on_rank_one(x) + 1,)


def world_all_reduce(x):
    return (c10d.wait_tensor(c10d.all_reduce(x, "sum", "0")) + 1,)


SCENARIOS = {
    "world_all_reduce": (world_all_reduce, None),
    "aborts_on_rank_one": (aborting_on_rank_one, {1: "crash"}),
    "sub_groups": (sub_groups, None),
}


def _recorded_crash():
    from reproarchive.context.failure import crash_record

    return crash_record("SIGABRT", "the job's rank 1 was killed by SIGABRT (6)", "")


RECORDED = {"crash": _recorded_crash}


def main(scenario: str, folder: str) -> int:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rank_worker.redirect_output(Path(folder), rank)
    fn, failing = SCENARIOS[scenario]
    request = json.loads((Path(folder) / "request.json").read_text())
    gm = fx.symbolic_trace(fn)
    groups = [ProcessGroupRecord("0", tuple(range(world)), index=0)]
    if scenario == "sub_groups":
        groups += [ProcessGroupRecord("1", (0, 1), index=1, mesh_dim="dp"),
                   ProcessGroupRecord("2", (2, 3), index=2, mesh_dim="dp"),
                   ProcessGroupRecord("3", (0, 2), index=3, mesh_dim="tp"),
                   ProcessGroupRecord("4", (1, 3), index=4, mesh_dim="tp")]
    recorded = RECORDED[failing[rank]]() if failing and rank in failing else None
    device = f"cuda:{os.environ['LOCAL_RANK']}" if request.get("cuda") else "cpu"
    # this rank's part of the job, as a captured job's rank writes it, then replayed as a launched rank loads it
    outcome = RankOutcome(status="crashed", failure=recorded, signal="SIGABRT") if recorded is not None else None
    part = Path(folder) / f"live-rank-{rank}.tar.zst"
    reproarchive.pack(gm, [torch.arange(4, dtype=torch.float32, device=device) + rank], part,
                      job=rank_part_job(RankRecord(rank=rank, outcome=outcome), world_size=world, backend=None,
                                        groups=groups))
    ready, repro = rank_worker.loaded(str(part), ReplaySettings(backend=request.get("backend", "eager")), rank)
    code = rank_worker.serve(ready, repro, Path(folder), timeout_s=float(request["timeout_s"]), world_size=world)
    if scenario == "sub_groups":
        from reproarchive.replay.ranks import registered_groups

        rank_worker.write_json(Path(folder) / f"groups-{rank}.json", registered_groups(["0", "1", "2", "3", "4"]))
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
