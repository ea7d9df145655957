"""Shrink a failing FX graph to the smallest graph that still fails the same way.

    gm, inputs = reproarchive.minify(gm, example_inputs, fails, max_time=None)

``fails(gm, inputs) -> bool`` is True while a candidate still fails; make it strict (same stage,
exception type and normalised message -- ``context.failure.same_failure``), or the search
will happily drift to a different, smaller failure. The result was checked by ``fails`` and is
never larger than the input.

How it differs from ``torch._functorch.fx_minifier`` (see benchmarks/README.md for numbers):
candidates are kept-node sets over the recorded original graph, valid by construction; any
value can become an input (tensors with their exact strides, ints, floats, bools, SymInts as
their hints); outputs are the frontier of the kept set, so outputs move upstream and any node
can be one; a bypass move removes nodes from the middle of a chain; delta debugging never
restarts at the coarsest granularity; and every judged candidate is memoised.

Decisions a caller should know:

* ``fails`` raising an Exception means "does not fail" (counted in ``stats.oracle_errors``).
* ``KeyboardInterrupt`` and ``max_time`` return the best graph so far (``stats.stop_reason``);
  ``on_accept`` is called on every smaller failing graph, so a checkpoint is never stale.
* the input graph must run eagerly on ``example_inputs`` (its intermediate values are recorded
  once, as PyTorch's minifier does); otherwise ``EagerRunError``. ``NotFailingError`` if
  ``fails`` is False for the input graph.
* every call of ``fails`` gets fresh copies of the inputs; intermediate values that become
  inputs are detached copies that keep ``requires_grad`` when the eager value had it.
* nodes with side effects are never dropped as dead code, and an in-place node stays while a
  kept later node reads the tensor it writes. Mutations through a *view* of a tensor are not
  tracked (documented limitation).
"""


from reproarchive.codec.graphs import op_count
from reproarchive.errors import EagerRunError, NotFailingError

from .oracle import MinifyStats, PassStats, Progress
from .search import MinifyResult, minify, minify_with_stats

__all__ = ["minify", "minify_with_stats", "MinifyResult", "MinifyStats", "PassStats", "Progress",
           "NotFailingError", "EagerRunError", "op_count"]

