"""Every call of a compiled graph covered: a failure on its first call or its thousandth leaves an
archive of the inputs as they were before that call.

A compiled graph is called once per step; it may fail only at the third call (a new batch
size under ``dynamic=True``, the smaller last batch, data that reaches a bad kernel). Checking
each call by running it twice would double the job; instead the real call is the check: the
wrapper calls the compiled function, and only when it raises does it archive what went in.
That is sound because a call can change only the inputs its graph writes in place
(``replay.input_writes``, found once per graph on fake tensors); those, and only those, are
copied before every call (``snapshot``), usually none or a few small buffers. Every other
input is archived as it is: the call could not have changed it. So a passing call costs one
``try`` and, for a graph that writes its inputs, a copy of what it writes. Where the analysis
fails (an operator without a fake kernel) nothing is copied, and the archive lists the inputs
whose version counter moved during the call (``inputs_modified``).

``first_call`` runs once, before the first real call (the archive a native crash would leave,
and a check run before the call where one is needed: accuracy). When it returns a callable
(``ended``), the first real call is the check: it is waited for on its devices, so an
asynchronous error is its failure and not a later call's, and ``ended(before, outputs)`` runs
once it has ended (returned, or raised after any archive of its failure was written: outputs
None), with the inputs as they were before it. There the backend checks what the call alone
did not run, a compiled backward (``backward_is_compiled``), on those inputs, and then discards
the pending archive. A native crash on a later call kills the process with nothing written:
only the first call of a graph is guarded against crashes (writing every call's inputs to disk
first would cost more than the job); each later call marks itself (``call_marks``), so the
guardian of the process's spool names the call it died in.
"""

from __future__ import annotations

import functools
import itertools
import logging
import sys
from collections.abc import Callable, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

import torch

from reproarchive.codec.device_runtime import RngState, devices_of, forked_rng, synchronize
from reproarchive.codec.rng import archived_states, draws_random
from reproarchive.compat.dynamo import control_flow_exceptions
from reproarchive.compat.pytree import tree_leaves
from reproarchive.replay.input_writes import rerun_inputs, snapshot, written_inputs
from reproarchive.sources.capture import call_marks, gc_pause, malloc_trim
from reproarchive.sources.capture.backward_watch import watch
from reproarchive.sources.capture.stack_room import with_frame_room

log = logging.getLogger("reproarchive.capture")

# (inputs before the call, the exception, the call's number from 1, the generator states it
# started from as an archive holds them, None for a graph that draws nothing) -> (where
# the archive went, or None and why not); the wrapper says so on stderr when there is none
Failed = Callable[[list[Any], BaseException, int, Any], tuple[Any, str | None]]


def is_control_flow(exc: BaseException) -> bool:
    """Exceptions Dynamo uses to steer tracing (fall back, restart, skip): not failures."""

    return isinstance(exc, control_flow_exceptions())


class GraphWrites:
    """The inputs one graph writes, found at its first call and kept (the analysis is a
    property of the graph; ``pristine_gm`` is the graph as Dynamo traced it), and whether it
    draws random numbers: each call of such a graph reads the generator states it starts from,
    since an archive written after the call failed would otherwise hold the states the call
    left, passed off as those it began with."""

    def __init__(self, pristine_gm: Any):
        self.gm = pristine_gm
        self._known = False
        self._written: frozenset[int] | None = None
        self.draws_random = draws_random(pristine_gm)
        self._rng_reader: Callable[[], RngState] | None = None

    def rng_before(self, args: Sequence[Any]) -> RngState | None:
        """The generator states a call on ``args`` starts from, for a graph that draws (else None);
        the devices are resolved at the first call (Dynamo guards a compiled graph on them)."""
        if not self.draws_random:
            return None
        if self._rng_reader is None:
            self._rng_reader = RngState.reader(devices_of(args))
        return self._rng_reader()

    def of(self, args: list[Any]) -> frozenset[int] | None:
        if not self._known:
            with gc_pause.paused():  # a fake run: many short-lived objects (``collector``)
                self._written = written_inputs(self.gm, args)
            self._known = True
            if self._written is None:
                log.debug("reproarchive: the inputs this graph writes are unknown; archives list the changed ones")
        return self._written


#: Called once a first call that is its own check has ended: (the inputs as they were before it,
#: its outputs, or None where it raised); may run a check after it, and raise that check's failure
Ended = Callable[[list[Any], Any], None]


