"""The Python calls that reach a CUDA device guard on a fake tensor, made another way.

A compile for a GPU this machine lacks (``compat.absent_gpu``) runs on fake tensors of
``cuda:0``. Operators on them never touch the device: the fake mode answers from meta tensors.
But a few of torch's Python bindings set a device guard, or build a host tensor and copy it,
before any operator is dispatched, and that asks the CUDA driver, which is not there:

* ``torch.tensor(data, device="cuda")`` (Inductor's pattern passes trace with such literals):
  here a fake tensor of that device, shape and dtype (its values are unknown to a fake tensor
  anyway);
* ``fake[index]`` (Dynamo graphs index tensors; Inductor's seed lookup does): here the same
  view made of ``aten.select``, ``aten.slice``, ``aten.unsqueeze`` and ``aten.index``, which
  is what the binding dispatches to. An index this does not take (a bool, a mask among basic
  indices) goes to torch's own binding.

A torch-function mode sees both before the binding does, except inside the fake mode's own
dispatch (an operator's meta function that indexes: Inductor's seed lookup), where no mode is
asked: there ``torch.Tensor.__getitem__`` itself is set for the compile's length
(``guard_free_getitem``). Checked with 2.11.0, 2.13.0, 2.15.0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

CHECKED_WITH = ("2.11.0", "2.13.0", "2.15.0")

PRIVATE_NAMES = (
    "torch._C.TensorBase.__getitem__",
    "torch._subclasses.fake_tensor.FakeTensor",
    "torch._subclasses.fake_tensor.FakeTensorMode",
    "torch.utils._python_dispatch._get_current_dispatch_mode_stack",
)


def without_device_guards() -> Any:
    """A torch-function mode, for a ``with`` statement, that takes the other way (docstring)."""
    from torch.overrides import TorchFunctionMode

    class WithoutDeviceGuards(TorchFunctionMode):
        def __torch_function__(self, func: Any, types_: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
            import torch

            kwargs = dict(kwargs or {})
            if func is torch.Tensor.__getitem__ and _on_gpu(args[0]):
                viewed = _indexed(args[0], args[1])
                if viewed is not None:
                    return viewed
            device = kwargs.get("device")
            if func is torch.tensor and device is not None and torch.device(device).type == "cuda" \
                    and _fake_mode_active():
                kwargs.pop("device")
                host = func(*args, **kwargs)
                return torch.empty(host.shape, dtype=host.dtype, device=device, requires_grad=host.requires_grad)
            return func(*args, **kwargs)

    return WithoutDeviceGuards()


def guard_free_getitem() -> Any:
    """``torch.Tensor.__getitem__`` that indexes a fake CUDA tensor without the binding's guard
    (``_indexed``) and leaves every other tensor to torch's own: set on ``torch.Tensor`` while a
    compile for an absent GPU runs, because an operator's meta function indexes inside the fake
    mode's dispatch, where no torch-function mode is asked."""
    import torch

    base = torch._C.TensorBase.__getitem__

    def getitem(self: Any, index: Any) -> Any:
        if _on_gpu(self):
            viewed = _indexed(self, index)
            if viewed is not None:
                return viewed
        return base(self, index)

    return getitem


def _on_gpu(value: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(value, FakeTensor) and value.fake_device.type == "cuda"  # in a kernel, .device is meta


def _fake_mode_active() -> bool:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return any(isinstance(m, FakeTensorMode) for m in _get_current_dispatch_mode_stack())


def _indexed(t: Any, index: Any) -> Any:
    """``t[index]`` from the aten operators the indexing binding dispatches to; None where
    ``index`` has a part this does not take."""
    import torch

    aten = torch.ops.aten
    parts = list(index) if isinstance(index, tuple) else [index]
    if any(isinstance(p, bool) for p in parts) or sum(p is Ellipsis for p in parts) > 1:
        return None
    advanced: dict[int, Any] = {}
    out, dim = t, 0
    for k, part in enumerate(parts):
        if part is Ellipsis:  # the dimensions the parts after it do not index
            dim = out.dim() - sum(p is not None and p is not Ellipsis for p in parts[k + 1:])
        elif part is None:
            out, dim = aten.unsqueeze.default(out, dim), dim + 1
        elif isinstance(part, (int, torch.SymInt)):
            out = aten.select.int(out, dim, part)
        elif isinstance(part, slice):
            step = 1 if part.step is None else part.step
            out, dim = aten.slice.Tensor(out, dim, part.start, part.stop, step), dim + 1
        elif isinstance(part, (torch.Tensor, list)) and not (isinstance(part, torch.Tensor)
                                                             and part.dtype == torch.bool):
            advanced[dim] = part if isinstance(part, torch.Tensor) else torch.tensor(part, device=t.device)
            dim += 1
        else:
            return None
    if not advanced:
        return out
    return aten.index.Tensor(out, [advanced.get(d) for d in range(max(advanced) + 1)])
