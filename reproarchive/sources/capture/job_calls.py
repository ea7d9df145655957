"""Every call of a compiled graph covered on every rank of a job, not only its first.

A job's first call of each graph writes every rank's part before it runs (``job_capture``). A
later call cannot: writing each rank's inputs to disk before every step would cost more than the
job. It is covered as in one process (``call_guard``): the real call is the check, the inputs
the graph writes are copied before it and every other input is kept as it is, and a rank whose
call raises writes its part from them, with its failure.

The other ranks' inputs of that call are in their own processes. So each rank keeps, per graph,
the inputs of the call running and of the last call that ended (references, plus the copies of
written inputs the guard makes anyway), and a thread of its own answers the failing rank's
request (``wanted.json`` in the job's parts folder: the graph's compile id and the call's
number) by writing its part of that call. The thread matters: the rank that must answer is
usually blocked inside that very call, in a collective the failing rank never reached, and its
main thread runs no Python until the launcher kills it. A rank that had ended the call already
answers too (its part says passed); one that has exited, or that runs a graph the request does
not name, writes nothing, and the job archive then holds the ranks that answered (``run --rank
R`` replays one of them alone).

Keeping the last call's inputs holds one batch a little longer (until the graph's next call),
never a copy of it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reproarchive.codec.rng import archived_states
from reproarchive.context.failure import pending_crash_record
from reproarchive.format.schema import RankOutcome
from reproarchive.replay.accuracy import stage_of
from reproarchive.replay.input_writes import snapshot
from reproarchive.sources.capture import job_capture
from reproarchive.sources.capture.call_guard import GraphWrites, is_control_flow, modified_inputs, versions_of
from reproarchive.sources.capture.job_parts import set_status
from reproarchive.sources.capture.stack_room import with_frame_room

log = logging.getLogger("reproarchive.capture")

WANTED = "wanted.json"
_POLL_S = 0.1


@dataclasses.dataclass
class _Call:
    number: int
    inputs: list[Any]
    ended: str | None = None  # None: running; "passed" or "failed"
    rng: Any = None  # the generator states it started from (``RngState``), for a graph that draws


@dataclasses.dataclass
class _Graph:
    """One compiled graph on this rank: what a request for one of its calls needs."""

    backend: Any
    gm: Any
    config: Any
    compile_id: str
    calls: list[_Call] = dataclasses.field(default_factory=list)  # the running one and the last ended

    def hold(self, call: _Call) -> None:
        """``call`` starts: it and the last call that ended are kept, no older one."""
        with _LOCK:
            self.calls = self.calls[-1:] + [call]

    def find(self, number: int) -> _Call | None:
        with _LOCK:
            return next((c for c in self.calls if c.number == number), None)


_LOCK = threading.Lock()
_WRITING = threading.Lock()  # one part written at a time: a rank's own failure after its answer, never under it
_GRAPHS: dict[str, _Graph] = {}  # compile id -> graph
_ANSWERED: set[tuple[str, str, int]] = set()  # (folder, compile id, call) this rank wrote a part for
_WATCHER: list[threading.Thread] = []
_FOLDERS: set[Path] = set()  # the parts folders of this rank's jobs, watched for requests


def guarded_on_rank(backend: Any, compiled: Callable, gm: Any, config: Any, writes: GraphWrites) -> Callable:
    """``compiled`` on a rank of a job: its first call through ``job_capture.first_call`` (every
    rank's part first), every later one guarded, its inputs kept for a peer's request."""

    compile_id = job_capture.last_compile_id()
    graph = _Graph(backend, gm, config, compile_id)
    state = {"calls": 0}

    # Name and doc only: copying ``__dict__`` would copy a GraphModule's module tables.
    @functools.wraps(compiled, assigned=("__module__", "__name__", "__qualname__", "__doc__"), updated=())
    def run(*args: Any) -> Any:
        ctx = job_capture.rank_context()
        if ctx is None:  # the job's group is gone (destroyed): a call of one process
            return compiled(*args)
        state["calls"] += 1
        if state["calls"] == 1:
            result = with_frame_room(job_capture.first_call, backend, compiled, gm, list(args), config, ctx)
            with _LOCK:
                _GRAPHS[compile_id] = graph
            _watch(backend, ctx)
            return result
        return _later_call(graph, compiled, writes, list(args), state["calls"], ctx)

    run.__reproarchive_compiled__ = compiled  # type: ignore[attr-defined]
    return run


def _later_call(graph: _Graph, compiled: Callable, writes: GraphWrites, args: list[Any], number: int,
                ctx: Any) -> Any:
    written = writes.of(args)
    call = _Call(number, snapshot(args, written), rng=writes.rng_before(args))
    versions = versions_of(args) if written is None else None
    graph.hold(call)
    try:
        out = compiled(*args)
    except Exception as exc:
        call.ended = "failed"
        if not is_control_flow(exc):
            if versions is not None:  # the written inputs are unknown: say which ones the call changed
                with contextlib.suppress(Exception):
                    exc.reproarchive_inputs_modified = tuple(modified_inputs(call.inputs, versions))

            def ask(folder: Path) -> None:
                with _LOCK:
                    _ANSWERED.add((str(folder), graph.compile_id, number))
                with contextlib.suppress(OSError):
                    _ask(folder, graph.compile_id, number, ctx.rank)

            with _WRITING:
                job_capture.failed(graph.backend, graph.gm, call.inputs, graph.config, exc, stage_of(exc), ctx,
                                   call=number, ask=ask, rng_states=archived_states(call.rng))
        raise
    call.ended = "passed"
    return out


def _ask(folder: Path, compile_id: str, number: int, rank: int) -> None:
    """Ask the other ranks for their part of call ``number`` of graph ``compile_id``."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{WANTED}.{rank}"
    tmp.write_text(json.dumps({"compile_id": compile_id, "call": number, "rank": rank}))
    os.replace(tmp, folder / WANTED)


def _watch(backend: Any, ctx: Any) -> None:
    """Start this process's thread that answers requests (once per process)."""

    folder, _ = job_capture.job_paths(backend.target, ctx, backend.file_target)
    with _LOCK:
        _FOLDERS.add(folder)
        if _WATCHER and _WATCHER[0].is_alive():
            return
        thread = threading.Thread(target=_answer_forever, name="reproarchive-job-calls", daemon=True)
        _WATCHER[:] = [thread]
    thread.start()


def _answer_forever() -> None:
    while True:
        time.sleep(_POLL_S)
        with _LOCK:
            folders = list(_FOLDERS)
        for folder in folders:
            with contextlib.suppress(Exception):  # never in place of the program's own run
                answer(folder)


def answer(folder: Path) -> bool:
    """Write this rank's part of the call a peer asked for in ``folder``, where this rank holds
    that call's inputs and has not written it yet; whether it wrote one."""

    path = folder / WANTED
    if not path.exists():
        return False
    wanted = json.loads(path.read_text())
    ctx = job_capture.rank_context()
    key = (str(folder), str(wanted["compile_id"]), int(wanted["call"]))
    with _LOCK:
        graph = _GRAPHS.get(key[1])
        if ctx is None or graph is None or key in _ANSWERED or int(wanted["rank"]) == ctx.rank:
            return False
        _ANSWERED.add(key)
    call = graph.find(key[2])
    with _WRITING:
        if call is None or call.ended == "failed":  # not held, or written by this rank's own guard
            return False
        status = "running" if call.ended is None else "passed"
        doing = (f"{'in' if status == 'running' else 'had ended'} call {call.number} of compile "
                 f"{graph.compile_id} when rank {wanted['rank']} failed in it")
        outcome = RankOutcome(status=status, doing=doing)
        job_capture.write_part(graph.backend, graph.gm, call.inputs, graph.config,
                               pending_crash_record(backend=graph.backend.backend_name), outcome, ctx,
                               rng_states=archived_states(call.rng))
        set_status(folder, ctx.rank, outcome)
    log.info("reproarchive: rank %d wrote its part of call %d for rank %s", ctx.rank, call.number, wanted["rank"])
    return True
