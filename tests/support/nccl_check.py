"""The multi-rank replay's CUDA path, checked on a machine with ONE GPU (NCCL cannot put two ranks
on one GPU: "Duplicate GPU detected"), by hand or by the device tool:

    OMP_NUM_THREADS=1 python tests/support/nccl_check.py

1. one rank launched by torchrun joins with NCCL, recreates the recorded group "0" under its name
   and runs an all_reduce on cuda:0 through the rank worker (passes);
2. a 2-rank job archive recorded on cuda:0 (rank 1's compile fails) replays launched with
   --device cpu: gloo, reproduced on rank 1, and each rank's outcome says it ran on another device
   type;
3. --rank 1 of that archive on cuda:0 against the fake process group: reproduced on rank 1;
4. its export runs under torchrun with --device cpu, rank 1 raising the recorded error.
Prints one line per check; exit 1 if any fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import reproarchive  # noqa: E402
from reproarchive.replay import launch  # noqa: E402
from support.job_archives import rank_one_fails  # noqa: E402


def main() -> int:
    ok = True

    def check(name: str, passed: bool, detail) -> None:
        nonlocal ok
        ok &= passed
        print(f"{'ok  ' if passed else 'FAIL'} {name}: {detail}")

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        plan = launch.LaunchPlan({"timeout_s": 60, "cuda": True}, launch.launcher_options(1), 60.0,
                                 program=[str(Path(__file__).with_name("live_job.py")), "world_all_reduce"])
        job = launch.run_launched(plan, world_size=1, ranks=[0], recorded={}, recorded_rank=None, keep=tmp / "one")
        check("1 rank, nccl, all_reduce on cuda:0", job.status == "passed" and job.ranks[0].outcome.device == "cuda:0",
              job.to_dict()["ranks"][0]["status"] + " " + str(job.ranks[0].note or job.ranks[0].outcome.observed))
        archive = rank_one_fails(tmp, device="cuda:0")
        job = reproarchive.run(archive, device="cpu", timeout=60)
        moved = all(r.outcome is None or not r.outcome.same_device_type for r in job.ranks)
        check("2 ranks recorded on cuda:0, --device cpu (gloo)", job.summary == "reproduced on rank 1" and moved,
              job.summary)
        job = reproarchive.run(archive, rank=1)
        check("--rank 1 on cuda:0, fake process group", job.summary == "reproduced on rank 1",
              f"{job.summary} on {job.ranks[0].outcome.device if job.ranks[0].outcome else '?'}")
        reproarchive.export(archive, tmp / "bug")
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                               "repro.py", "--device", "cpu"], cwd=tmp / "bug", capture_output=True, text=True,
                              env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=600)
        check("export under torchrun --device cpu", proc.returncode != 0 and "ReluCompileError" in proc.stderr,
              f"exit {proc.returncode}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
