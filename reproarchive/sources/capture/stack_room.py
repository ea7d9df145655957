"""Calling a compiler or a first-call check with room on the interpreter's frame stack.

Since Python 3.11 the interpreter keeps its frames on a stack of its own, allocated in chunks:
a call that does not fit the current chunk maps a new one, and returning from the frame at a
chunk's base unmaps it (CPython's ``_PyThreadState_BumpFramePointerSlow`` /
``_PyThreadState_PopFrame``). Code whose call depth keeps crossing a chunk's edge therefore maps
and unmaps a chunk, and page-faults it in, at every crossing. Where the edges fall depends on
every frame below, so the few frames capture adds under a compile or a first call can move a
compiler's busiest depth onto an edge: measured (4 GB of weights, inductor, the first-call check
with its backward), Inductor's compile of the backward took 11.0-11.7 s inside the check against
8.1-8.4 s in the plain program's ``backward()``, with 390,000 page faults (1.5 GB) instead of
9,000, nearly all of them in ``_PyThreadState_BumpFramePointerSlow``, and the same calls in its
profile. Called through ``with_frame_room`` the same compile took 8.2 s and 7,000 faults.

``with_frame_room`` calls through a function whose frame claims a large operand stack
(``co_stacksize``): it cannot fit the current chunk, so the interpreter maps a new chunk twice
its size, and every frame below it fits in the unused half, ~4,000 frames, more than Python's
recursion limit lets a program nest. The claimed stack is never written (only the frame's
header and locals are), so it costs one mapping of virtual memory, freed on return, and a page
or two. It does not change what runs. Before 3.11 frames were separate objects: there it is a
plain call.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

#: Operand-stack slots the calling frame claims: 512 KiB of 8-byte slots, so the chunk mapped
#: for it is 1 MiB and half of it is free for the frames below.
ROOM_SLOTS = 1 << 16


def _call(fn: Callable[..., T], args: tuple, kwargs: dict) -> T:
    return fn(*args, **kwargs)


if sys.version_info >= (3, 11):
    _call.__code__ = _call.__code__.replace(co_stacksize=_call.__code__.co_stacksize + ROOM_SLOTS)


def with_frame_room(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, its frames and those below it in a fresh chunk of the
    interpreter's frame stack with room for all of them (module docstring)."""
    return _call(fn, args, kwargs)
