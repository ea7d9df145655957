"""Build the golden test vectors of spec/FORMAT.md §10.

    python spec/vectors/make_vectors.py [--check]

Writes ``<name>-<version>.tar.zst`` files and ``vectors.json`` (what a reader must get back from
each). Values come from arange/linspace arithmetic, not random generators, so they are the same
on every torch version and platform. Existing vectors of older versions are never rewritten:
``--check`` only reports whether the current writer still produces identical bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import operator
import sys
from pathlib import Path

import torch
import torch.fx as fx

from reproarchive.format.schema import FORMAT_VERSION as VERSION

HERE = Path(__file__).resolve().parent


def _graph(n_inputs: int, body) -> fx.GraphModule:
    g = fx.Graph()
    xs = [g.placeholder(f"in{i}") for i in range(n_inputs)]
    g.output(body(g, xs))
    return fx.GraphModule(torch.nn.Module(), g)


def basic():
    """Aliasing views, a non-leaf input, a zero storage, equal-content storages, scalars."""
    base = torch.linspace(-2.0, 2.0, 24, dtype=torch.float32)
    base[3] = -0.0
    base[5] = float("nan")
    view_a = base[2:14].view(3, 4)
    view_b = base.view(4, 6).t()  # non-contiguous view of the same storage
    leaf = torch.arange(6, dtype=torch.float64).requires_grad_(True)
    nonleaf = leaf * 2
    zeros = torch.zeros(16, dtype=torch.int64)
    twin_a = torch.arange(8, dtype=torch.int32)
    twin_b = torch.arange(8, dtype=torch.int32)  # same bytes, different storage
    mask = torch.tensor([True, False, True, True])
    inputs = [view_a, view_b, nonleaf, zeros, twin_a, twin_b, mask, 3, 0.5, True, None, (7, 2.5)]

    def body(g, xs):
        relu = g.call_function(torch.relu, (xs[0],))
        s = g.call_function(operator.add, (relu, xs[8]))
        t = g.call_method("sum", (xs[1],), {"dim": 0})
        u = g.call_function(torch.ops.aten.add.Tensor, (xs[4], xs[5]))
        v = g.call_function(operator.mul, (u, xs[7]))
        w = g.call_function(torch.where, (xs[6], xs[6], xs[6]))
        return (s, t, v, w, xs[3], xs[2])

    return _graph(len(inputs), body), inputs


def dtypes():
    """One input per storable dtype, with bit patterns that catch byte-order and width bugs."""
    raw = torch.arange(64, dtype=torch.uint8) * 37 % 251
    inputs = []
    names = []
    from reproarchive.codec.tensors import DTYPES

    for name in sorted(DTYPES):
        dt = DTYPES[name]
        size = dt.itemsize
        n = 64 // size
        t = raw[: n * size].clone().view(dt) if size else None
        if t is None:
            continue
        inputs.append(t)
        names.append(name)
    return _graph(len(inputs), lambda g, xs: tuple(xs)), inputs


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        self.bn = torch.nn.BatchNorm1d(3)
        with torch.no_grad():
            self.lin.weight.copy_(torch.linspace(-1, 1, 12).view(3, 4))
            self.lin.bias.copy_(torch.tensor([0.5, -0.25, 0.125]))
        self.register_buffer("scale", torch.full((3,), 2.0))
        self.bn.eval()

    def forward(self, x):
        return self.bn(self.lin(x)) * self.scale


def module():
    """call_module (nn.Linear, nn.BatchNorm1d rebuilt without their constructors) and get_attr."""
    gm = fx.symbolic_trace(_Net())
    return gm, [torch.linspace(0, 1, 8).view(2, 4)]


def absent():
    """An input whose data the source never had."""
    from reproarchive.codec.tensors import AbsentTensor

    gm = _graph(2, lambda g, xs: (g.call_function(operator.add, (xs[0], xs[1])),))
    return gm, [AbsentTensor((2, 3), torch.float32), torch.ones(2, 3)]


def stored():
    """Large data frames: one that zstd cannot shrink (stored in raw blocks) and one it can.

    The incompressible bytes are sha256 in counter mode: no random generator, the same bytes
    everywhere. Both inputs fill one 320 KiB frame, above the size from which the writer
    probes frames (format/frames.py).
    """
    import hashlib

    n = 320 << 10
    noise = b"".join(hashlib.sha256(i.to_bytes(8, "little")).digest() for i in range(n // 32))
    noise_t = torch.frombuffer(bytearray(noise), dtype=torch.uint8)
    ramp = torch.arange(n // 8, dtype=torch.int64) % 1000
    return _graph(2, lambda g, xs: (xs[0], g.call_function(operator.add, (xs[1], 1)))), [noise_t, ramp]


def rng():
    """(1.3) A graph that draws random numbers, and the CPU generator state it starts from
    (``torch.Generator().manual_seed(2024)``: the same bytes everywhere); ``rand_like`` draws
    with the generator alone (no vector library), so its values are the same on every CPU."""
    def body(g, xs):
        return (g.call_function(operator.add, (xs[0], g.call_function(torch.rand_like, (xs[0],)))),)

    state = torch.Generator().manual_seed(2024).get_state()
    return _graph(1, body), [torch.arange(6, dtype=torch.float32).view(2, 3)], {"cpu": state}


CASES = {"basic": basic, "dtypes": dtypes, "module": module, "absent": absent, "stored": stored, "rng": rng}
RECORDS = {
    "failure": {"stage": "compile", "exception_type": "RuntimeError", "message": "golden vector",
                "traceback": "", "signature": "compile|RuntimeError|golden vector", "backend": "eager",
                "accuracy": None},
    "system": {"note": "golden vector"},
    # 1.2: a typed source (§8); the key it does not declare stays in the record as written
    "source": {"kind": "capture", "stage": "compile", "fwd_only": False, "note": "golden vector"},
}


def tensor_facts(t: torch.Tensor) -> dict:
    data = (t.detach().contiguous().view(torch.uint8) if t.numel() and t.dtype.itemsize
            else torch.empty(0, dtype=torch.uint8))
    return {
        "dtype": str(t.dtype).removeprefix("torch."),
        "shape": list(t.shape),
        "stride": list(t.stride()),
        "offset": t.storage_offset(),
        "requires_grad": t.requires_grad,
        "is_leaf": t.is_leaf,
        "sha256": hashlib.sha256(bytes(data.flatten().tolist())).hexdigest(),
    }


def value_facts(v):
    if isinstance(v, torch.Tensor):
        return tensor_facts(v)
    if isinstance(v, (tuple, list)):
        return [value_facts(x) for x in v]
    return {"value": v}


def build(name: str, path: Path) -> dict:
    import reproarchive

    gm, inputs, *states = CASES[name]()
    reproarchive.pack(gm, inputs, path, backend="eager", snapshot=False, rng_states=states[0] if states else None,
                      **RECORDS)
    return expectations(name, path)


def expectations(name: str, path: Path) -> dict:
    import reproarchive

    repro = reproarchive.load(path)
    facts = {
        "file_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "index_digest": repro.digest,
        "fidelity": repro.fidelity,
        "inputs": [value_facts(a) if f != "absent" else {"absent": True} for a, f in zip(repro.args, repro.fidelity)],
        "storage_aliases": _aliases(repro.args),
    }
    if "absent" not in repro.fidelity:
        from reproarchive.codec.rng import restore_rng

        with torch.random.fork_rng(devices=[]):
            restore_rng(repro.rng_states)  # (1.3) the recorded generator state, where there is one
            out = repro.gm(*repro.args)
        facts["outputs"] = [output_facts(o) for o in (out if isinstance(out, tuple) else [out])]
    return facts


def output_facts(t) -> dict:
    """What running a vector's graph gives: the values, not their bytes.

    A graph's outputs are computed, and matrix kernels round differently on different CPUs
    (AVX2, AVX-512, AMX), so floating-point ones are compared with a tolerance; other dtypes
    (integers, bits, complex) keep their exact digest."""
    facts = value_facts(t)
    if not isinstance(t, torch.Tensor) or t.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        return facts
    del facts["sha256"]
    return dict(facts, values=t.detach().double().flatten().tolist())


def _aliases(args) -> list[list[int]]:
    """Groups of input positions sharing one storage (what aliasing must preserve)."""
    groups: dict[int, list[int]] = {}
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            groups.setdefault(a.untyped_storage()._cdata, []).append(i)
    return sorted(g for g in groups.values() if len(g) > 1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="rebuild into a temp dir and compare bytes")
    opts = parser.parse_args(argv)
    manifest_path = HERE / "vectors.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    if opts.check:
        import tempfile

        ok = True
        with tempfile.TemporaryDirectory() as tmp:
            for name in CASES:
                fname = f"{name}-{VERSION}.tar.zst"
                out = Path(tmp) / fname
                build(name, out)
                same = (HERE / fname).exists() and out.read_bytes() == (HERE / fname).read_bytes()
                print(f"{fname}: {'identical' if same else 'DIFFERENT'}")
                ok &= same
        return 0 if ok else 1
    for name in CASES:
        fname = f"{name}-{VERSION}.tar.zst"
        if fname in manifest and (HERE / fname).exists():
            print(f"{fname}: exists, kept")
            continue
        manifest[fname] = build(name, HERE / fname)
        import zstandard

        manifest[fname]["zstd_library"] = ".".join(map(str, zstandard.ZSTD_VERSION))
        manifest[fname]["format"] = VERSION
        print(f"{fname}: written")
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
