"""Replaying a multi-rank job archive next to running the job it came from, in the same run.

    python benchmarks/job_replay_bench.py [--ranks 8] [--json]

Runs ``job_bench.py`` (the original job: ``torchrun --standalone --nproc-per-node N`` of
``tests/support/job_program.py bench``, every rank compiling the same graph, captured into one
job archive), then ``reproarchive run`` of that archive: the ranks launched by torch.distributed's
launcher again, every recorded group recreated, each rank's graph compiled and run on its own
inputs. The original job's rank 1 failed inside its own compiler function (a function in the
program, which a replay never imports on an archive's say-so), so the replay compiles with
``--backend eager`` and every rank is expected to pass: the figure is the cost of the replay
machinery itself (launch, rendezvous, groups, load, compile, run, verdict) against the job's.
Exit status 1 if the replay does not pass on every rank.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    opts = parser.parse_args(argv)
    import job_bench

    import reproarchive

    with tempfile.TemporaryDirectory(prefix="reproarchive-job-replay-bench-") as tmp:
        os.environ["JOB_BENCH_DIR"] = tmp
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            code = job_bench.main(["--ranks", str(opts.ranks), "--json"])
        if code == 2:
            return 2
        row = json.loads(printed.getvalue())
        archive = next((Path(tmp) / "out").glob("job-*.tar.zst"))
        start = time.perf_counter()
        job = reproarchive.run(archive, backend="eager", timeout=120)
        row["replay_wall_s"] = round(time.perf_counter() - start, 1)
        row["replay_launch_s"] = job.wall_s
        row["replay_status"] = job.summary
    row["replay_ok"] = job.status == "passed" and len(job.ranks) == opts.ranks
    if opts.json:
        print(json.dumps(row))
    else:
        print(f"{row['ranks']} ranks: the original job (with capture) ran {row['job_wall_s']} s; its replay "
              f"{row['replay_wall_s']} s ({row['replay_launch_s']} s of it in the launched ranks): "
              f"{row['replay_status']}")
    return 0 if row["replay_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