def checked_after(writes: GraphWrites, args: list[Any], started: Any,
                  check: Callable[[list[Any], list[Any], Any], None], *,
                  wanted: Callable[[Any], bool] | None = None,
                  then: Callable[[], None] | None = None) -> Ended:
    """The ``ended`` of a first call on ``args`` that is its own check: once it has returned
    outputs that show what it did not run itself (``wanted``, by default a compiled backward:
    ``backward_is_compiled``), ``check`` runs on the inputs as they were before it (``before``;
    fresh copies of the written ones, ``rerun_inputs``) from the generator states it started
    from (``started``, a ``device_runtime.RngState``); ``then`` runs last, whatever happened.
    One rule for the capture backend's first calls and the crash guard's."""
    def ended(before: list[Any], out: Any) -> None:
        try:
            if out is not None and (wanted or backward_is_compiled)(out):
                check(before, rerun_inputs(before, args, writes.of(before)), started)
        finally:
            if then is not None:
                then()
    return ended


def watched_backward(out: Any, args: list[Any], *, failed: Callable[[BaseException], None],
                     restore: Callable[[], None], set_aside: Callable[[], None], done: Callable[[], None]) -> bool:
    """Watch the compiled backward a first call on ``args`` made (its outputs ``out``,
    ``backward_watch``), one rule for the capture backend and the crash guard: while it runs in
    the program's ``backward()`` its crash record is back on disk (``restore``, then
    ``set_aside``), its first failure goes to ``failed`` and is re-raised unchanged, and ``done``
    once it ran or was freed. The record is set aside now. False where there is nothing to
    watch (nothing set aside)."""

    fails: list[bool] = []

    def guard(run: Callable[[], Any]) -> Any:
        restore()
        try:
            return run()
        except Exception as exc:
            if not fails and not is_control_flow(exc):
                fails.append(True)
                failed(exc)
            raise
        finally:
            set_aside()

    if not watch(out, args, guard, done):
        return False
    set_aside()
    return True


def guarded(compiled: Callable, writes: GraphWrites, *, failed: Failed,
            first_call: Callable[[list[Any]], Ended | None] | None = None,
            marker: call_marks.Marker | None = None) -> Callable:
    """``compiled`` behind a wrapper that archives the inputs of any call that raises (through
    ``failed``) and re-raises the exception unchanged; ``first_call(args)`` runs once first, and
    the ``ended`` it may return once that call has ended (module docstring). ``marker``: where
    each later call marks itself, so that a native crash in one is named (``call_marks``)."""

    state = {"calls": 0, "first": first_call}

    def call(args: tuple[Any, ...], ended: Ended | None = None) -> Any:
        written = writes.of(list(args))
        before = snapshot(args, written)
        versions = versions_of(args) if written is None else None
        started = writes.rng_before(args)
        out = None
        try:
            out = compiled(*args)
            if ended is not None:  # an asynchronous error of the first call is its own
                synchronize(devices_of(args))
            return out
        except Exception as exc:
            out = None
            if not is_control_flow(exc):
                _archive_call(failed, before, exc, state["calls"], versions, started)
            raise
        finally:
            if ended is not None:
                ended(before, out)

    def first_run(first: Callable[[list[Any]], Ended | None], args: tuple[Any, ...]) -> Any:
        return call(args, first(list(args)))

    # Name and doc only: copying ``__dict__`` would copy a GraphModule's module tables.
    @functools.wraps(compiled, assigned=("__module__", "__name__", "__qualname__", "__doc__"), updated=())
    def run(*args: Any) -> Any:
        state["calls"] += 1
        first = state["first"]
        if first is None:
            return call_marks.marked(call, (args,), {}, marker, state["calls"])
        state["first"] = None
        # the check and the first run may compile (a backward, lazily): given frame room, as
        # the compile is (``stack_room``)
        return with_frame_room(first_run, first, args)

    run.__reproarchive_compiled__ = compiled  # type: ignore[attr-defined]
    return run


def runs_the_graph(compiled: Any) -> bool:
    """Whether ``compiled`` is the traced graph itself (a GraphModule, or its ``forward``), as
    ``eager``'s and a backend's that only rewrites the graph are: its backward is then PyTorch's
    derivatives of the graph's operators, not code a compiler made, unless an operator of the
    graph is an ``autograd.Function``, which its outputs show (``backward_is_compiled``).
    Judged by what the callable is, never by the backend's name."""

    owner = getattr(compiled, "__self__", None)
    if isinstance(owner, torch.fx.GraphModule):
        return getattr(compiled, "__func__", None) is type(owner).forward
    return isinstance(compiled, torch.fx.GraphModule)


