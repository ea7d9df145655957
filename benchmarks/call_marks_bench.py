"""Per-call cost of marking each later call of a compiled graph under ``capture --``
(``sources.capture.call_marks``: two stores into a memory-mapped file, so that a crash in the
call is named): a compiled graph called through its marking, against the same
graph called directly (the baseline), alternated in one run.

    OMP_NUM_THREADS=1 python benchmarks/call_marks_bench.py [SIZE]
"""
import os
import sys
import tempfile
from pathlib import Path

import torch

os.environ["REPROARCHIVE_CRASH_DIR"] = str(Path(tempfile.mkdtemp()) / "crash")
from alternated import median_us_per_call  # noqa: E402

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
med = median_us_per_call(variants, calls=5000)
print(f"SIZE {size}: plain {med['plain']:.2f} us, marked {med['marked']:.2f} us, "
      f"marked / plain {med['marked'] / med['plain']:.3f}x")
