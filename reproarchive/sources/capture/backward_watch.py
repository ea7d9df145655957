"""A first call's compiled backward, guarded where the program itself runs it.

AOTAutograd compiles a training graph's backward lazily, at the program's first
``loss.backward()``, and that backward is compiled code that can fail or crash like the forward.
Checking it by running a step of our own before the first call (forward and backward on the real
inputs) costs a whole training step at every graph's first call, and moves the backward's
failure to the forward call, where the program never saw it. Instead the nodes the first call
put in the autograd graph whose backward is an ``autograd.Function``'s (AOTAutograd's compiled
backward is one) are watched: when the engine runs one of them, in the program's own
``backward()``, ``guard(run)`` runs in its place and calls ``run()``, the node's real backward;
the guard can archive what it raises and hold the crash record while it runs. Every other node
of the class, and this node once it has run, take the class's own ``backward`` unchanged.

How: the engine looks up a node's ``backward`` on its ``autograd.Function`` class at each run
(``BackwardCFunction._get_user_fn``), so the class gets a dispatcher while any of its nodes is
watched; the dispatcher tells watched nodes from the others by identity, and is removed when the
last watch on the class ends. A watch ends when its node ran, or when the node is freed without
running (the program never ran that backward); then ``done()`` is called, once per ``watch``.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from reproarchive.compat.pytree import tree_leaves
from reproarchive.sources.capture.stack_room import with_frame_room

#: runs in place of a watched node's backward: given the node's real backward (no arguments)
Guard = Callable[[Callable[[], Any]], Any]

_lock = threading.RLock()  # re-entrant: a node may be freed, and its finalizer run, while it is held
#: per watched ``autograd.Function`` class: id(node) -> (a weak reference to it, its watch)
_watched: dict[type, dict[int, tuple[weakref.ref, _Watch]]] = {}
#: per watched class: what its ``backward`` was in its own ``__dict__`` (None: inherited)
_own: dict[type, Any] = {}


class _Watch:
    """One first call's watch over the nodes it made: ``guard`` for each that runs, ``done`` once
    every one has run or been freed."""

    def __init__(self, guard: Guard, done: Callable[[], None], nodes: int):
        self.guard, self.done, self.left = guard, done, nodes

    def ended_one(self) -> None:
        with _lock:
            self.left -= 1
            last = self.left == 0
        if last:
            self.done()


def watch(outputs: Any, inputs: Sequence[Any], guard: Guard, done: Callable[[], None]) -> bool:
    """Watch the ``autograd.Function`` nodes that the call on ``inputs`` made and ``outputs``
    lead back to (``function_nodes``): ``guard`` runs in place of each one's backward, ``done``
    once all ran or were freed. False, and nothing watched, where there is none (or one whose
    class defines ``vjp``, which the engine calls instead of ``backward``)."""
    nodes = function_nodes(outputs, inputs)
    if not nodes or any(_defines_vjp(type(node)._forward_cls) for node in nodes):
        return False
    one = _Watch(guard, done, len(nodes))
    for node in nodes:
        cls = type(node)._forward_cls
        with _lock:
            table = _watched.get(cls)
            if table is None:
                table = _watched[cls] = {}
                _own[cls] = cls.__dict__.get("backward")
                cls.backward = staticmethod(_dispatcher(cls))
            table[id(node)] = (weakref.ref(node), one)
        finalizer = weakref.finalize(node, _freed, cls, id(node))
        finalizer.atexit = False
    return True


def function_nodes(outputs: Any, inputs: Sequence[Any]) -> list[Any]:
    """The nodes of ``outputs``' autograd graph that a call on ``inputs`` made (the walk stops at
    the inputs' own nodes and at leaves) whose backward is a Python ``autograd.Function``'s."""
    import torch


    stop = {id(a.grad_fn) for a in inputs if isinstance(a, torch.Tensor) and a.grad_fn is not None}
    todo = [t.grad_fn for t in tree_leaves(outputs) if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    seen: set[int] = set()
    found = []
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen or id(node) in stop:
            continue
        seen.add(id(node))
        if isinstance(getattr(type(node), "_forward_cls", None), type):
            found.append(node)
        todo.extend(following for following, _ in node.next_functions)
    return found


def _defines_vjp(cls: type) -> bool:
    import torch

    return getattr(cls, "vjp", None) is not torch.autograd.Function.vjp


def _dispatcher(cls: type) -> Callable:
    original = cls.backward  # the class's own or inherited, as the engine would call it

    def backward(ctx: Any, *args: Any) -> Any:
        with _lock:
            found = _watched.get(cls, {}).pop(id(ctx), None)
            if found is not None:
                _unpatch_if_unwatched(cls)
        if found is not None and found[0]() is not ctx:  # a freed node's id, taken by this one
            found[1].ended_one()
            found = None
        if found is None:
            return original(ctx, *args)
        one = found[1]
        try:
            # the backward compiles here, a few frames deeper than without the watch: given
            # room, as every compile under capture is (``stack_room``)
            return one.guard(lambda: with_frame_room(original, ctx, *args))
        finally:
            one.ended_one()

    return backward


def _freed(cls: type, key: int) -> None:
    """A watched node was freed: ended without running (its entry is gone if it ran)."""
    with _lock:
        found = _watched.get(cls, {}).pop(key, None)
        if found is not None:
            _unpatch_if_unwatched(cls)
    if found is not None:
        found[1].ended_one()


def _unpatch_if_unwatched(cls: type) -> None:
    """Under ``_lock``: the class's own ``backward`` back once none of its nodes is watched."""
    if _watched.get(cls) or cls not in _own:  # still watched, or given back already
        return
    _watched.pop(cls, None)
    own = _own.pop(cls)
    if own is not None:
        cls.backward = own
    elif "backward" in cls.__dict__:  # the dispatcher over an inherited backward
        del cls.backward


__all__ = ["watch", "function_nodes", "Guard"]
