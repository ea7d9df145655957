"""Operators and the dispatcher: what torch keeps private about how an operator is found and run.

The graph codec classifies every call target (``codec.targets``, ``codec.effects``) by the types
of ``torch._ops``, which have no public home; it reads the dispatcher's registrations of a custom
op (``torch._C._dispatch_dump``) and its list of native operators, parses recorded schemas
(``torch._C.parse_schema``), asks ``torch._library``'s registries where a Python custom op came
from and whether it has a fake implementation, runs graphs under a Python dispatch mode of its
own (``TorchDispatchMode``) or outside every mode (``_disable_current_modes``), reads the Triton
kernels a graph launches from the side table of ``torch._higher_order_ops.triton_kernel_wrap``,
learns torch's tensor API from ``torch.overrides._get_overridable_functions``, imports
``torch._inductor.inductor_prims`` for the random-number operators Inductor's graphs call, and
records higher-order operator calls while a printed graph is traced (``hop_calls_recorded``:
the registry ``torch._ops._higher_order_ops``).

Checked with 2.11.0, 2.13.0 and 2.15.0: every name below resolves in all three and does the same there.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

from reproarchive.compat.pytree import tree_leaves

CHECKED_WITH = ("2.11.0", "2.13.0", "2.15.0")

PRIVATE_NAMES = (
    "torch._C._dispatch_dump",
    "torch._C._dispatch_get_all_op_names",
    "torch._C.parse_schema",
    "torch._higher_order_ops.triton_kernel_wrap",
    "torch._higher_order_ops.triton_kernel_wrap.kernel_side_table",
    "torch._inductor.inductor_prims",
    "torch._library.custom_ops.OPDEFS",
    "torch._library.custom_ops.OPDEFS.get",
    "torch._library.simple_registry.singleton",
    "torch._library.simple_registry.singleton.find",
    "torch._ops.HigherOrderOperator",
    "torch._ops.OpOverload",
    "torch._ops.OpOverloadPacket",
    "torch._ops._OpNamespace",
    "torch._ops._higher_order_ops",
    "torch._ops._higher_order_ops.values",
    "torch.overrides._get_overridable_functions",
    "torch.utils._python_dispatch.TorchDispatchMode",
    "torch.utils._python_dispatch._disable_current_modes",
)


def __getattr__(name: str) -> Any:
    """The operator types (``OpOverload``, ``OpOverloadPacket``, ``HigherOrderOperator``,
    ``OpNamespace``: what ``torch.ops.NS`` is) and ``TorchDispatchMode``, as torch defines them."""
    if name in ("OpOverload", "OpOverloadPacket", "HigherOrderOperator", "OpNamespace"):
        from torch._ops import HigherOrderOperator, OpOverload, OpOverloadPacket
        from torch._ops import _OpNamespace as OpNamespace

        return {"OpOverload": OpOverload, "OpOverloadPacket": OpOverloadPacket,
                "HigherOrderOperator": HigherOrderOperator, "OpNamespace": OpNamespace}[name]
    if name == "TorchDispatchMode":
        from torch.utils._python_dispatch import TorchDispatchMode

        return TorchDispatchMode
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def dispatch_dump(qualname: str) -> str:
    """The dispatcher's text about operator ``ns::op``: one line per dispatch key, with where its
    kernel was registered."""
    import torch

    return torch._C._dispatch_dump(qualname)


def dispatcher_op_names() -> list[str]:
    """Every operator registered with the dispatcher (``aten::add.Tensor``)."""
    import torch

    return torch._C._dispatch_get_all_op_names()


def parse_schema(text: str) -> Any:
    """A ``FunctionSchema`` from its text; RuntimeError when it does not parse."""
    import torch

    return torch._C.parse_schema(text)


def python_custom_op(qualname: str) -> Any:
    """The ``torch.library.custom_op`` definition of ``ns::op``, or None (an op defined otherwise)."""
    from torch._library.custom_ops import OPDEFS

    return OPDEFS.get(qualname)


def has_registered_fake(qualname: str) -> bool:
    """Whether ``ns::op`` has a fake implementation in ``torch.library``'s registry (raises
    whatever the private registry raises; callers treat that as "not known")."""
    from torch._library.simple_registry import singleton

    return singleton.find(qualname).fake_impl.kernel is not None


def disable_current_modes() -> Any:
    """A context manager under which no Python dispatch mode (a fake-tensor mode left active by
    AOTAutograd) is active."""
    from torch.utils._python_dispatch import _disable_current_modes

    return _disable_current_modes()


def load_triton_kernel_wrap() -> None:
    """Import the module that defines the Triton launch operators (Dynamo imports it too)."""
    import torch._higher_order_ops.triton_kernel_wrap  # noqa: F401


#: Operators Inductor registers when its lowering module is imported (``prims.inductor_seeds``,
#: ``inductor_lookup_seed``, ``inductor_random``, ``inductor_randint``): an AOT graph Inductor
#: logged or dumped draws its random numbers through them.
INDUCTOR_PRIMS_PREFIX = "torch.ops.prims.inductor_"
#: The module that registers them (an exported script imports it too).
INDUCTOR_PRIMS_MODULE = "torch._inductor.inductor_prims"


def load_inductor_prims() -> None:
    """Import the module that registers Inductor's random-number operators (Inductor imports it)."""
    import torch._inductor.inductor_prims  # noqa: F401


@contextlib.contextmanager
def hop_calls_recorded(record: Callable[[Any, tuple, dict], Any], is_symbolic: Callable[[Any], bool]):
    """For the duration, a call of any registered higher-order operator (``cond``,
    ``flex_attention``, ``while_loop`` ...) with a symbolic value among its arguments
    (``is_symbolic``: an FX proxy) returns ``record(op, args, kwargs)`` instead of running.

    A printed graph is rebuilt by tracing its code with FX proxies, and a HOP cannot take
    proxies: it checks its operands' types (``cond``: "can only be of Tensor, int, SymInt") or
    runs its subgraphs. Torch offers no hook for this (a HOP's ``__call__`` is its type's, and
    it validates before any torch-function mode is asked), so each HOP type's ``__call__`` is
    wrapped while tracing; only ever in a throwaway process that rebuilds a graph."""
    from torch._ops import _higher_order_ops


    saved: dict[type, Any] = {}
    for op in list(_higher_order_ops.values()):
        kind = type(op)
        if kind in saved:
            continue
        saved[kind] = kind.__dict__.get("__call__")
        original = kind.__call__

        def call(self, *args, _original=original, **kwargs):
            if any(is_symbolic(a) for a in tree_leaves((args, kwargs))):
                return record(self, args, kwargs)
            return _original(self, *args, **kwargs)

        kind.__call__ = call
    try:
        yield
    finally:
        for kind, own in saved.items():
            if own is None:
                del kind.__call__
            else:
                kind.__call__ = own


def triton_kernel_side_table() -> Any:
    """The table the Triton launch operators keep their kernels and constant arguments in."""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    return kernel_side_table


def overridable_function_names() -> dict[Any, str]:
    """Function -> the public name torch's overridable table gives it (``torch.Tensor.add``)."""
    import torch.overrides

    return torch.overrides._get_overridable_functions()[1]
