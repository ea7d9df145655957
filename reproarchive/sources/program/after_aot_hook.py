"""``capture --after aot``: the graph Inductor is handed, with the program's real inputs.

PyTorch's after_aot hook dumps a graph that Inductor failed to compile with the inputs it has
there, which are fake tensors: the dump holds no data, its inputs become absent, and a replay
on generated values may fail in a way the program never did. Yet the real tensors exist while
Inductor compiles a forward graph: they are the inputs Dynamo handed the backend, which the
crash guard already sees at Dynamo's door (``crash_guard``). AOTAutograd says, for every input
of the graph it hands Inductor, which of its own inputs it is: ``node.meta["desc"]`` is a
``PlainAOTInput(idx)`` (the idx-th input Dynamo passed) or a ``ParamAOTInput`` /
``BufferAOTInput(target)`` (a parameter or buffer of Dynamo's graph module).

So the crash guard keeps the Dynamo graph and its real inputs for the duration of each backend
call (``dynamo_call``), and ``install`` wraps Inductor's own door, the after_aot debug wrapper
that ``compile_fx_inner`` applies to every graph (``torch._inductor.compile_fx
.wrap_compiler_debug``, looked up there at each call). When the compile raises, the graph as
Inductor received it is written with the real tensor for every input AOTAutograd names and
whose shape, stride, dtype and device match, and the program's own exception as its failure;
any other input (a backward graph's activations and tangents, which never existed as data at
compile time) stays absent. The archive is a ``capture`` archive of an ``after_aot`` graph
(``source.graph_kind``): ``run`` replays it the way PyTorch's after_aot ``run_repro`` does.

Runtime failures: PyTorch's hook dumps a failing call with fake copies of its inputs (and a
graph compiled with dynamic shapes not at all, torch 2.13). A forward graph's failing first
call is kept from the crash guard's spool, with its real inputs as they were before the call
(``crash_guard._undumped_after_aot``); every later call, and every call of a backward graph, is
watched here (``watched_calls``) and a failing one archived with the real inputs it was called
with. Nothing here may break the program: a failure to write costs the archive, never the run.
"""

from __future__ import annotations

# Imports inside functions: imported with the crash guard by every Python process `capture
# --` starts; what recording a failure needs is imported when a graph fails.
import contextlib
import functools
import logging
import os
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reproarchive.compat.fake import hint_of
from reproarchive.compat.fx_meta import aot_input_of
from reproarchive.compat.inductor import debug_wrapper_of, set_debug_wrapper
from reproarchive.sources.program.door_archives import AOT_DIR_ENV, AOT_PREFIX, ARCHIVED_ATTR, write_at_door

log = logging.getLogger("reproarchive.capture")
_calls = threading.local()


@contextlib.contextmanager
def dynamo_call(gm: Any, inputs: list[Any]):
    """Dynamo's graph module and the real inputs it hands the backend, known to Inductor's door
    for as long as the backend call lasts (the forward graph is compiled inside it)."""
    stack = _calls.__dict__.setdefault("stack", [])
    stack.append((gm, inputs))
    try:
        yield
    finally:
        stack.pop()


def patch(module: Any) -> None:
    """Wrap ``module`` (``torch._inductor.compile_fx``)'s after_aot debug wrapper once."""
    if not os.environ.get(AOT_DIR_ENV):
        return
    original = debug_wrapper_of(module)
    if original is None or getattr(original, "_reproarchive_guarded", False):
        return

    @functools.wraps(original)
    def wrap_compiler_debug(compiler_fn: Any, compiler_name: str) -> Any:
        debug_wrapper = original(compiler_fn, compiler_name)

        @functools.wraps(debug_wrapper)
        def door(gm: Any, example_inputs: Any, *args: Any, **kwargs: Any) -> Any:
            stack = getattr(_calls, "stack", None)
            caller = stack[-1] if stack else None
            pristine = _copy(gm)
            try:
                compiled = debug_wrapper(gm, example_inputs, *args, **kwargs)
            except Exception as exc:
                if pristine is not None and not _is_control_flow(exc):
                    _write(pristine, list(example_inputs), caller, exc, compiler_name)
                raise
            if pristine is None or not getattr(compiled, "_boxed_call", False):
                return compiled
            return watched_calls(compiled, pristine, list(example_inputs), compiler_name,
                                 backward=bool(kwargs.get("is_backward")))

        return door

    wrap_compiler_debug._reproarchive_guarded = True
    set_debug_wrapper(module, wrap_compiler_debug)


def watched_calls(compiled: Any, gm: Any, examples: list[Any], compiler_name: str, *, backward: bool) -> Any:
    """``compiled`` (Inductor's code behind PyTorch's after_aot wrapper, called boxed with the
    real inputs) such that a failing call is archived with those inputs: every call of a
    backward graph, and every call of a forward graph after its first (which the crash guard
    keeps from its spool, with the inputs as they were before it: ``crash_guard._keep``).
    PyTorch's hook dumps such a call with fake copies. The inputs are held by weak reference
    only (Inductor frees them as early as it can, and the program's memory stays its own), so
    they are read after the call failed (the archive's ``door`` says so): one the graph writes
    in place holds what it had then, and one already freed stays absent. Costs a list of weak
    references per call, and for a graph that draws random numbers the generator states it
    starts from (read after the call, they would be those it left)."""
    from reproarchive.codec.device_runtime import RngState, devices_of
    from reproarchive.codec.rng import archived_states, draws_random

    calls = [0]
    read_rng = RngState.reader(devices_of(examples)) if draws_random(gm) else None

    def call(real_inputs: list[Any]) -> Any:
        calls[0] += 1
        held = [_reference(v) for v in real_inputs] if backward or calls[0] > 1 else None
        started = read_rng() if held is not None and read_rng is not None else None
        try:
            return compiled(real_inputs)
        except Exception as exc:
            if held is not None and not _is_control_flow(exc) and getattr(exc, ARCHIVED_ATTR, None) is None:
                written = _write_call(gm, [get() for get in held], examples, exc, compiler_name, calls[0],
                                      archived_states(started))
                if written is not None:
                    setattr(exc, ARCHIVED_ATTR, str(written))
            raise

    call._boxed_call = True
    return call


