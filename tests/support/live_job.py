"""A live job for the multi-rank replay engine's tests, started by torch.distributed's launcher:
``python -m torch.distributed.run --nproc-per-node N tests/support/live_job.py SCENARIO FOLDER``.

Every rank traces the same small function with functional collectives (what Dynamo hands a
backend), as a captured job's graphs are, and hands it with its own real inputs to the replay
engine's rank worker (``rank_worker.serve``), under the recorded group table.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.fx as fx

from reproarchive.replay import rank_worker
from reproarchive.replay.ranks import GroupSpec
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
    groups = [GroupSpec("0", tuple(range(world)), 0)]
    if scenario == "sub_groups":
        groups += [GroupSpec("1", (0, 1), 1, "dp"), GroupSpec("2", (2, 3), 2, "dp"),
                   GroupSpec("3", (0, 2), 3, "tp"), GroupSpec("4", (1, 3), 4, "tp")]
    recorded = RECORDED[failing[rank]]() if failing and rank in failing else None
    device = f"cuda:{os.environ['LOCAL_RANK']}" if request.get("cuda") else "cpu"
    part = SimpleNamespace(gm=gm, args=[torch.arange(4, dtype=torch.float32, device=device) + rank],
                           failure=recorded, fidelity=["real"], stand_ins=[])
    code = rank_worker.serve(part, groups, Path(folder), ReplaySettings(backend=request.get("backend", "eager")),
                             timeout_s=float(request["timeout_s"]), rank=rank, world_size=world)
    if scenario == "sub_groups":
        from reproarchive.replay.ranks import registered_groups

        rank_worker.write_json(Path(folder) / f"groups-{rank}.json", registered_groups(["0", "1", "2", "3", "4"]))
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
