"""Per-compile cost of noting the guards Dynamo made when the backend is entered (spec §8
``shapes.entry``, ``codec.shape_guards.note_entry``): a ``dynamic=True`` compile under capture as
it is, against the same capture with the note turned off (the baseline), alternated in one run.
A compile from scratch each time (Dynamo reset; Inductor's caches warm after the first round, the
setting where the note weighs most).

    OMP_NUM_THREADS=1 python benchmarks/entry_note_bench.py [inductor|eager] [ROUNDS]
"""
import statistics
import sys
import tempfile
import time

import torch

import reproarchive
from reproarchive.sources.capture import capture_backend

lin = torch.nn.Linear(64, 64)


def f(x, y):
    h = lin(x)
    for _ in range(20):
        h = torch.relu(h) * 2 + y.sum()
    return h


backend = sys.argv[1] if len(sys.argv) > 1 else "inductor"
x, y = torch.randn(8, 64), torch.randn(5, 3)
folder = tempfile.mkdtemp()
real_note = capture_backend.note_entry
times = {"capture": [], "capture-no-note": []}
for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 7):
    for name in times:
        capture_backend.note_entry = real_note if name == "capture" else (lambda gm: None)
        torch._dynamo.reset()
        fn = torch.compile(f, backend=reproarchive.capture(backend, path=folder), dynamic=True)
        t = time.perf_counter()
        fn(x, y)
        times[name].append((time.perf_counter() - t) * 1e3)
capture_backend.note_entry = real_note
med = {k: statistics.median(v) for k, v in times.items()}
print(f"{backend}: " + ", ".join(f"{k} {v:.1f} ms/compile" for k, v in med.items())
      + f"; capture/no-note {med['capture'] / med['capture-no-note']:.3f}x")