def _reference(value: Any) -> Callable[[], Any]:
    """A getter of ``value``: weak for a tensor, the value itself otherwise (a size, a seed)."""
    try:
        return weakref.ref(value)
    except TypeError:
        return lambda: value


def _write_call(gm: Any, inputs: list[Any], examples: list[Any], exc: BaseException, compiler_name: str,
                call: int, rng_states: dict | None) -> Path | None:
    """A failing call of ``gm`` archived: each input freed before it could be read stays absent
    (its compile-time example, a fake tensor, where that has the same sizes); ``rng_states``:
    the generator states the call started from."""
    import torch

    kept, real = [], 0
    for value, example in zip(inputs, examples):
        if value is not None and _matches(value, example, later_call=True):
            kept.append(value)
            real += 1
        elif value is None and isinstance(example, torch.Tensor) and all(isinstance(d, int) for d in example.shape):
            kept.append(example)
        else:
            log.warning("reproarchive capture: call %d of the graph %s failed on could not be archived: input %d "
                        "was freed or changed shape before it could be read", call, compiler_name, len(kept))
            return None
    return write_at_door(gm, kept, exc, compiler_name, folder=Path(os.environ[AOT_DIR_ENV]), prefix=AOT_PREFIX,
                         door={"graph_kind": "after_aot", "real_inputs": real,
                               "door": f"inductor (call {call} of the compiled graph; inputs read after it failed)"},
                         capture_settings={"fwd_only": True}, stage="forward", rng_states=rng_states)


def _is_control_flow(exc: BaseException) -> bool:
    from reproarchive.sources.capture.call_guard import is_control_flow as steering

    return steering(exc)


def _copy(gm: Any) -> Any:
    """A structural copy of ``gm``, with the guards AOTAutograd handed Inductor noted on it
    before Inductor adds its own (``codec.shape_guards``)."""
    try:
        from reproarchive.codec.shape_guards import note_entry
        from reproarchive.sources.capture.capture_backend import copy_graph_structure

        copied = copy_graph_structure(gm)
        note_entry(copied)
        return copied
    except Exception as err:  # noqa: BLE001 - never in place of the program's own run
        log.warning("reproarchive capture: could not copy the graph Inductor was handed: %s", err)
        return None


def real_inputs(gm: Any, example_inputs: list[Any], caller: tuple[Any, list[Any]] | None) -> tuple[list[Any], int]:
    """(the inputs to archive, how many are the program's real data): for each input of ``gm``,
    the real value AOTAutograd's descriptor names, when its metadata matches the example
    Inductor got; else the example itself (a fake tensor is stored as absent)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out, real = [], 0
    for node, example in zip(placeholders, example_inputs):
        value = _described(aot_input_of(node), caller)
        if value is not None and _matches(value, example):
            out.append(value)
            real += 1
        else:
            out.append(example)
    return out, real


def _described(described: tuple[str, Any] | None, caller: tuple[Any, list[Any]] | None) -> Any:
    if caller is None or described is None:
        return None
    dynamo_gm, inputs = caller
    kind, where = described
    if kind == "plain":
        return inputs[where] if isinstance(where, int) and 0 <= where < len(inputs) else None
    try:
        return functools.reduce(getattr, str(where).split("."), dynamo_gm)
    except AttributeError:
        return None


def _same(real: Any, symbolic: Any) -> bool:
    """Sizes (or strides) equal where the example has a value: an unbacked symbol (``mark_unbacked``)
    has none, and the real tensor's is its value."""
    return all(hint is None or hint == value for value, hint in zip(real, map(hint_of, symbolic)))


def _matches(real: Any, example: Any, *, later_call: bool = False) -> bool:
    """Whether ``real`` is the value ``example`` (what Inductor compiled for) describes. In a
    later call a size the compile made symbolic may differ from the example's hint; a static
    one may not."""
    import torch

    from reproarchive.codec.tensors import _is_fake

    if isinstance(example, torch.Tensor):
        if not (isinstance(real, torch.Tensor) and not _is_fake(real) and real.dtype == example.dtype
                and real.device == example.device and real.dim() == example.dim()):
            return False
        if later_call:
            return all(not isinstance(e, int) or e == v for v, e in zip(real.shape, example.shape))
        return _same(real.shape, example.shape) and _same(real.stride(), example.stride())
    if isinstance(example, (torch.SymInt, int)) and not isinstance(example, bool):
        plain = isinstance(real, int) and not isinstance(real, bool)
        return plain and (later_call and isinstance(example, torch.SymInt) or real == hint_of(example))
    return False


def _write(gm: Any, example_inputs: list[Any], caller: Any, exc: BaseException, compiler_name: str) -> Path | None:
    try:
        inputs, real = real_inputs(gm, example_inputs, caller)
    except Exception as err:  # noqa: BLE001 - never in place of the program's own failure
        log.warning("reproarchive capture: could not archive the graph Inductor failed on: %s: %s",
                    type(err).__name__, err)
        return None
    return write_at_door(gm, inputs, exc, compiler_name, folder=Path(os.environ[AOT_DIR_ENV]), prefix=AOT_PREFIX,
                         door={"graph_kind": "after_aot", "door": "inductor (compile_fx_inner)", "real_inputs": real},
                         capture_settings={"fwd_only": True}, stage="compile")
