"""Python's cyclic garbage collector kept off capture's own bookkeeping.

A full collection runs when the middle generation has been collected ten times and the objects
promoted to the oldest since the last full one reach a quarter of those that live there (CPython
3.11's rule), and it walks every object of the process: after Dynamo's and Inductor's imports,
0.3-0.45 s here. An object counts as promoted if it was merely alive during a younger
collection. The fake run that finds the inputs a graph writes, the drafting of the pending
archive and the config snapshot make many short-lived objects, enough young collections to
promote many of them, and so a full collection. Measured (0.4 GB of weights, eager, one graph,
two runs each): with capture, a full collection of 0.37-0.43 s came inside the fake run every
time, the first call 2.18-2.34 s against plain's 1.51-1.63 s; the plain program had none in its
first call (its came during its imports and at exit). With the collector paused around that work
none came: 1.49-1.90 s against 1.42-1.66 s (three runs).

So the collector is paused while capture does its own work and given back as it was. The
temporaries die by reference counting during the pause and never reach the oldest generation;
what outlives the pause is collected as the program's objects are. Cyclic garbage made during
the pause waits for the next collection (one analysis' worth). PyTorch does the same around its
state-dict bookkeeping (``torch.distributed.checkpoint.state_dict._gc_context``). Never around
the program's own work: the compile and the calls keep the collector as the program set it.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """The collector off for the block, back on after it where it was on before (a program
    that turned it off keeps it off; a nested pause leaves it to the outer one). The switch is
    the process's: the program's other threads run without it for the block too, and one that
    turned it off meanwhile finds it on again after it (blocks of milliseconds to a few hundred
    milliseconds per compile)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
