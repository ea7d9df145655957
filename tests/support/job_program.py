"""A job for reproarchive's multi-rank capture tests, started by torchrun: MODE OUT_DIR [TIMEOUT_S].

fail:  rank 1's compiled graph raises (2 ranks)
every: every rank's compiled graph raises at once (2 ranks); each ends 3 s later
hang:  rank 1 takes the other branch and skips a collective rank 0 waits in (2 ranks)
crash: rank 1's compiled graph aborts (SIGABRT) (2 ranks)
plain-MODE: MODE with torch.compile(backend=...) alone, for `reproarchive capture -- torchrun ...`
bench: like fail, on any number of ranks, with a 256 KiB weight every rank shares
       (benchmarks/job_bench.py)
mesh:  4 ranks on a 2x2 DeviceMesh (dp, tp): a DTensor input, a collective on the tp sub-group
       ([0, 1] and [2, 3]); rank 1's compiled graph raises
third: rank 1's 3rd call indexes out of range (an IndexError before its collective, rank 0
       waits in it), after two calls that pass (2 ranks); the graph draws dropout, and each rank
       saves the CPU generator states before each call to OUT_DIR.rng-RANK.pt
inductor: inductor on every rank, its C++ relu bug injected through its config on rank 1 alone
       (2 ranks): rank 1's compile fails, rank 0's graph passes; the graph calls a custom op this
       program defines (a replay's ranks do not have it: they stand in for it), draws random
       numbers (dropout), holds the relu in a torch.cond's branch and is compiled with dynamic
       shapes
"""
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import reproarchive

mode, out = sys.argv[1], sys.argv[2]
plain = mode.startswith("plain-")  # torch.compile with the backend alone (under `reproarchive capture --`)
mode = mode.removeprefix("plain-")
timeout = float(sys.argv[3]) if len(sys.argv) > 3 else 30.0
dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
rank = dist.get_rank()


def backend(gm, example_inputs):
    """Eager, except where this job's test wants rank 1 to fail or die inside its compiled graph."""
    if (rank == 1 and mode in ("fail", "mesh", "bench")) or mode == "every":
        def run(*args):
            raise RuntimeError(f"injected failure on rank {rank}")
        return run
    if rank == 1 and mode == "crash":
        def run(*args):
            os.abort()
        return run
    return gm.forward


if mode == "inductor" and rank == 1:
    import torch._inductor.config

    torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY = "compile_error"
compiler = "inductor" if mode == "inductor" else backend


@torch.library.custom_op("jobtest::shifted", mutates_args=())
def shifted(x: torch.Tensor) -> torch.Tensor:
    return x - 0.5


shifted.register_fake(lambda x: torch.empty_like(x))


@torch.compile(backend=compiler if plain else reproarchive.capture(compiler, path=out),
               dynamic=True if mode == "inductor" else None)
def step(x, w):
    if mode == "inductor":  # each rank calls it on its own data
        x = shifted(x)
    y = funcol.all_reduce(x.sum() * w, "sum", dist.group.WORLD)
    if mode == "hang" and rank == 0:  # rank 1 takes the other branch and skips this collective
        y = funcol.all_reduce(y * 2, "sum", dist.group.WORLD)
    if mode == "inductor":  # the relu inside a cond's branch: a minify inlines it to cut there
        y = torch.cond(y.sum() > -1e9, lambda t: torch.relu(t - 0.5), lambda t: t - 1,
                       (torch.nn.functional.dropout(y, 0.5),))
    return y + 1


if mode == "mesh":
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))

    @torch.compile(backend=reproarchive.capture(backend, path=out))
    def sharded(x, w):
        return (x * 2).sum(), funcol.all_reduce(w, "sum", (mesh, 1))

    x = distribute_tensor(torch.arange(16.0).view(4, 4), mesh, [Replicate(), Shard(0)])
    sharded(x, torch.full((2,), float(rank)))
elif mode == "third":
    @torch.compile(backend="eager" if plain else reproarchive.capture("eager", path=out))
    def pick(x, w, i):
        x = torch.nn.functional.dropout(x, 0.5, training=True)
        return funcol.all_reduce(x.index_select(0, i).sum() * w, "sum", dist.group.WORLD) + 1

    states = []
    for call in range(3):
        states.append(torch.get_rng_state())
        # saved before the call: the launcher may stop this rank inside it (rank 0 waits in its
        # collective when rank 1 fails), and a stopped rank runs no `finally`
        torch.save(states, f"{out}.rng-{rank}.pt")
        pick(torch.full((4,), float(rank + call)), torch.linspace(0, 1, 4),
             torch.tensor([9 if rank == 1 and call == 2 else call]))
elif mode == "every":
    try:
        step(torch.full((4,), float(rank)), torch.linspace(0, 1, 4))
    except RuntimeError:
        time.sleep(3)  # every rank has said where its failure went before one ends (the launcher stops the rest)
        raise
else:
    step(torch.full((4,), float(rank)), torch.linspace(0, 1, 65536 if mode == "bench" else 4))
if mode == "hang" and rank == 1:
    time.sleep(timeout + 5)  # alive, as a real job going on to its next step
dist.destroy_process_group()
