"""A recorded job's process groups, recreated on this machine's torch.distributed.

A graph with functional collectives names its groups by string
(``_c10d_functional.all_reduce(x, "sum", "1")``) and torch resolves that string through its
process-group registry at run time. The names are creation counters (or rank hashes) of the
recording run, so a replay that creates its groups in another order, or with other members,
runs every collective on the wrong ranks. PyTorch's own repro (``setup_fake_process_groups``
in after_aot) rebuilds a sub-group of size k as ranks ``[0, k)``; here every group of the
recorded table is created with its recorded members, in its recorded creation order (every
rank must take part in every ``new_group`` call, in the same order), and registered under its
recorded name with the same private registry call after_aot uses.

The collective schedule of a graph (which collective, on which group, in which order) is read
from the graph itself (``codec.collectives``), for the ranks' reports of what they run.
"""

from __future__ import annotations

import contextlib
import datetime
from dataclasses import dataclass
from typing import Any, Iterable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from reproarchive.codec.collectives import Collective, collective_of
from reproarchive.compat.distributed import default_group, fake_store, register_groups, resolve_process_group
from reproarchive.errors import DeviceUnavailableError, ReproArchiveError

#: Ops of the collective namespaces that only wait for a collective started earlier.
_WAITS = ("wait_tensor",)


@dataclass(frozen=True)
class GroupSpec:
    """One recorded process group: the name its graphs use, its global ranks, its creation
    order in the recording run and the DeviceMesh dimension it belongs to (None: not a mesh
    dimension)."""

    name: str
    ranks: tuple[int, ...]
    order: int = 0
    mesh_dim: str | None = None


def group_specs(job: Any) -> list[GroupSpec]:
    """A job record's process-group table (``job.groups``) as ``recreate_groups`` takes it."""
    return [GroupSpec(name=g.name, ranks=tuple(g.ranks), order=g.index if g.index is not None else i,
                      mesh_dim=g.mesh_dim) for i, g in enumerate(job.groups)]


def process_group_backend(device_type: str) -> str:
    """The torch.distributed backend for a device type, from torch's own map: gloo for the
    CPU, nccl for CUDA (and whatever torch maps other accelerators to)."""

    backend = dist.Backend.default_device_backend_map.get(device_type)
    if backend is None:
        raise DeviceUnavailableError(f"torch.distributed has no backend for device type {device_type!r}",
                                     "replay on the CPU (--device cpu), which uses gloo")
    return backend


def init_launched(device_type: str, timeout_s: float) -> None:
    """Join the job the launcher started (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` ... in the
    environment) with the backend for ``device_type`` and a collective timeout of ``timeout_s``."""

    dist.init_process_group(backend=process_group_backend(device_type),
                            timeout=datetime.timedelta(seconds=timeout_s))


def init_fake(rank: int, world_size: int) -> None:
    """A process group of ``world_size`` in which this process is ``rank`` and every collective
    returns made-up values at once (PyTorch's fake backend): for failures in the compiler, which
    never needs another rank."""

    dist.init_process_group("fake", rank=rank, world_size=world_size, store=fake_store())


@contextlib.contextmanager
def as_a_rank_alone(job: Any, rank: int):
    """This process as rank ``rank`` of ``job`` on a fake process group, every recorded group
    registered under its recorded name, for as long as the context lasts: where a rank's graph
    is only compiled (its collectives compile as they did, and a compile reads no collective's
    value). A process that already belongs to a group cannot be a rank of another job."""
    if dist.is_initialized():
        raise ReproArchiveError("this process already belongs to a process group: a job's rank is compiled in a "
                                "process of its own", "run it from a process without one")
    init_fake(rank, job.world_size)
    try:
        recreate_groups(group_specs(job))
        yield
    finally:
        dist.destroy_process_group()


def recreate_groups(groups: Iterable[GroupSpec], *, timeout_s: float | None = None) -> dict[str, Any]:
    """Create every recorded group with its recorded members, in recorded creation order, and
    register the ones this rank belongs to under their recorded names (and only those: a name
    the recording run did not have resolves to nothing). Returns name -> ProcessGroup for this
    rank. Every rank of the job must call this with the same table (``new_group`` is collective
    over the whole world)."""

    world = dist.get_world_size()
    me = dist.get_rank()
    default = default_group()
    timeout = None if timeout_s is None else datetime.timedelta(seconds=timeout_s)
    made: dict[str, Any] = {}
    for spec in sorted(groups, key=lambda g: (g.order, g.name)):
        members = sorted(spec.ranks)
        if members == list(range(world)):
            pg = default
        else:
            pg = dist.new_group(members, timeout=timeout, group_desc=f"recorded:{spec.name}")
        if me in members:
            made[spec.name] = pg
    register_groups(made)
    return made


def as_dtensors(args: list, dtensors: Iterable[Any], meshes: Any, groups: Iterable[GroupSpec],
                made: dict[str, Any]) -> list:
    """``args`` with each input recorded as a DTensor (its local shard stored, spec §8 ``job``)
    rebuilt as one: on a DeviceMesh made from the recreated groups of the mesh's dimensions, with
    its recorded placements, global shape and stride (``DTensor.from_local``, no communication)."""
    dtensors = list(dtensors)
    if not dtensors:
        return args

    def placement(p: Any) -> Any:
        if p.kind == "shard":
            return Shard(int(p.dim))
        if p.kind == "partial":
            return Partial(p.reduce_op or "sum")
        return Replicate()

    by_dim = {g.mesh_dim: made[g.name] for g in groups if g.mesh_dim is not None and g.name in made}
    built: dict[int, Any] = {}
    out = list(args)
    for d in dtensors:
        if d.mesh not in built:
            mesh = meshes[d.mesh]
            names = tuple(mesh.dim_names) if mesh.dim_names else tuple(str(i) for i in range(len(mesh.shape)))
            layout = torch.tensor(list(mesh.ranks)).view(*mesh.shape)
            device_type = args[d.input].device.type
            pgs = [by_dim[n] for n in names]
            built[d.mesh] = DeviceMesh.from_group(pgs if len(pgs) > 1 else pgs[0], device_type, mesh=layout,
                                                  mesh_dim_names=names)
        out[d.input] = DTensor.from_local(args[d.input], built[d.mesh], [placement(p) for p in d.placements],
                                          run_check=False, shape=torch.Size(d.shape), stride=tuple(d.stride))
    return out


def registered_groups(names: Iterable[str]) -> dict[str, tuple[int, ...]]:
    """name -> global ranks of the group torch resolves each name to here (names that resolve to
    nothing are left out): what a graph's collectives will actually run on."""

    found = {}
    for name in names:
        try:
            pg = resolve_process_group(name)
        except (RuntimeError, ValueError, KeyError):
            continue
        found[name] = tuple(dist.get_process_group_ranks(pg))
    return found


# --------------------------------------------------------------------------------------------
# the collective schedule of a graph


def schedule_of(gm: Any) -> list[Collective]:
    """The collectives ``gm`` issues, in graph order (waits left out)."""
    found = (collective_of(node) for node in gm.graph.nodes)
    return [c for c in found if c is not None and c.op not in _WAITS]


def is_collective(node: Any) -> bool:
    """Whether an fx node calls a functional collective (a wait included)."""
    return collective_of(node) is not None


