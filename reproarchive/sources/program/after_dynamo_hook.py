"""PyTorch's after_dynamo hook as the crash guard runs it, inside the backend call (``capture --``).

It lives apart from ``crash_guard`` (the door every torch.compile backend goes through, and the
spool entry of each graph's first call) because taking over the hook's check is a piece of its
own: PyTorch's dumps, unchanged, with the graph's first call as the check (``call_guard``) and a
compiled backward watched where the program runs it (``backward_watch``). ``crash_guard`` calls
``after_dynamo_hook`` when the hook runs in the backend; both share the first call's spool entry
through ``first_call``. Like ``crash_guard`` it loads in every process before torch: everything
else is imported when the hook runs.
"""

from __future__ import annotations

# Imports inside functions: imported with the crash guard by every Python process `capture
# --` starts; what recording a failure needs is imported when a graph fails.
import functools
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reproarchive.compat import dynamo
from reproarchive.sources.capture.first_call import FirstCall, discard, restore, set_aside
from reproarchive.sources.program.door_archives import DYNAMO_DOOR_DIR_ENV, DYNAMO_PREFIX, write_at_door

log = logging.getLogger("reproarchive.capture")


def after_dynamo_hook(wrapper: Any, name: str, gm: Any, example_inputs: list[Any], kwargs: dict,
                      first: FirstCall | None = None) -> Any:
    """PyTorch's after_dynamo hook (``TORCHDYNAMO_REPRO_AFTER=dynamo``, levels 1-3), its dumps
    unchanged, but without running the compiled graph inside the backend call; ``name`` is the
    backend's recorded name (a custom function by its import path, not PyTorch's bare name).

    The hook runs ``run_fwd_maybe_bwd`` on the graph while Dynamo is still compiling it, which
    in torch 2.13 breaks working Inductor programs (``expected Tensor() for op: input``, or
    ``not enough values to unpack``) and turns a kernel that aborts (exit 134) into a
    ``BackendCompilerFailed`` (exit 1): capture would change the program it captures. Here
    the graph's first call is the check, outside Dynamo, as the capture backend's is: its
    failure is dumped (``call_guard``), and a backward the backend compiled is watched where the
    program runs it (``backward_watch``): its failure is dumped there, and the spool entry of
    ``first`` is on disk while it runs. Where the outputs show a compiled backward that cannot
    be watched, that backward is checked right after the call, on aliases of its inputs (copies
    of those it writes). A failure of any later call is dumped too. The program's own
    exception is re-raised unchanged, with PyTorch's ``minifier_path``.
    """
    from reproarchive.sources.capture.call_guard import is_control_flow
    from reproarchive.sources.capture.capture_backend import copy_graph_structure

    level = dynamo.repro_level()
    if level == 3:
        dynamo.dump_graph_and_inputs(gm, example_inputs, name)
    pristine = copy_graph_structure(gm)
    first = first or FirstCall(None)
    dump, dump_or_say = _dumps(pristine, level, name)
    try:
        compiled = wrapper._torchdynamo_orig_backend(gm, example_inputs, **kwargs)
    except Exception as exc:
        if not is_control_flow(exc):
            log.warning("Compiled Fx GraphModule failed. Creating script to minify the error.")
            try:
                dump(example_inputs, exc, "compile")
            except Exception:  # noqa: BLE001 - said by the dump; the program's own exception goes on
                pass
        raise
    return _checked(compiled, gm, pristine, first, dump, dump_or_say, name)


def _dumps(pristine: Any, level: int, name: str) -> tuple[Callable[..., str],
                                                           Callable[[list[Any], BaseException], None]]:
    """PyTorch's dump of the graph (as it was before the backend) with ``inputs`` for a failure
    at ``stage`` (the exception's, unless given; level 1: the backend's state; 2 and 3: the
    graph and its inputs), which sets the exception's ``minifier_path``; and the same, saying
    so on the exception where it fails.

    PyTorch's dump writes the graph as Python text, and a graph with a higher-order op's
    subgraphs fails to (``Cannot convert module to string``): its hook then raised that error in
    place of the program's own, and the failure was lost. Such a failure is archived at Dynamo's
    door instead (``_at_door``): the graph, the real inputs, the program's own exception."""
    from reproarchive.sources.capture.call_guard import not_archived
    from reproarchive.sources.capture.capture_backend import copy_graph_structure

    def pytorch_dump(inputs: list[Any], exc: BaseException) -> str:
        copied = copy_graph_structure(pristine)
        if level == 1:
            dynamo.dump_backend_state(copied, inputs, name)
        else:
            dynamo.dump_graph_and_inputs(copied, inputs, name)
        path = os.path.join(dynamo.minifier_dir(), "minifier_launcher.py")
        try:
            exc.minifier_path = path  # type: ignore[attr-defined]  # as PyTorch's hook sets it
        except Exception:  # noqa: BLE001 - exceptions with __slots__
            pass
        return path

    def dump(inputs: list[Any], exc: BaseException, stage: str | None = None) -> str:
        if stage is None:  # a call's failure: its stage from the exception
            from reproarchive.replay.accuracy import stage_of

            stage = stage_of(exc)
        if _unhinted(inputs):  # PyTorch's dump writes such a size as None; the door knows its value
            written = _at_door(pristine, inputs, exc, name, stage)
            if written is not None:
                return str(written)
        try:
            return pytorch_dump(inputs, exc)
        except Exception as err:
            if _device_broken(err):  # the inputs cannot be read either: the spool has them (``crash_guard._keep``)
                raise
            written = _at_door(pristine, inputs, exc, name, stage)
            log.warning("reproarchive capture: PyTorch's dump of this failure failed (%s: %s)%s",
                        type(err).__name__, err, "; archived at Dynamo's door instead" if written else "")
            if written is None:
                raise
            return str(written)

    def dump_or_say(inputs: list[Any], exc: BaseException) -> None:
        try:
            dump(inputs, exc)
        except Exception as err:  # noqa: BLE001 - the program's own exception goes on
            not_archived(exc, f"{type(err).__name__}: {err}", call=1)

    return dump, dump_or_say


