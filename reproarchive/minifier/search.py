"""The fixpoint loop: run the passes until a full round makes nothing smaller.

Structured like Hypothesis' shrinker: independent passes, one memoised oracle, per-pass
statistics. The loop never restarts a pass at its coarsest granularity after a success (the
passes continue where they are), and because every judged candidate is memoised, re-running a
pass in a later round only pays for candidates that the previous round made possible.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch.fx as fx

from reproarchive.codec.graphs import op_count
from reproarchive.errors import NotFailingError

from .candidate import Recording
from .oracle import BudgetExhausted, MinifyStats, Oracle, Progress
from .passes import PASSES, Shrinker, prune


@dataclass
class MinifyResult:
    """The smallest failing graph found, its inputs, and what it took to get there.

    ``inputs`` holds the caller's own objects for original inputs and private copies (detached,
    same strides) of the intermediate values that became inputs, in placeholder order;
    ``input_origins`` says which is which (an archive stores the latter as real tensors).
    """

    gm: fx.GraphModule
    inputs: list
    stats: MinifyStats
    input_origins: list[str]  # per input: "input:<position in example_inputs>" or "node:<original node name>"

    def __iter__(self):  # ``gm, inputs = minify_with_stats(...)`` reads like ``minify``
        return iter((self.gm, self.inputs))


def minify_with_stats(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    fails: Callable[[fx.GraphModule, list], Any],
    *,
    max_time: float | None = None,
    progress: Callable[[Progress], Any] | None = None,
    on_accept: Callable[[fx.GraphModule, list, MinifyStats], Any] | None = None,
    max_rounds: int = 20,
) -> MinifyResult:
    """Shrink ``gm`` while ``fails(candidate_gm, candidate_inputs)`` stays True.

    ``progress`` is called after every judged candidate with a ``Progress``; ``on_accept`` is
    called with (gm, inputs, stats) every time a smaller failing graph is found -- write the
    checkpoint there. ``max_time`` (seconds) and ``KeyboardInterrupt`` stop the search and return
    the best graph so far; ``stats.stop_reason`` says which. The input graph itself is checked
    first (one call) and ``NotFailingError`` is raised if it does not fail.
    """
    started = time.monotonic()
    rec = Recording(gm, example_inputs)
    stats = MinifyStats(initial_ops=rec.original_size[0], initial_nodes=len(rec.nodes),
                        initial_inputs=rec.original_size[1])
    oracle = Oracle(rec, fails, max_time=max_time, progress=progress, on_accept=on_accept, stats=stats)
    # Ctrl-C here propagates: nothing has been judged, so there is no result to keep.
    if not oracle.call(gm, rec.example_inputs):
        raise NotFailingError("the graph does not fail with these inputs (fails() returned False)",
                              "check the predicate, or replay the archive to see whether it still fails here")
    shrinker = Shrinker(rec, oracle, rec.start())
    try:
        oracle.pass_name = "prune"
        prune(shrinker)
        while stats.rounds < max_rounds:
            stats.rounds += 1
            before = shrinker.current.size
            for name, run in PASSES:
                oracle.pass_name = name
                run(shrinker)
            if shrinker.current.size >= before:
                break
        stats.stop_reason = "fixpoint"
    except BudgetExhausted:
        stats.stop_reason = "max_time"
    except KeyboardInterrupt:
        stats.stop_reason = "interrupted"

    if oracle.best is None:
        out_gm, out_inputs = gm, list(example_inputs)
        origins = [f"input:{i}" for i in range(len(out_inputs))]
    else:
        out_gm, out_inputs = rec.build(oracle.best)
        origins = rec.input_origins(oracle.best)
    stats.final_ops = op_count(out_gm)
    stats.final_nodes = len(out_gm.graph.nodes)
    stats.final_inputs = len(out_inputs)
    stats.elapsed_s = time.monotonic() - started
    return MinifyResult(out_gm, out_inputs, stats, origins)


def minify(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    fails: Callable[[fx.GraphModule, list], Any],
    *,
    max_time: float | None = None,
    progress: Callable[[Progress], Any] | None = None,
    on_accept: Callable[[fx.GraphModule, list, MinifyStats], Any] | None = None,
) -> tuple[fx.GraphModule, list]:
    """The smallest graph found that still fails, and its inputs (see ``minify_with_stats``)."""
    result = minify_with_stats(gm, example_inputs, fails, max_time=max_time, progress=progress,
                               on_accept=on_accept)
    return result.gm, result.inputs
