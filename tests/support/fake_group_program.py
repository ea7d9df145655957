"""A program on PyTorch's fake process group: one process plays rank 0 of a world of 2 (as
DTensor and FSDP tests, and users sizing a sharded model, do). Its compiled graph takes a DTensor
(``Shard(0)`` on a 1-D mesh of 2) and issues an all_reduce; inductor's C++ relu bug is injected.

    python fake_group_program.py capture OUT   # reproarchive.capture("inductor", path=OUT)
    python fake_group_program.py plain OUT     # torch.compile(backend="inductor"), for capture --
"""

import sys

import torch
import torch._inductor.config
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.testing._internal.distributed.fake_pg import FakeStore

import reproarchive

mode, out = sys.argv[1], sys.argv[2]
torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY = "compile_error"
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
mesh = init_device_mesh("cpu", (2,))


@torch.compile(backend=reproarchive.capture("inductor", path=out) if mode == "capture" else "inductor")
def step(x, w):
    return torch.relu(x * 2), funcol.all_reduce(w, "sum", dist.group.WORLD) + 1


step(distribute_tensor(torch.arange(32.0).view(8, 4), mesh, [Shard(0)]), torch.ones(4))
