"""The launcher of a replayed job: torch.distributed's own (``torchrun``), run in a process of
its own so that the replaying program can bound it and read how every rank ended.

``python -m reproarchive.replay.launcher_process FOLDER [torchrun options]`` is exactly
``torchrun [torchrun options] -m reproarchive.replay.rank_worker FOLDER`` (the options are
torchrun's own parser's: ``--standalone``, ``--nproc-per-node``, ``--nnodes``, ``--node-rank``,
``--rdzv-endpoint`` ...), except that torchrun's account of the ranks that failed (exit status,
signal, pid) is written to ``FOLDER/launch-NODE.json`` as data instead of a printed table.
``... FOLDER [torchrun options] -- PROGRAM ARGS`` launches ``PROGRAM ARGS FOLDER`` (a test's
live job) in the rank worker's place.
"""

from __future__ import annotations

import sys
from pathlib import Path

WORKER = "reproarchive.replay.rank_worker"


def main(argv: list[str]) -> int:
    folder = Path(argv[0])
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from reproarchive.replay.rank_worker import write_json

    options, program = argv[1:], ["-m", WORKER, str(folder)]
    if "--" in options:
        options, program = options[:options.index("--")], [*options[options.index("--") + 1:], str(folder)]
    args = torchrun.parse_args([*options, *program])
    failures: dict[str, dict] = {}
    try:
        torchrun.run(args)
    except ChildFailedError as err:
        for rank, failure in err.failures.items():
            failures[str(rank)] = {
                "exitcode": failure.exitcode, "local_rank": failure.local_rank, "pid": failure.pid,
                "signal": failure.signal_name() if failure.exitcode < 0 else None,
                "time": failure.timestamp,
            }
    write_json(folder / f"launch-{args.node_rank}.json", {"failures": failures})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
