"""One archive for a multi-rank job: how big is it next to one rank's?

    python benchmarks/job_bench.py [--ranks 8] [--json]

Starts ``tests/support/job_program.py bench`` under ``torchrun --standalone --nproc-per-node N``
(gloo, OMP_NUM_THREADS=1: N processes oversubscribed on however few cores there are). Every rank
compiles the same graph (``all_reduce(x.sum() * w)``) with its own 16-byte input ``x`` and the
same 256 KiB weight ``w``; rank 1's compiled graph raises, so the capture backend writes each
rank's part and rank 1 merges them into one job archive. Reported: the job archive's size, one
rank's part (rank 1's: a complete single-rank archive of the same graph and inputs), the bytes of
the inputs that differ between ranks, and the bound it must keep: job <= 1.2 x part + distinct
inputs. Exit status 1 if the bound does not hold or the graph is stored more than once.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "tests" / "support" / "job_program.py"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    opts = parser.parse_args(argv)
    import reproarchive
    from reproarchive.format.reader import ContainerReader

    with tempfile.TemporaryDirectory(prefix="reproarchive-job-bench-") as tmp:
        tmp = os.environ.get("JOB_BENCH_DIR") or tmp
        out = Path(tmp) / "out"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "REPROARCHIVE_JOB_WAIT_S": "120"}
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               f"--nproc-per-node={opts.ranks}", str(PROGRAM), "bench", str(out), "120"],
                              capture_output=True, text=True, env=env, cwd=tmp, timeout=900)
        job_wall = time.perf_counter() - start
        archives = sorted(out.glob("job-*.tar.zst"))
        if len(archives) != 1:
            print(done.stderr[-4000:], file=sys.stderr)
            return 2
        archive = archives[0]
        part = next(out.glob("job-*.parts")) / "rank-1.tar.zst"
        job = reproarchive.load_job(archive)
        with ContainerReader(archive) as reader:
            index = reader.index
            blobs = sum(1 for m in reader.members if m.startswith("blobs/"))
        # the inputs that differ between ranks: the storages of other ranks' inputs whose bytes
        # the primary rank's inputs do not have (each other rank's x)
        primary = {index.storages[t.storage].digest for v in index.inputs for t in v.tensors()}
        distinct = sum(index.storages[s].size for s in {t.storage for r in index.job.ranks for v in (r.inputs or ())
                                                        for t in v.tensors()}
                       if index.storages[s].digest not in primary)
        row = {
            "ranks": opts.ranks, "recorded_ranks": len(job.ranks), "job_wall_s": round(job_wall, 1),
            "job_archive_bytes": archive.stat().st_size, "one_rank_archive_bytes": part.stat().st_size,
            "distinct_input_bytes": distinct, "graphs_stored": 1 + len(index.job.graphs), "blobs": blobs,
        }
        bound = 1.2 * row["one_rank_archive_bytes"] + distinct
        row["bound_bytes"] = round(bound)
        row["ok"] = row["job_archive_bytes"] <= bound and row["graphs_stored"] == 1 and len(job.ranks) == opts.ranks
    if opts.json:
        print(json.dumps(row))
    else:
        print(f"{row['ranks']} ranks (job ran {row['job_wall_s']} s): job archive {row['job_archive_bytes']} B, "
              f"one rank's {row['one_rank_archive_bytes']} B, distinct inputs {distinct} B; "
              f"bound 1.2 x one + distinct = {row['bound_bytes']} B; graphs stored {row['graphs_stored']}, "
              f"blobs {row['blobs']}: {'ok' if row['ok'] else 'FAILED'}")
    return 0 if row["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
