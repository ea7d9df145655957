"""Which inputs a graph writes in place, so that only those are ever copied.

A check run (capture's first-call check, an accuracy comparison) must leave the caller's
tensors as they were, and an archive of a failing call must hold its inputs as they were before
that call. Copying every input does both, at the price of a second copy of the model's weights
(Dynamo passes parameters as graph inputs). But a run can only change an input the graph
writes to, and which ones those are is a property of the graph, not of the data: running it
once on fake tensors (``FakeTensorMode``: shapes, no data, no kernels) bumps the version
counter of every input an in-place op, an ``out=`` argument or a ``copy_`` reaches, views
included. So the analysis costs one fake run per graph, and the copies shrink to the written
inputs (usually none, or a few buffers such as batch-norm running statistics).

Inputs that are not written are *aliased* for a run (``run_inputs``): the same data, a new
autograd leaf, so a backward accumulates gradients on the alias and never on the caller's
tensor. An input that is not a leaf keeps being copied (``clone_inputs``): its history belongs
to the caller's autograd graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from reproarchive.compat.dispatch import TorchDispatchMode
from reproarchive.compat.dynamo import clone_input
from reproarchive.compat.fake import new_fake_mode
from reproarchive.compat.pytree import tree_leaves


def written_inputs(gm: Any, args: Sequence[Any]) -> frozenset[int] | None:
    """Indices of the tensor ``args`` whose storage running ``gm`` writes (an operator argument
    its schema marks ``(a!)``: in-place ops, ``out=``, ``copy_``, batch norm's running
    statistics), views included; None when the graph cannot run on fake tensors, and then
    every input counts as written."""

    try:
        mode = new_fake_mode()
        fakes = [mode.from_tensor(a, static_shapes=True) if isinstance(a, torch.Tensor) else a for a in args]
        recorder = _WriteRecorder()
        with mode, recorder, torch.no_grad():
            gm(*fakes)
    except Exception:  # noqa: BLE001 - an op without a fake kernel: assume the worst
        return None
    return frozenset(i for i, f in enumerate(fakes)
                     if isinstance(f, torch.Tensor) and _storage_key(f) in recorder.written)


# Operators that write an argument their schema does not mark ``(a!)`` (torch 2.13): batch
# norm's running statistics in training mode.
_BATCH_NORM_STATS = ("running_mean", "running_var")
_UNANNOTATED_WRITES = {name: _BATCH_NORM_STATS for name in (
    "aten::batch_norm", "aten::_batch_norm_impl_index", "aten::native_batch_norm", "aten::cudnn_batch_norm",
    "aten::miopen_batch_norm")}


def _storage_key(t: Any) -> Any:
    return StorageWeakRef(t.untyped_storage())


def _write_recorder_base() -> type:
    return TorchDispatchMode


class _WriteRecorder(_write_recorder_base()):  # type: ignore[misc]
    """Notes the storage of every tensor an operator writes, by its schema's alias annotations."""

    def __init__(self) -> None:
        super().__init__()
        self.written: set[Any] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        unannotated = _UNANNOTATED_WRITES.get(func._schema.name, ())
        for i, argument in enumerate(func._schema.arguments):
            if argument.name not in unannotated and (argument.alias_info is None or not argument.alias_info.is_write):
                continue
            value = args[i] if i < len(args) else kwargs.get(argument.name)
            self.written.update(_storage_key(t) for t in tree_leaves(value) if isinstance(t, torch.Tensor))
        return func(*args, **kwargs)


def tensor_bytes(args: Sequence[Any], indices: frozenset[int] | None = None) -> int:
    """Bytes held by the tensors among ``args`` (those at ``indices`` only, when given)."""

    return sum(a.untyped_storage().nbytes() for i, a in enumerate(args)
               if isinstance(a, torch.Tensor) and (indices is None or i in indices))