def outputs_cannot_require_grad(gm: Any, args: Sequence[Any]) -> bool:
    """No output of ``gm(*args)`` can require grad: grad mode is off, or neither a tensor input
    nor a parameter or buffer ``gm`` holds requires grad. Then a check run (forward, and a
    backward only when an output requires grad) would be exactly the real call."""

    if not torch.is_grad_enabled():
        return True
    held = itertools.chain(gm.parameters(), gm.buffers()) if hasattr(gm, "parameters") else ()
    return not any(isinstance(t, torch.Tensor) and t.requires_grad for t in itertools.chain(args, held))


#: PyTorch's own autograd nodes that raise when run (an operator without a derivative)
_FAILING_NODES = frozenset({"Error", "NotImplemented", "DelayedError"})


def backward_is_compiled(outputs: Any) -> bool:
    """Whether the backward of ``outputs`` (a check run's, on leaf inputs) would run code other
    than PyTorch's own derivative formulas: a node defined in Python or C++ by an
    ``autograd.Function`` (AOTAutograd's compiled backward is one), or one that raises.

    Where it would not (the ``eager`` backend, a backend that only rewrites the graph), the
    backward the program runs is PyTorch's derivatives of the operators the compiled code ran,
    not code a compiler made: the first-call check then skips its backward, so it costs a
    forward, not a training step. Judged by what the nodes are, read once from the outputs'
    graph (one visit per node)."""

    todo = [t.grad_fn for t in tree_leaves(outputs) if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    seen: set[int] = set()
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        kind = type(node)
        if kind.__module__ != "builtins" or kind.__name__.startswith("CppNode") or kind.__name__ in _FAILING_NODES:
            return True
        todo.extend(following for following, _ in node.next_functions)
    return False


def _archive_call(failed: Failed, before: list[Any], exc: BaseException, call: int,
                  versions: list[int | None] | None, started: RngState | None) -> None:
    if versions is not None:
        changed = modified_inputs(before, versions)
        if changed:
            try:
                exc.reproarchive_inputs_modified = tuple(changed)  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001 - exceptions with __slots__
                pass
    try:
        where, reason = failed(before, exc, call, archived_states(started))
    except Exception as err:  # noqa: BLE001 - never in place of the user's own failure
        where, reason = None, f"{type(err).__name__}: {err}"
    if where is None:
        not_archived(exc, reason, call)


def not_archived(exc: BaseException, reason: str | None, call: int) -> None:
    """Say that the failure ``exc`` of call ``call`` was not archived, and mark it so: a pending
    spool entry may stand for it still (``crash_guard._keep``)."""
    print(f"reproarchive: call {call} of a compiled graph failed ({type(exc).__name__}) and was not "
          f"archived: {reason}", file=sys.stderr)
    try:
        exc.reproarchive_not_archived = reason  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - exceptions with __slots__
        pass


def versions_of(inputs: Any) -> list[int | None]:
    out: list[int | None] = []
    for a in inputs:
        try:
            out.append(a._version if isinstance(a, torch.Tensor) else None)
        except Exception:  # tensors without a version counter (some subclasses)
            out.append(None)
    return out


def modified_inputs(inputs: Any, versions: list[int | None]) -> list[int]:
    now = versions_of(inputs)
    return [i for i, (a, b) in enumerate(zip(versions, now)) if a is not None and a != b]


@contextmanager
def preserved_state(gm: Any, inputs: Sequence[Any], rng: Any = None):
    """Restore what a check run could change that the user can see: RNG streams, and the
    grads and buffer values of parameters the graph holds as attributes (inputs are copies);
    and give the memory the run freed back to the system (``malloc_trim.trim``), so that the real
    call's peak is the program's. ``rng`` (a ``device_runtime.RngState``): the generator
    states the check starts from (a check after the real call: those that call started from)."""

    params = list(gm.named_parameters()) if hasattr(gm, "named_parameters") else []
    buffers = list(gm.named_buffers()) if hasattr(gm, "named_buffers") else []
    grads = [(p, p.grad) for _, p in params]
    saved_buffers = [(b, b.detach().clone()) for _, b in buffers if isinstance(b, torch.Tensor)]
    with ExitStack() as stack:
        stack.enter_context(forked_rng(devices_of(inputs)))
        if rng is not None:
            rng.restore()
        try:
            yield
        finally:
            for p, g in grads:
                p.grad = g
            with torch.no_grad():
                for b, saved in saved_buffers:
                    if not torch.equal(b, saved):
                        b.copy_(saved)
            malloc_trim.trim()
