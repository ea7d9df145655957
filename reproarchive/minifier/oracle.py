"""The single memoised predicate every move goes through, and the statistics it keeps.

Why one place: the memo, the time budget, Ctrl-C, progress reporting, checkpointing and the
"best so far" bookkeeping must hold for every move, including moves added later. A move only
asks "does this candidate still fail?"; it cannot call ``fails`` behind the memo's back.

Decisions (documented in the package docstring too):

* ``fails`` raising an ``Exception`` counts as "does not fail" (the candidate is rejected) and is
  counted in ``stats.oracle_errors``: a predicate that crashes on a candidate cannot vouch for
  it, and accepting it would risk drifting to a different failure.
* ``KeyboardInterrupt`` (raised by the user or from inside ``fails``) and an exhausted time budget
  stop the search; the best candidate judged failing so far is returned.
* every call gets fresh copies of the inputs, so a candidate (or ``fails``) that writes into its
  inputs cannot change what later candidates see.
* with ``jobs > 1`` a pass may hand several candidates at once (``judge_many``); they are judged
  concurrently (``fails`` must then be thread-safe: the isolated predicate, whose work happens in
  worker processes, is). Every judged candidate counts as a call, speculative ones included.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import torch.fx as fx

from reproarchive.errors import BudgetExhausted

from .candidate import Candidate, Recording, fresh_copy


@dataclass
class PassStats:
    """How a move fared: proposals, real oracle calls, memo hits, accepted (smaller and failing)."""

    tries: int = 0
    calls: int = 0
    cache_hits: int = 0
    successes: int = 0


@dataclass
class MinifyStats:
    """What a minification run did; ``as_dict()`` is msgpack-able for the archive's ``minify``."""

    calls: int = 0                 # times ``fails`` ran
    cache_hits: int = 0            # candidates answered from the memo
    accepted: int = 0              # smaller failing candidates adopted
    oracle_errors: int = 0         # ``fails`` raised (counted as "does not fail")
    initial_ops: int = 0           # call_function/method/module nodes
    final_ops: int = 0
    initial_nodes: int = 0         # all FX nodes, placeholders and output included
    final_nodes: int = 0
    initial_inputs: int = 0
    final_inputs: int = 0
    initial_input_bytes: int = 0   # bytes of tensor inputs
    final_input_bytes: int = 0
    rounds: int = 0                # fixpoint rounds over the pass list
    jobs: int = 1                  # candidates judged at once
    elapsed_s: float = 0.0
    stop_reason: str = "running"   # fixpoint | max_time | interrupted
    passes: dict[str, PassStats] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # passes in the order they last ran
    # provenance of the best graph's inputs (``Recording.input_provenance``): every checkpoint
    # written from ``on_accept`` says which of its inputs are synthetic
    inputs: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Progress:
    """Handed to the ``progress`` callback after every judged candidate (memo hits included)."""

    calls: int
    cache_hits: int
    candidate_ops: int
    best_ops: int
    pass_name: str
    elapsed_s: float
    failed: bool


class Oracle:
    def __init__(self, rec: Recording, fails: Callable[[fx.GraphModule, list], Any], *,
                 max_time: float | None, progress: Callable[[Progress], Any] | None,
                 on_accept: Callable[[fx.GraphModule, list, MinifyStats], Any] | None,
                 stats: MinifyStats, jobs: int = 1):
        self.rec = rec
        self.fails = fails
        self.started = time.monotonic()
        self.deadline = None if max_time is None else self.started + max_time
        self.progress = progress
        self.on_accept = on_accept
        self.stats = stats
        self.memo: dict[Any, bool] = {}
        self.pass_name = "sanity"
        self.best: Candidate | None = None   # None: the caller's own graph is still the best
        self.best_size: tuple[int, ...] = rec.original_size
        self.jobs = max(1, int(jobs))
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def _pass(self) -> PassStats:
        return self.stats.passes.setdefault(self.pass_name, PassStats())

    def call(self, gm: fx.GraphModule, inputs: list) -> bool:
        if self.deadline is not None and time.monotonic() > self.deadline and self.stats.calls > 0:
            raise BudgetExhausted()
        with self._lock:  # may run on pool threads
            self.stats.calls += 1
            self._pass().calls += 1
        try:
            return bool(self.fails(gm, [fresh_copy(x) for x in inputs]))
        except Exception:
            with self._lock:
                self.stats.oracle_errors += 1
            return False

    def judge(self, cand: Candidate) -> bool:
        """Does ``cand`` still fail? Adopts it as the best result when it does and is smaller."""
        return self.judge_many([cand])[0]

    def judge_many(self, cands: Sequence[Candidate]) -> list[bool]:
        """Judge several candidates, concurrently up to ``jobs``; results in the given order.

        Memo hits cost nothing; the others are built here and their ``fails`` calls run on a
        thread pool. Afterwards every failing candidate smaller than the best is adopted (the
        smallest wins), in the order given, so ``on_accept`` sees each improvement.
        """
        ps = self._pass()
        results: list[bool | None] = [None] * len(cands)
        todo: dict[Any, list[int]] = {}
        for k, cand in enumerate(cands):
            ps.tries += 1
            if cand.key in self.memo:
                results[k] = self.memo[cand.key]
                self.stats.cache_hits += 1
                ps.cache_hits += 1
            else:
                todo.setdefault(cand.key, []).append(k)
        built = {key: self.rec.build(cands[ks[0]]) for key, ks in todo.items()}
        if len(built) > 1 and self.jobs > 1:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(self.jobs, thread_name_prefix="reproarchive-minify")
            futures = {key: self._pool.submit(self.call, *built[key]) for key in built}
            answers = {}
            try:
                for key, fut in futures.items():
                    answers[key] = fut.result()
            except BaseException:
                for fut in futures.values():
                    fut.cancel()
                raise
        else:
            answers = {key: self.call(*built[key]) for key in built}
        for key, failed in answers.items():
            self.memo[key] = failed
            for k in todo[key]:
                results[k] = failed
        for k, cand in enumerate(cands):
            failed = bool(results[k])
            if cand.key in answers and failed and cand.size < self.best_size:
                self.best, self.best_size = cand, cand.size
                self.stats.accepted += 1
                self.stats.inputs = self.rec.input_provenance(cand)
                ps.successes += 1
                if self.on_accept is not None:
                    gm, inputs = built[cand.key]
                    self.on_accept(gm, list(inputs), self.stats)
            if self.progress is not None:
                self.progress(Progress(self.stats.calls, self.stats.cache_hits, len(cand.live), self.best_size[0],
                                       self.pass_name, time.monotonic() - self.started, failed))
        return [bool(r) for r in results]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
