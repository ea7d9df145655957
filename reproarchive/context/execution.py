"""The thread state a graph ran under (spec §8 ``execution``): read at the failing call, entered
again around a replay, and compared with this process's for ``doctor``.

Grad mode, inference mode, autocast, deterministic algorithms, the default dtype and float32
matmul precision are not part of a graph, yet they change what it computes and how a compiler
lowers it (Dynamo guards on grad mode and autocast; inference tensors take other kernels). A
replay that does not enter the recorded state replays another program, so the one snapshot here
is what a capture source records and the one context manager here is what a replay enters.
A recorded name is used only if it is one of the schema's dtypes or matmul precisions: nothing
from an archive is looked up on ``torch`` by an arbitrary name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from reproarchive.format.schema import DTYPES, AutocastState, ExecutionRecord

#: Device types whose autocast state is always recorded; another is recorded when it is on.
AUTOCAST_DEVICE_TYPES = ("cpu", "cuda")
MATMUL_PRECISIONS = ("highest", "high", "medium")

#: The state of a fresh process, for ``doctor``: a difference from it is what ``run`` changes.
DEFAULTS = ExecutionRecord(grad_enabled=True, inference_mode=False, deterministic=False,
                           deterministic_warn_only=False, default_dtype="float32",
                           float32_matmul_precision="highest")


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype(name: str | None) -> Any:
    """The torch dtype a recorded name stands for, or None for a name this torch or the schema
    does not know."""
    import torch

    value = getattr(torch, name, None) if name in DTYPES else None
    return value if isinstance(value, torch.dtype) else None


def _autocast_states(device_types: Sequence[str]) -> tuple[AutocastState, ...]:
    import torch

    states = []
    for device_type in dict.fromkeys(device_types):
        try:
            enabled = torch.is_autocast_enabled(device_type)
            dtype = _dtype_name(torch.get_autocast_dtype(device_type))
        except (RuntimeError, ValueError):  # a device type this torch cannot autocast
            continue
        states.append(AutocastState(device_type=device_type, enabled=enabled, dtype=dtype))
    return tuple(states)


def execution_snapshot(inputs: Sequence[Any] = ()) -> ExecutionRecord:
    """The calling thread's state now, and which of ``inputs`` are inference tensors.

    Called at the failing call: inside a backend that is while Dynamo traces, where grad mode
    and autocast are the ones Dynamo guarded the graph on."""
    import torch

    device_types = [*AUTOCAST_DEVICE_TYPES, *(x.device.type for x in inputs if isinstance(x, torch.Tensor))]
    return ExecutionRecord(
        grad_enabled=torch.is_grad_enabled(),
        inference_mode=torch.is_inference_mode_enabled(),
        autocast=_autocast_states(device_types),
        deterministic=torch.are_deterministic_algorithms_enabled(),
        deterministic_warn_only=torch.is_deterministic_algorithms_warn_only_enabled(),
        default_dtype=_dtype_name(torch.get_default_dtype()),
        float32_matmul_precision=torch.get_float32_matmul_precision(),
        inference_inputs=inference_inputs(inputs),
    )


def inference_inputs(inputs: Sequence[Any]) -> tuple[int, ...]:
    """Which of ``inputs`` are inference tensors (made under inference mode)."""
    import torch

    return tuple(i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor) and x.is_inference())


@contextlib.contextmanager
def _restored(get, set_) -> Iterator[None]:
    old = get()
    try:
        yield
    finally:
        if isinstance(old, tuple):
            set_(*old)
        else:
            set_(old)


@contextlib.contextmanager
def applied_execution(record: ExecutionRecord | None) -> Iterator[list[str]]:
    """Enter ``record``'s state for the block and restore this thread's afterwards. Yields the
    notes about what could not be entered (an autocast device type or dtype this torch lacks);
    a field that is None is left as it is here."""
    import torch

    notes: list[str] = []
    with contextlib.ExitStack() as stack:
        if record is not None:
            if record.inference_mode is not None:
                stack.enter_context(torch.inference_mode(record.inference_mode))
            if record.grad_enabled is not None:
                stack.enter_context(torch.set_grad_enabled(record.grad_enabled))
            for state in record.autocast or ():
                dtype = _dtype(state.dtype)
                try:
                    stack.enter_context(torch.autocast(state.device_type, dtype=dtype, enabled=state.enabled))
                except (RuntimeError, ValueError) as exc:
                    notes.append(f"recorded autocast on {state.device_type} not entered: {exc}".splitlines()[0])
            if record.deterministic is not None:
                stack.enter_context(_restored(
                    lambda: (torch.are_deterministic_algorithms_enabled(),
                             torch.is_deterministic_algorithms_warn_only_enabled()),
                    lambda on, warn_only: torch.use_deterministic_algorithms(on, warn_only=warn_only)))
                torch.use_deterministic_algorithms(record.deterministic,
                                                   warn_only=bool(record.deterministic_warn_only))
            default_dtype = _dtype(record.default_dtype)
            if default_dtype is not None:
                stack.enter_context(_restored(torch.get_default_dtype, torch.set_default_dtype))
                try:
                    torch.set_default_dtype(default_dtype)
                except (TypeError, RuntimeError) as exc:
                    notes.append(f"recorded default dtype not set: {exc}".splitlines()[0])
            if record.float32_matmul_precision in MATMUL_PRECISIONS:
                stack.enter_context(_restored(torch.get_float32_matmul_precision, torch.set_float32_matmul_precision))
                torch.set_float32_matmul_precision(record.float32_matmul_precision)
        yield notes


def rebuilt_as_inference(tensor: Any) -> Any:
    """A copy of ``tensor`` that is an inference tensor, as the recorded input was (same values,
    strides and device; it no longer shares storage with other inputs)."""
    import torch

    with torch.inference_mode():
        return tensor.clone()


def execution_diff(record: ExecutionRecord) -> list[dict[str, Any]]:
    """Where ``record`` differs from this process's defaults (``DEFAULTS``, autocast off): what
    ``run`` will change for the replay, and what a replay by other means must set. Rows are
    ``{"what", "recorded", "current"}``."""
    rows = []
    for name in ("grad_enabled", "inference_mode", "deterministic", "deterministic_warn_only", "default_dtype",
                 "float32_matmul_precision"):
        recorded, default = getattr(record, name), getattr(DEFAULTS, name)
        if recorded is not None and recorded != default:
            rows.append({"what": name, "recorded": recorded, "current": default})
    for state in record.autocast or ():
        if state.enabled:
            rows.append({"what": f"autocast {state.device_type}", "recorded": state.dtype, "current": None})
    if record.inference_inputs:
        rows.append({"what": "inference inputs", "recorded": list(record.inference_inputs), "current": None})
    return rows
