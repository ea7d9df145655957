"""Per-call cost of marking each later call of a compiled graph under ``capture --``
(``sources.capture.call_marks``: two stores into a memory-mapped file, so that a crash in the
call is named): a compiled graph called through its marking, against the same
graph called directly (the baseline), alternated in one run.

    OMP_NUM_THREADS=1 python benchmarks/call_marks_bench.py [SIZE]
"""
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

os.environ["REPROARCHIVE_CRASH_DIR"] = str(Path(tempfile.mkdtemp()) / "crash")
from reproarchive.sources.capture import call_marks  # noqa: E402 - after the folder above is set


def f(x):
    return torch.relu(x) * 2 + 1


size = int(sys.argv[1]) if len(sys.argv) > 1 else 64
x = torch.randn(size, size)
compiled = torch.compile(f, backend="eager")
marker = call_marks.Marker(Path(os.environ["REPROARCHIVE_CRASH_DIR"]).parent / call_marks.MARKS_DIR, "[0/0]")
variants = {"plain": lambda: compiled(x), "marked": lambda: call_marks.marked(compiled, (x,), {}, marker, 2)}
for fn in variants.values():
    for _ in range(200):
        fn()
N = 5000
times = {k: [] for k in variants}
for _ in range(7):
    for name, fn in variants.items():
        t = time.perf_counter()
        for _ in range(N):
            fn()
        times[name].append((time.perf_counter() - t) / N * 1e6)
med = {k: statistics.median(v) for k, v in times.items()}
print(f"SIZE {size}: plain {med['plain']:.2f} us, marked {med['marked']:.2f} us, "
      f"marked / plain {med['marked'] / med['plain']:.3f}x")
