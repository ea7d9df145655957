"""Compiles and first calls under capture run with room on the interpreter's frame stack
(``stack_room``): a call chain that keeps crossing a chunk's edge maps a chunk at every crossing,
and the frames capture adds below a compiler can put its busiest depth on an edge (it
had cost +3.5 s in a 4 GB model's backward compile).

Pure Python for the mechanism (page faults counted with ``getrusage``), a counting backend for
the wiring: milliseconds.
"""

from __future__ import annotations

import resource
import sys
import threading

import pytest
import torch

import reproarchive
from reproarchive.sources.capture import stack_room
from reproarchive.sources.capture.stack_room import with_frame_room

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

CALLS = 2000


def _faults(fn, *args) -> int:
    """Page faults of this thread while ``fn(*args)`` runs."""
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    fn(*args)
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before


def _in_a_thread(fn):
    """``fn()`` on a thread of its own: a frame stack that starts empty, in chunks of the
    interpreter's first size, whatever the tests before left on this one."""
    result = []
    thread = threading.Thread(target=lambda: result.append(fn()))
    thread.start()
    thread.join()
    return result[0]


def _chain(n: int) -> int:
    return 0 if n == 0 else _chain(n - 1) + 1


def _busy_at(depth: int) -> None:
    """Calls a ten-frame chain ``CALLS`` times from ``depth`` frames below the caller."""
    if depth:
        _busy_at(depth - 1)
        return
    for _ in range(CALLS):
        _chain(10)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="frames live on a chunked stack from Python 3.11")
@pytest.mark.skipif(not hasattr(resource, "RUSAGE_THREAD"), reason="counts a thread's page faults (Linux)")
def test_a_call_chain_at_a_chunk_edge_maps_no_chunk_with_frame_room():
    def measured():
        # some depth puts the chain across a chunk's edge: a fault (a fresh mapping) at nearly
        # every call there; the same depth, from the same frame, with room
        most = 0
        for depth in range(0, 240, 2):
            faults = _faults(_busy_at, depth)
            if faults >= CALLS // 2:
                return faults, _faults(with_frame_room, _busy_at, depth)
            most = max(most, faults)
        return most, None

    at_the_edge, with_room = _in_a_thread(measured)
    assert at_the_edge >= CALLS // 2
    assert with_room <= CALLS // 100


def test_with_frame_room_is_the_call():
    def fn(a, *, b):
        if b is None:
            raise KeyError(a)
        return a + b

    assert with_frame_room(fn, 1, b=2) == 3
    with pytest.raises(KeyError) as caught:
        with_frame_room(fn, "a", b=None)
    assert caught.traceback[-1].name == "fn"


def _on_room() -> bool:
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is stack_room._call.__code__:
            return True
        frame = frame.f_back
    return False


@pytest.mark.parametrize("check_runtime", [True, "calls"])
def test_the_compile_and_the_first_call_run_with_frame_room(tmp_path, check_runtime):
    seen = {"compile": [], "calls": []}

    def backend(gm, example_inputs):
        seen["compile"].append(_on_room())

        def run(*args):
            seen["calls"].append(_on_room())
            return gm(*args)
        return run

    def f(x, w):
        return torch.relu(x @ w)

    compiled = torch.compile(f, backend=reproarchive.capture(backend, path=tmp_path, check_runtime=check_runtime))
    x, w = torch.randn(4, 8), torch.randn(8, 8, requires_grad=True)
    for _ in range(3):
        compiled(x, w).sum().backward()
    assert seen["compile"] == [True]
    # the first call (the check) has room; later calls are the program's own, one frame deeper
    # than without capture
    assert seen["calls"] == [True, False, False]


def test_a_watched_backward_compiles_with_frame_room(tmp_path):
    """The first call's compiled backward compiles in the program's own ``backward()``, under
    the watch's frames (``backward_watch``): with room, as the forward's compile."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    seen = []

    def backward_compiler(gm, example_inputs):
        seen.append(_on_room())
        return make_boxed_func(gm.forward)

    backend = aot_autograd(fw_compiler=lambda gm, _: make_boxed_func(gm.forward), bw_compiler=backward_compiler)
    compiled = torch.compile(lambda x, w: torch.relu(x @ w), backend=reproarchive.capture(backend, path=tmp_path))
    compiled(torch.randn(4, 8), torch.randn(8, 8, requires_grad=True)).sum().backward()
    assert seen == [True]