def run_inputs(args: Sequence[Any], written: frozenset[int] | None) -> list[Any]:
    """Inputs for a check run that must leave ``args`` untouched: copies of the written inputs
    (all of them when ``written`` is None) and of inputs that are not leaves; the rest aliased,
    their data shared, their gradients their own."""

    out: list[Any] = []
    for i, a in enumerate(args):
        if written is None or i in written or (isinstance(a, torch.Tensor) and a.requires_grad and not a.is_leaf):
            out.append(clone_inputs([a])[0])
        elif isinstance(a, torch.Tensor):
            out.append(alias(a))
        else:
            out.append(a)
    return out


def rerun_inputs(before: Sequence[Any], args: Sequence[Any], written: frozenset[int] | None) -> list[Any]:
    """Inputs for a check run after a call of the graph on ``args``, as ``run_inputs`` would have
    made them before it: ``before`` holds the written inputs as they were (``snapshot``); those
    are copied again, and one that was not a leaf is made a non-leaf again (``_with_history``:
    an in-place op legal on the original would be an error on a leaf that requires grad)."""

    out = run_inputs(before, written)
    for i in written or ():
        a = args[i]
        if isinstance(a, torch.Tensor) and a.requires_grad and not a.is_leaf and out[i].is_leaf:
            out[i] = _with_history(out[i])
    return out


def alias(a: Any) -> Any:
    """``a``'s data as a tensor of its own: a leaf that requires grad when ``a`` does (and is
    floating), so gradients never reach ``a``."""
    if not a.requires_grad:
        return a.detach()
    return a.detach().requires_grad_(a.is_floating_point() or a.is_complex())


def snapshot(args: Sequence[Any], written: frozenset[int] | None) -> list[Any]:
    """``args`` as they are now, to archive after a call that may change them: the written
    inputs copied (detached, same layout), every other value as it is (a call cannot change
    it). With ``written`` None nothing is copied: the archive then says which inputs changed
    (their version counters)."""

    if not written:
        return list(args)
    out = list(args)
    with torch.no_grad():
        for i in written:
            a = args[i]
            if isinstance(a, torch.Tensor):
                copied = clone_input(a).detach()
                out[i] = copied.requires_grad_(a.requires_grad and (copied.is_floating_point() or copied.is_complex()))
    return out


def clone_inputs(args: Sequence[Any]) -> list[Any]:
    """Copies of graph inputs that a run may mutate: same strides, dtype, device and
    ``requires_grad``, detached from the caller's tensors, so gradients of a backward land on
    the copies and never on the caller's tensors.

    A leaf stays a leaf and a non-leaf stays a non-leaf (``_with_history``): a backend may
    behave differently on each (``non_leaf_compile_error_TESTING_ONLY`` fails only on a
    non-leaf), and an in-place op that was legal on the original non-leaf input is an error
    on a leaf that requires grad, so a replay of leaves would not be the original run."""

    out: list[Any] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            c = clone_input(a).detach()
            if a.requires_grad and (c.is_floating_point() or c.is_complex()):
                c.requires_grad_(True)
                if not a.is_leaf:
                    c = _with_history(c)
            out.append(c)
        elif isinstance(a, (list, tuple)):
            out.append(type(a)(clone_inputs(a)) if isinstance(a, tuple) else clone_inputs(a))
        else:
            out.append(a)
    return out


def _with_history(leaf: Any) -> Any:
    """A non-leaf with ``leaf``'s values and exact layout, whose ``.grad`` is kept.

    The values are copied into a second buffer of the same layout (``copy_`` gives it a
    ``grad_fn``), not viewed: an in-place op on a view of a leaf that requires grad is an
    autograd error, on the original non-leaf it was not. ``retain_grad`` keeps its gradient,
    which accuracy compares. A layout that cannot be written into (overlapping strides, as
    from ``expand``) falls back to a view, which such an input is anyway.
    """

    with torch.enable_grad():
        try:
            t = clone_input(leaf.detach()).copy_(leaf)
        except RuntimeError:
            t = leaf.view_as(leaf)
    t.retain_grad()
    return t
