"""``torch.distributed``'s private names: the process-group registry, the default group and
store, ``LocalTensor``, and the fake process group's store.

A multi-rank capture records the process groups a rank belongs to under their names, in creation
order (``_world``: torch keeps no public list of them); a replay recreates them and registers each
under its recorded name, so the names a graph's functional collectives carry resolve
(``torch._C._distributed_c10d``'s registry, ``_resolve_process_group``); ranks wait for each other
on the default store; a failure in the compiler replays on PyTorch's fake backend, whose store
lives in ``torch.testing._internal``; a job replayed in one process runs every rank under
``LocalTensorMode`` (``torch.distributed._local_tensor``).

Checked with 2.11.0, 2.13.0 and 2.15.0: every name resolves in all three; 2.15's ``_world`` holds one more
table (``pg_flight_recorder_hooks``), the three read here are the same.
"""

from __future__ import annotations

from typing import Any

CHECKED_WITH = ("2.11.0", "2.13.0", "2.15.0")

PRIVATE_NAMES = (
    "torch._C._distributed_c10d._register_process_group",
    "torch._C._distributed_c10d._unregister_all_process_groups",
    "torch.distributed._local_tensor.LocalTensor",
    "torch.distributed._local_tensor.LocalTensorMode",
    "torch.distributed.distributed_c10d._get_default_group",
    "torch.distributed.distributed_c10d._get_default_store",
    "torch.distributed.distributed_c10d._resolve_process_group",
    "torch.distributed.distributed_c10d._world",
    "torch.testing._internal.distributed.fake_pg.FakeStore",
)


def __getattr__(name: str) -> Any:
    """``LocalTensor`` and ``LocalTensorMode``, as torch defines them."""
    if name in ("LocalTensor", "LocalTensorMode"):
        from torch.distributed._local_tensor import LocalTensor, LocalTensorMode

        return {"LocalTensor": LocalTensor, "LocalTensorMode": LocalTensorMode}[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def local_tensor_of(value: Any, rank: int) -> Any:
    """Rank ``rank``'s tensor of a ``LocalTensor``."""
    return value._local_tensors[rank]


def resolve_process_group(name: str) -> Any:
    """The process group a collective's group name resolves to here (raises when none does)."""
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(name)


def default_group() -> Any:
    from torch.distributed.distributed_c10d import _get_default_group

    return _get_default_group()


def default_store() -> Any:
    from torch.distributed.distributed_c10d import _get_default_store

    return _get_default_store()


def register_groups(groups: dict[str, Any]) -> None:
    """Make the group-name registry hold exactly ``groups`` (name -> process group)."""
    import torch

    torch._C._distributed_c10d._unregister_all_process_groups()
    for name, pg in groups.items():
        torch._C._distributed_c10d._register_process_group(name, pg)


def fake_store() -> Any:
    """A store for PyTorch's fake process group (``init_process_group("fake", ...)``)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    return FakeStore()


def groups_in_creation_order() -> list[tuple[Any, str, Any, Any]]:
    """(group, its name, {global rank: group rank} or None, its backend or None) for every
    process group of this process, in creation order."""
    from torch.distributed import distributed_c10d as c10d

    world = c10d._world
    return [(pg, name, world.pg_group_ranks.get(pg), world.pg_map.get(pg, (None,))[0])
            for pg, name in world.pg_names.items()]
