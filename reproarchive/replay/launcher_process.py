"""The launcher of a replayed job: torch.distributed's own (``torchrun``), run in a process of
its own so that the replaying program can bound it and read how every rank ended.

``python -m reproarchive.replay.launcher_process FOLDER [torchrun options]`` is exactly
``torchrun [torchrun options] -m reproarchive.replay.rank_worker FOLDER`` (the options are
torchrun's own parser's: ``--standalone``, ``--nproc-per-node``, ``--nnodes``, ``--node-rank``,
``--rdzv-endpoint`` ...), except that torchrun's account of the ranks that failed (exit status,
signal, pid) is written to ``FOLDER/launch-NODE.json`` as data instead of a printed table.
``... FOLDER [torchrun options] -- PROGRAM ARGS`` launches ``PROGRAM ARGS FOLDER`` (a test's
live job) in the rank worker's place.

With ``$REPROARCHIVE_WARM_RANKS`` set (a job on the CPU: ``launch``), the rank workers are forked
from this process's imports (``rank_server``) and torchrun starts ``rank_client`` in their place.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from reproarchive.context.environment import take_thread_count
from reproarchive.replay.rank_client import WARM_ENV

WORKER = "reproarchive.replay.rank_worker"


def _warm_rank(argv: list[str]) -> int:
    """A rank forked by the server: the thread count its environment asks for, as a fresh
    process would take it at start, then the rank worker."""
    from reproarchive.replay import rank_worker

    take_thread_count(os.environ)
    return rank_worker.main(argv)


def main(argv: list[str]) -> int:
    folder = Path(argv[0])
    options, program = argv[1:], ["-m", WORKER, str(folder)]
    warm = False
    if "--" in options:
        options, program = options[:options.index("--")], [*options[options.index("--") + 1:], str(folder)]
    elif os.environ.pop(WARM_ENV, "") == "1":
        # before torch.distributed's agent starts a thread: the server forks from this process
        from reproarchive.replay import rank_client, rank_server, rank_worker  # noqa: F401 - imported to be forked

        warm = rank_server.start(_warm_rank) is not None  # its pipe stays open while the job runs
        if warm:
            program = [rank_client.__file__, str(folder)]
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from reproarchive.replay.rank_worker import write_json

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
    write_json(folder / f"launch-{args.node_rank}.json", {"failures": failures, "warm": warm})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
