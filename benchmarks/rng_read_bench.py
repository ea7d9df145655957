"""Per-call cost of reading the generator states before each call of a compiled graph that draws
(what capture does so that a later call's archive holds the states it started from): capture as it
is, against capture with that read turned off, and plain inductor, alternated in one run.

    OMP_NUM_THREADS=1 python benchmarks/rng_read_bench.py [SIZE]
"""
import sys
import tempfile

import torch
from alternated import median_us_per_call

import reproarchive
from reproarchive.sources.capture import call_guard


def f(x):
    return torch.nn.functional.dropout(torch.relu(x), 0.5, training=True) * 2

size = int(sys.argv[1]) if len(sys.argv) > 1 else 64
x = torch.randn(size, size)
folder = tempfile.mkdtemp()
real_rule = call_guard.draws_random
variants = {}
for name in ("plain", "capture", "capture-no-rng-read"):
    torch._dynamo.reset()
    call_guard.draws_random = (lambda gm: False) if name == "capture-no-rng-read" else real_rule
    backend = "inductor" if name == "plain" else reproarchive.capture("inductor", path=folder)
    fn = torch.compile(f, backend=backend)
    for _ in range(50):
        fn(x)
    variants[name] = fn
call_guard.draws_random = real_rule
med = median_us_per_call({name: (lambda fn=fn: fn(x)) for name, fn in variants.items()}, calls=3000)
ratios = (f"capture/no-read {med['capture'] / med['capture-no-rng-read']:.3f}x, "
          f"capture/plain {med['capture'] / med['plain']:.3f}x")
print(f"size {size}: " + ", ".join(f"{k} {v:.1f} us/call" for k, v in med.items()) + "; " + ratios)