#: What a device that fails every use after a fault says (a device-side assert, an illegal address).
_DEVICE_BROKEN = re.compile(r"AcceleratorError|CUDA error|HIP error|device-side assert|illegal memory access")


def _unhinted(inputs: list[Any]) -> bool:
    """Whether an input is a size Dynamo passes as an unbacked symbol (``mark_unbacked``): it has
    no value PyTorch's dump could write (``reader.symint(None)``)."""
    from reproarchive.compat.fake import is_unbacked

    return any(is_unbacked(v) for v in inputs)


def _device_broken(err: BaseException) -> bool:
    return _DEVICE_BROKEN.search(f"{type(err).__name__}: {err}") is not None


def _at_door(pristine: Any, inputs: list[Any], exc: BaseException, name: str, stage: str, *,
             rng_states: dict | None = None, call: int | None = None) -> Any:
    """The failure archived at Dynamo's door (``capture --`` names the folder), or None;
    ``rng_states``: the generator states call ``call`` started from."""
    folder = os.environ.get(DYNAMO_DOOR_DIR_ENV)
    if not folder:
        return None
    where = "dynamo (the backend call)" if call is None else f"dynamo (call {call} of the compiled graph)"
    return write_at_door(pristine, inputs, exc, name, folder=Path(folder), prefix=DYNAMO_PREFIX, stage=stage,
                         capture_settings={} if stage == "compile" else {"check_runtime": True},
                         door={"door": where, "real_inputs": len(inputs)}, rng_states=rng_states)


def _checked(compiled: Any, gm: Any, pristine: Any, first: FirstCall, dump: Callable, dump_or_say: Callable,
             name: str) -> Any:
    """``compiled`` guarded (``call_guard``): its first call is the check, a backward it compiled
    watched where the program runs it (``first`` takes its spool entry over then) or checked
    right after the call, and every failure dumped; a later call of a graph that draws random
    numbers is archived at Dynamo's door instead, with the generator states it started from,
    which PyTorch's dump cannot hold (the first call's are in its spool entry)."""
    from reproarchive.codec.device_runtime import RngState, devices_of
    from reproarchive.replay.accuracy import run_forward_backward
    from reproarchive.sources.capture.call_guard import (
        GraphWrites,
        backward_is_compiled,
        checked_after,
        guarded,
        is_control_flow,
        outputs_cannot_require_grad,
        preserved_state,
        runs_the_graph,
    )

    writes = GraphWrites(pristine)

    def watches(args: list[Any]) -> bool:
        return not (outputs_cannot_require_grad(gm, args) or runs_the_graph(compiled))

    first.finished_first = watches

    def check(args: list[Any], run_args: list[Any], rng: Any = None) -> None:
        try:
            with preserved_state(gm, args, rng=rng):
                run_forward_backward(compiled, run_args, seed="ones", backward_if=backward_is_compiled)
        except Exception as exc:
            if not is_control_flow(exc):
                dump_or_say(args, exc)
            raise

    def watched(args: list[Any], before: list[Any], out: Any) -> bool:
        return writes.of(before) is not None and _watched(first, dump_or_say, args, before, out)

    def first_call(args: list[Any]) -> Any:
        # the real call is the check, waited for on its devices, and its failure dumped
        # (``call_guard``); the graph runs once. A backward the backend compiled is watched
        # where the program runs it; one its outputs show that cannot be is checked after it
        after = checked_after(writes, args, RngState.capture(devices_of(args)), check)

        def ended(before: list[Any], out: Any) -> None:
            if out is None or not watches(args) or not watched(args, before, out):
                after(before, out)
        return ended

    return guarded(compiled, writes, failed=functools.partial(_failed_call, pristine, name, dump),
                   first_call=first_call)


def _watched(first: FirstCall, dump_or_say: Callable, args: list[Any], before: list[Any], out: Any) -> bool:
    """The compiled backward the first call made, watched (False: nothing to watch): its
    failure is dumped and kept from the spool entry of ``first``, with the generator states the
    dump lacks (the dump is then left out)."""
    from reproarchive.sources.capture.call_guard import watched_backward

    def failed(exc: BaseException) -> None:
        dump_or_say(before, exc)
        first.keep(exc, "backward")

    if not watched_backward(out, args, failed=failed, restore=lambda: restore(first.pending),
                            set_aside=lambda: set_aside(first.pending), done=lambda: discard(first.pending)):
        return False
    first.watched = True
    return True


def _failed_call(pristine: Any, name: str, dump: Callable, before: list[Any], exc: BaseException, call: int,
                 rng: Any) -> tuple[Any, None]:
    """A failing call's archive (``call_guard.Failed``): PyTorch's dump, or for a later call of a
    graph that draws random numbers (``rng``: the states it started from) one at Dynamo's door."""
    from reproarchive.replay.accuracy import stage_of

    if call > 1 and rng is not None:
        written = _at_door(pristine, before, exc, name, stage_of(exc), rng_states=rng, call=call)
        if written is not None:
            return written, None
    return dump(before, exc), None
