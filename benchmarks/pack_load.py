"""Pack and load side by side with what users run today.

    python benchmarks/pack_load.py                 # 1 GiB of inputs, every variant once
    python benchmarks/pack_load.py --gib 1 --cores 1   # every process pinned to one core
    python benchmarks/pack_load.py --gib 1 --cores 2   # ... to two
    python benchmarks/pack_load.py --gib 1 --busy --cores 1,2 --only pack --repeat 5
                                                   # shared cores: a busy loop on every core
    python benchmarks/pack_load.py --mib 16 --json # small run, JSON report
    python benchmarks/pack_load.py --only pack,load --byteshuffle   # a subset, plus the shuffle measurement

Builds a GraphModule whose inputs look like a model's: fp32 and bf16 weights, int64 indices,
a zero-filled buffer, two views of one storage, one tensor passed twice and one tensor whose
bytes repeat another's. The same inputs (same seed) are then written and read by

  reproarchive       pack (sha256 and blake3; and with every frame compressed, min_saving=0),
                     verify, load, read_input of one tensor; and "first-touch": fresh memory for
                     every storage load returns, faulted in as load does it (what any loader pays)
  contentstore+tar   torch.utils._content_store.ContentStoreWriter(stable_hash=True), then
                     `tar -I zstd -cf` (what PyTorch's repro dumps give users today); load is
                     `tar -I zstd -xf` + ContentStoreReader; one tensor is two `tar -x --occurrence`
  torch.save+zstd    torch.save of all inputs, then the `zstd` CLI; load is `zstd -d` + torch.load

Each measurement runs in a fresh child process that first builds the inputs (or imports what
it needs, and pays one-time import costs with a tiny warm-up), then resets the kernel's
peak-RSS mark (``/proc/self/clear_refs`` = 5), runs the operation and reads ``VmHWM`` back.
"Extra memory" is that peak minus the RSS just before the operation; for loads the bytes of
the loaded storages are subtracted as well, so the number is what the operation needed beyond
its result. Tools run as subprocesses (tar, zstd) are reported separately, by ``/usr/bin/time
-f %M`` (``getrusage(RUSAGE_CHILDREN)`` cannot be used: exec hands a child the parent's RSS
high-water mark). Every output file is fsync'ed inside the timed region (reproarchive's pack
does that itself), so all writers pay for durability. Reads follow the writes, so files are
mostly in the page cache; reproarchive's pack writes past the page cache, so of our readers
only verify (which runs first) reads from the disk.

GB/s is 10^9 bytes of distinct input storage per second (the same figure for every variant).
CPU s is user + system time of the child and of the tools it waited for; CPU s/GiB divides it
by the GiB of distinct input storage, so rows compare whatever the parallelism.

``--cores N`` pins every child, and so every tool it starts (tar, zstd), to the first N cores
this process may use (its threads then size themselves to N); ``--cores 1,2`` runs each
variant at each count, interleaved run by run so both see the same machine. ``--busy`` adds a
competing load for the length of the run: one busy-looping process pinned to each core.
The machine's load average is recorded before and after: numbers on a shared box are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

ONE_TENSOR = "w_fp32_16"  # read back alone; one "unit" (total/64) of fp32 weights
UNITS = 64


# --------------------------------------------------------------------------------------------
# inputs


def build_inputs(total: int, seed: int = 0):
    """(gm, names, inputs) of about ``total`` bytes of distinct storage, in units of total/64.

    29 units of fp32 weights (randn * 0.02, one tensor per unit), 12 of bf16 weights, 6 of
    int64 indices, 4 of zeros, 4 in one storage seen through two views, 3 in one tensor passed
    twice, and 3 + 3 in a tensor and its copy (two storages, same bytes). Deterministic for a
    given seed.
    """
    import torch
    import torch.fx as fx

    unit = max(4096, (total // UNITS) // 4096 * 4096)
    cols = 1024 if unit >= 4096 * 64 else 256
    g = torch.Generator().manual_seed(seed)

    def randn(nbytes: int, dtype) -> torch.Tensor:
        n = nbytes // dtype.itemsize
        return (torch.randn(n // cols, cols, generator=g) * 0.02).to(dtype)

    named: list[tuple[str, torch.Tensor]] = []
    for i in range(29):
        named.append((f"w_fp32_{i}", randn(unit, torch.float32)))
    for i in range(12):
        named.append((f"w_bf16_{i}", randn(unit, torch.bfloat16)))
    for i in range(6):
        n = unit // 8
        named.append((f"idx_{i}", torch.randint(0, 32000, (n,), generator=g, dtype=torch.int64)))
    named.append(("zero_buf", torch.zeros(4 * unit // 4, dtype=torch.float32)))
    base = randn(4 * unit, torch.float32)
    rows = base.shape[0]
    named.append(("view_top", base[: rows // 2]))
    named.append(("view_t", base[rows // 4 :].t()))
    twice = randn(3 * unit, torch.float32)
    named.append(("twice_a", twice))
    named.append(("twice_b", twice))
    same = randn(3 * unit, torch.float32)
    named.append(("same_bytes", same))
    named.append(("same_bytes_copy", same.clone()))

    graph = fx.Graph()
    outs = []
    for name, _ in named:
        p = graph.placeholder(name)
        outs.append(graph.call_function(torch.sum, (p,)))
    graph.output(tuple(outs))
    gm = fx.GraphModule(torch.nn.Module(), graph)
    return gm, [n for n, _ in named], [t for _, t in named]


def distinct_bytes(tensors) -> int:
    seen = {}
    for t in tensors:
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def storage_bytes(storage) -> bytes:
    import torch

    return bytes(_bytes_view(torch.empty(0, dtype=torch.uint8).set_(storage)))


def _bytes_view(t) -> memoryview:
    """Zero-copy bytes of a contiguous CPU tensor (no numpy needed)."""
    import ctypes

    n = t.numel() * t.element_size()
    if n == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_char * n).from_address(t.data_ptr())).cast("B")


def same_bits(a, b) -> bool:
    """Bit-exact equality of values and view metadata (NaN payloads and -0.0 included)."""
    import torch

    if a.dtype != b.dtype or a.shape != b.shape or a.stride() != b.stride() or a.storage_offset() != b.storage_offset():
        return False
    sa, sb = a.untyped_storage(), b.untyped_storage()
    if sa.nbytes() != sb.nbytes():
        return False
    ua = torch.empty(0, dtype=torch.uint8).set_(sa)
    ub = torch.empty(0, dtype=torch.uint8).set_(sb)
    return bool(torch.equal(ua, ub))


# --------------------------------------------------------------------------------------------
# measuring inside a child


def _status() -> dict[str, int]:
    text = open("/proc/self/status").read()
    return {k: int(re.search(rf"{k}:\s+(\d+)", text).group(1)) * 1024 for k in ("VmRSS", "VmHWM")}


class Meter:
    """Peak RSS of this process during a block, relative to its RSS at the start."""

    def __enter__(self):
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.resettable = True
        except OSError:
            self.resettable = False
        self.rss0 = _status()["VmRSS"]
        _TOOL_PEAKS.clear()
        self.cpu0 = _cpu()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t0
        self.cpu_seconds = _cpu() - self.cpu0
        st = _status()
        self.peak_extra = st["VmHWM"] - self.rss0 if self.resettable else None
        self.tool_peak = max(_TOOL_PEAKS) if _TOOL_PEAKS else None


def _cpu() -> float:
    """CPU seconds (user + system) of this process and of the tools it waited for."""
    import resource

    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        total += r.ru_utime + r.ru_stime
    return total


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_TOOL_PEAKS: list[int] = []


def _sh(cmd: list[str]) -> None:
    """Run a tool; note its peak RSS (with tools it starts) via /usr/bin/time when present.

    getrusage(RUSAGE_CHILDREN) of a big process is useless here: exec records the parent's
    high-water mark for the child, so every child looks as large as this process.
    """
    if os.path.exists("/usr/bin/time"):
        fd, log = tempfile.mkstemp(prefix="time-", suffix=".txt")
        os.close(fd)
        try:
            subprocess.run(["/usr/bin/time", "-f", "%M", "-o", log] + cmd, check=True, stdout=subprocess.DEVNULL)
            _TOOL_PEAKS.append(int(open(log).read().split()[-1]) * 1024)
        finally:
            os.unlink(log)
    else:
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def _storage_bytes(values) -> int:
    import torch

    return distinct_bytes([v for v in values if isinstance(v, torch.Tensor)])


def _byteshuffle(total: int) -> dict:
    """Measurement only (not in the format): zstd level 1 on byte planes vs on raw bytes.

    Each weight's bytes are split into planes (all first bytes, then all second bytes, ...),
    as blosc's shuffle does, and compressed in 4 MiB frames like the archive's data frames.
    The split is a torch transpose-copy (numpy's is ~2x faster; neither is a SIMD shuffle).
    """
    import torch
    import zstandard

    _, names, inputs = build_inputs(total)
    frame = 4 << 20
    rows = {}
    for kind in ("w_fp32_", "w_bf16_"):
        tensors = [t for n, t in zip(names, inputs) if n.startswith(kind)]
        k = tensors[0].element_size()
        raw_bytes = raw_out = planes_out = 0
        t_raw = t_split = t_planes = 0.0
        cctx = zstandard.ZstdCompressor(level=1)
        for t in tensors:
            u8 = t.contiguous().view(torch.uint8).reshape(-1)
            a = _bytes_view(u8)
            raw_bytes += len(a)
            t0 = time.perf_counter()
            raw_out += sum(len(cctx.compress(a[i : i + frame])) for i in range(0, len(a), frame))
            t1 = time.perf_counter()
            planes = u8.view(-1, k).t().contiguous()  # plane j = byte j of every element
            t2 = time.perf_counter()
            flat = _bytes_view(planes)
            planes_out += sum(len(cctx.compress(flat[i : i + frame])) for i in range(0, len(flat), frame))
            t3 = time.perf_counter()
            t_raw += t1 - t0
            t_split += t2 - t1
            t_planes += t3 - t2
            del flat, planes
        rows[kind.strip("_")] = {
            "bytes": raw_bytes,
            "ratio_raw": raw_out / raw_bytes,
            "ratio_byteshuffle": planes_out / raw_bytes,
            "size_change": planes_out / raw_out - 1,
            "gb_per_s_raw": raw_bytes / t_raw / 1e9,
            "gb_per_s_shuffle_then_zstd": raw_bytes / (t_split + t_planes) / 1e9,
            "gb_per_s_shuffle_only": raw_bytes / t_split / 1e9,
        }
    return {"byteshuffle": rows, "seconds": 0.0, "peak_extra": None, "tool_peak": None}


def _warm_up(work: str, algo: str) -> float:
    """Pay one-time costs outside the timing: the first FX code generation imports
    torch.distributed.tensor and sympy (~2 s here), and the first load builds a GraphModule."""
    import reproarchive as ra

    t0 = time.perf_counter()
    gm, names, inputs = build_inputs(0, seed=1)
    path = os.path.join(work, f"warm-up-{os.getpid()}.tar.zst")
    ra.pack(gm, inputs, path, digest=algo, progress=False, snapshot=False)
    ra.load(path, progress=False)
    ra.read_input(path, names[0])
    ra.verify(path, progress=False)
    os.unlink(path)
    return time.perf_counter() - t0


def child(variant: str, total: int, work: str) -> dict:
    import torch

    import reproarchive as ra

    archive = os.path.join(work, "repro.tar.zst")
    cs_tar = os.path.join(work, "contentstore.tar.zst")
    ts_file = os.path.join(work, "inputs.pt")
    out: dict[str, Any] = {"variant": variant}
    if not variant.startswith(("contentstore", "torchsave")):
        out["warmup_seconds"] = _warm_up(work, "blake3" if variant == "pack-blake3" else "sha256")
    elif variant == "contentstore-pack":
        import torch._dynamo  # noqa: F401  (hash_storage imports it; paid before timing, in the baseline's favour)

    if variant in ("pack", "pack-blake3", "pack-compress-all", "contentstore-pack", "torchsave-pack"):
        gm, names, inputs = build_inputs(total)
        out["input_bytes"] = distinct_bytes(inputs)
        # Every writer writes a new file: freeing a previous run's output (with online discard,
        # a second or more for 1 GiB) happens here, not inside the timed region.
        outputs = {"pack": [archive], "pack-blake3": [archive + ".b3"], "pack-compress-all": [archive + ".all"],
                   "contentstore-pack": [cs_tar], "torchsave-pack": [ts_file, ts_file + ".zst"]}[variant]
        removed = [os.unlink(old) for old in outputs if os.path.exists(old)]
        if removed:
            os.sync()
        if variant.startswith("pack"):
            algo = "blake3" if variant == "pack-blake3" else "sha256"
            target = {"pack": archive, "pack-blake3": archive + ".b3", "pack-compress-all": archive + ".all"}[variant]
            options = {"min_saving": 0.0} if variant == "pack-compress-all" else {}
            with Meter() as m:
                ra.pack(gm, inputs, target, digest=algo, progress=False, snapshot=False, **options)
            out["file_bytes"] = os.path.getsize(target)
            with open(target, "rb") as f:
                import hashlib

                out["file_sha256"] = hashlib.file_digest(f, "sha256").hexdigest()
            from reproarchive.format.reader import ContainerReader

            index = ContainerReader(target).index
            blobs = [m for m in index.container.members if m.name.startswith("blobs/")]
            out["storages"] = len(index.storages)
            out["blobs"] = len(blobs)
            out["zero_filled"] = sum(1 for r in index.storages if r.fill == 0)
            out["stored_bytes"] = sum(m.size for m in blobs)
            out["inputs_sharing_a_storage"] = len(index.inputs) - len({r.storage for r in index.inputs})
        elif variant == "contentstore-pack":
            from torch.utils._content_store import ContentStoreWriter

            store = os.path.join(work, "contentstore")
            shutil.rmtree(store, ignore_errors=True)
            with Meter() as m:
                w = ContentStoreWriter(store, stable_hash=True)
                for name, t in zip(names, inputs):
                    w.write_tensor(name, t)
                t_store = time.perf_counter() - m.t0
                _sh(["tar", "-I", "zstd", "-cf", cs_tar, "-C", store, "."])
                _fsync(cs_tar)
            out["store_seconds"] = t_store
            out["file_bytes"] = os.path.getsize(cs_tar)
            shutil.rmtree(store, ignore_errors=True)
        else:
            with Meter() as m:
                torch.save(dict(zip(names, inputs)), ts_file)
                _sh(["zstd", "-q", "-f", "--rm", ts_file])
                _fsync(ts_file + ".zst")
            out["file_bytes"] = os.path.getsize(ts_file + ".zst")
    elif variant == "byteshuffle":
        out.update(_byteshuffle(total))
        return out
    else:
        check: list = []
        if variant == "load":
            with Meter() as m:
                repro = ra.load(archive, progress=False)
            loaded = dict(zip([n.name for n in repro.gm.graph.nodes if n.op == "placeholder"], repro.args))
            result_bytes = _storage_bytes(repro.args)
            check = [loaded]
        elif variant == "verify":
            with Meter() as m:
                report = ra.verify(archive, progress=False)
            out["blobs"] = report.blobs
            result_bytes = 0
        elif variant == "read-one":
            with Meter() as m:
                t = ra.read_input(archive, ONE_TENSOR)
            result_bytes = _storage_bytes([t])
            check = [{ONE_TENSOR: t}]
        elif variant == "first-touch":
            # What any loader pays before it writes a byte: fresh memory for every storage the
            # load returns, faulted in the way load does it (one populate call per storage).
            from reproarchive.format.prefault import prefault
            from reproarchive.format.reader import ContainerReader

            with ContainerReader(archive) as reader:
                sizes = [r.size for r in reader.index.storages]
            with Meter() as m:
                fresh = [torch.empty(n, dtype=torch.uint8) for n in sizes]
                for t in fresh:
                    prefault(t.data_ptr(), t.numel())
            result_bytes = sum(sizes)
        elif variant == "contentstore-load":
            from torch.utils._content_store import ContentStoreReader

            store = os.path.join(work, "cs-extract")
            shutil.rmtree(store, ignore_errors=True)
            os.makedirs(store)
            with Meter() as m:
                _sh(["tar", "-I", "zstd", "-xf", cs_tar, "-C", store])
                reader = ContentStoreReader(store)
                names = sorted(os.listdir(os.path.join(store, "tensors")))
                loaded = {n: reader.read_tensor(n) for n in names}
            result_bytes = _storage_bytes(list(loaded.values()))
            check = [loaded]
            shutil.rmtree(store, ignore_errors=True)
        elif variant == "contentstore-read-one":
            from torch.utils._content_store import ContentStoreReader

            store = os.path.join(work, "cs-one")
            shutil.rmtree(store, ignore_errors=True)
            os.makedirs(store)
            with Meter() as m:
                _sh(["tar", "-I", "zstd", "-xf", cs_tar, "-C", store, "--occurrence=1", f"./tensors/{ONE_TENSOR}"])
                reader = ContentStoreReader(store)
                h = reader.read_tensor_metadata(ONE_TENSOR)[1]
                _sh(["tar", "-I", "zstd", "-xf", cs_tar, "-C", store, "--occurrence=1", f"./storages/{h}"])
                t = reader.read_tensor(ONE_TENSOR)
            result_bytes = _storage_bytes([t])
            check = [{ONE_TENSOR: t}]
            shutil.rmtree(store, ignore_errors=True)
        elif variant == "torchsave-load":
            with Meter() as m:
                _sh(["zstd", "-q", "-d", "-f", ts_file + ".zst", "-o", ts_file])
                loaded = torch.load(ts_file, weights_only=True)
            os.unlink(ts_file)
            result_bytes = _storage_bytes(list(loaded.values()))
            check = [loaded]
        else:
            raise SystemExit(f"unknown variant {variant}")
        if m.peak_extra is not None:
            out["peak_extra_gross"] = m.peak_extra
            m.peak_extra -= result_bytes
        out["result_bytes"] = result_bytes
        if check:
            _, names, inputs = build_inputs(total)
            original = dict(zip(names, inputs))
            got = check[0]
            out["bit_exact"] = all(same_bits(got[n], original[n]) for n in got) and bool(got)
            out["checked_tensors"] = len(got)
            if variant in ("load",):
                # aliasing survives: the two views and the tensor passed twice share one storage
                ptr = lambda n: got[n].untyped_storage().data_ptr()  # noqa: E731
                out["aliasing_kept"] = ptr("view_top") == ptr("view_t") and ptr("twice_a") == ptr("twice_b")
    out["seconds"] = m.seconds
    out["cpu_seconds"] = m.cpu_seconds
    out["peak_extra"] = m.peak_extra
    out["tool_peak"] = m.tool_peak
    return out


# --------------------------------------------------------------------------------------------
# the parent: run children, collect, report

OURS_PACK = ["pack", "pack-blake3", "pack-compress-all"]
OURS_READ = ["verify", "load", "read-one", "first-touch"]
BASELINES = ["contentstore-pack", "contentstore-load", "contentstore-read-one", "torchsave-pack", "torchsave-load"]


def _versions() -> dict:
    import hashlib  # noqa: F401
    import ssl

    import torch
    import zstandard

    import reproarchive

    def tool(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True).stdout.splitlines()[0].strip()
        except (OSError, IndexError):
            return None

    try:
        import blake3

        b3 = getattr(blake3, "__version__", None) or "installed"
    except ImportError:
        b3 = None
    return {
        "reproarchive": reproarchive.__version__,
        "torch": torch.__version__,
        "zstandard": zstandard.__version__,
        "libzstd": ".".join(map(str, zstandard.ZSTD_VERSION)),
        "hashlib": ssl.OPENSSL_VERSION,
        "blake3": b3,
        "zstd_cli": tool(["zstd", "--version"]),
        "tar": tool(["tar", "--version"]),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
    }


def run_child(variant: str, total: int, work: str, nice: int, cpus: list[int] | None = None) -> dict:
    """One measurement in a fresh process; ``cpus`` pins it, and every tool it starts, to those cores."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", variant, "--bytes", str(total), "--work", work]
    if nice:
        cmd = ["nice", "-n", str(nice)] + cmd
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    proc = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=pin)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark child {variant!r} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


_BUSY_LOOP = """
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    pass
"""


def start_busy_load(cpus: list[int], seconds: float) -> list[subprocess.Popen]:
    """One busy-looping process per core (the competing load of a shared machine).

    Each loop is pinned to its core and ends by itself after ``seconds`` even if this process
    dies; the caller stops them earlier with ``stop_busy_load``.
    """
    return [subprocess.Popen([sys.executable, "-c", _BUSY_LOOP, str(cpu), str(seconds)]) for cpu in cpus]


def stop_busy_load(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait()


def pinned_cpus(cores: int) -> list[int]:
    """The first ``cores`` of the cores this process may run on."""
    allowed = sorted(os.sched_getaffinity(0))
    if not 1 <= cores <= len(allowed):
        raise SystemExit(f"--cores {cores}: this process may run on {len(allowed)} core(s) ({allowed})")
    return allowed[:cores]


def _median(rows: list[dict], key: str):
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def summarise(results: dict[str, list[dict]], total: int) -> dict:
    summary: dict[str, dict] = {}
    for variant, rows in results.items():
        secs = [r["seconds"] for r in rows]
        med = statistics.median(secs)
        input_bytes = rows[0].get("input_bytes", total)
        cpu = _median(rows, "cpu_seconds")
        s = {
            "seconds": med,
            "seconds_min": min(secs),
            "seconds_max": max(secs),
            "runs": len(rows),
            "gb_per_s": input_bytes / med / 1e9 if med > 0 else None,
            "cpu_seconds": cpu,
            "cpu_seconds_per_gib": cpu / (input_bytes / (1 << 30)) if cpu is not None and input_bytes else None,
            "peak_extra_bytes": _median(rows, "peak_extra"),
            "tool_peak_bytes": _median(rows, "tool_peak"),
        }
        for key in ("file_bytes", "storages", "blobs", "zero_filled", "stored_bytes", "inputs_sharing_a_storage",
                    "result_bytes", "bit_exact", "aliasing_kept", "checked_tensors", "store_seconds", "input_bytes"):
            if key in rows[0]:
                s[key] = rows[0][key]
        if "byteshuffle" in rows[0]:
            s = {"byteshuffle": rows[0]["byteshuffle"]}
        if "file_sha256" in rows[0]:
            s["identical_bytes_every_run"] = len({r["file_sha256"] for r in rows}) == 1
        summary[variant] = s
    ratios: dict[str, Any] = {}

    def sec(v):
        return summary[v]["seconds"] if v in summary else None

    def ratio(a, b):
        return sec(b) / sec(a) if sec(a) and sec(b) else None

    def cpu_ratio(a, b):
        ca, cb = (summary.get(v, {}).get("cpu_seconds") for v in (a, b))
        return cb / ca if ca and cb else None

    ratios["pack_speedup_vs_contentstore_tar"] = ratio("pack", "contentstore-pack")
    ratios["pack_cpu_saving_vs_contentstore_tar"] = cpu_ratio("pack", "contentstore-pack")
    ratios["load_cpu_saving_vs_contentstore"] = cpu_ratio("load", "contentstore-load")
    if "load" in summary and "first-touch" in summary:
        per_gib = [summary[v].get("cpu_seconds_per_gib") for v in ("load", "first-touch")]
        if None not in per_gib:
            ratios["load_cpu_s_per_gib_beyond_first_touch"] = per_gib[0] - per_gib[1]
    if "pack-compress-all" in summary and "pack" in summary:
        ratios["size_vs_compress_all"] = summary["pack"]["file_bytes"] / summary["pack-compress-all"]["file_bytes"]
    ratios["pack_speedup_vs_torchsave_zstd"] = ratio("pack", "torchsave-pack")
    ratios["pack_blake3_speedup_vs_contentstore_tar"] = ratio("pack-blake3", "contentstore-pack")
    ratios["load_speedup_vs_contentstore"] = ratio("load", "contentstore-load")
    ratios["load_speedup_vs_torchsave_zstd"] = ratio("load", "torchsave-load")
    ratios["read_one_speedup_vs_contentstore"] = ratio("read-one", "contentstore-read-one")
    if "pack" in summary and "contentstore-pack" in summary:
        ratios["size_vs_contentstore_tar"] = summary["pack"]["file_bytes"] / summary["contentstore-pack"]["file_bytes"]
    if "pack" in summary and "torchsave-pack" in summary:
        ratios["size_vs_torchsave_zstd"] = summary["pack"]["file_bytes"] / summary["torchsave-pack"]["file_bytes"]
    return {"variants": summary, "ratios": ratios}


def _fmt_bytes(n) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def print_report(report: dict) -> None:
    v = report["versions"]
    print(f"pack/load benchmark: {_fmt_bytes(report['input_bytes'])} of distinct input storage, {report['repeat']} "
          f"run(s) each, median [min-max]")
    print(f"torch {v['torch']}, zstandard {v['zstandard']} (libzstd {v['libzstd']}), {v['hashlib']}, "
          f"blake3 {v['blake3']}, {v['zstd_cli']}, {v['tar']}, python {v['python']}, {v['cpus']} cpus")
    busy = report.get("busy_loops")
    print(f"load average before {report['loadavg_before']}, after {report['loadavg_after']}"
          + (f"; competing load: {busy} busy-looping process(es), one per core" if busy else ""))
    tables = report.get("tables") or [{"cores": None, "cpus": None, "variants": report["variants"],
                                       "ratios": report["ratios"]}]
    for table in tables:
        print()
        if table["cores"]:
            print(f"every process pinned to {table['cores']} core(s): cpus {table['cpus']}")
        _print_table(table)
    shuffle = report["variants"].get("byteshuffle")
    if shuffle:
        print()
        print("byte shuffle before zstd -1 (measurement only; not in the format):")
        for kind, r in shuffle["byteshuffle"].items():
            print(f"  {kind}: ratio {r['ratio_raw']:.4f} -> {r['ratio_byteshuffle']:.4f} "
                  f"({100 * r['size_change']:+.1f}% bytes); "
                  f"zstd alone {r['gb_per_s_raw']:.2f} GB/s, shuffle+zstd {r['gb_per_s_shuffle_then_zstd']:.2f} GB/s "
                  f"(shuffle alone {r['gb_per_s_shuffle_only']:.2f} GB/s, torch transpose)")


def _print_table(table: dict) -> None:
    variants = table["variants"]
    print(f"{'variant':24s} {'seconds':>20s} {'GB/s':>6s} {'CPU s':>6s} {'CPU s/GiB':>9s} {'extra peak RSS':>15s} "
          f"{'tool RSS':>10s} {'file':>10s}")
    for name, s in variants.items():
        if "byteshuffle" in s:
            continue
        secs = f"{s['seconds']:.3f} [{s['seconds_min']:.3f}-{s['seconds_max']:.3f}]"
        gbs = f"{s['gb_per_s']:.2f}" if s["gb_per_s"] and name not in ("read-one", "contentstore-read-one") else "-"
        cpu = f"{s['cpu_seconds']:.2f}" if s.get("cpu_seconds") is not None else "-"
        per_gib = f"{s['cpu_seconds_per_gib']:.2f}" if s.get("cpu_seconds_per_gib") is not None else "-"
        print(f"{name:24s} {secs:>20s} {gbs:>6s} {cpu:>6s} {per_gib:>9s} {_fmt_bytes(s['peak_extra_bytes']):>15s} "
              f"{_fmt_bytes(s['tool_peak_bytes']):>10s} {_fmt_bytes(s.get('file_bytes')):>10s}")
    print()
    for key, value in table["ratios"].items():
        if value is not None:
            print(f"{key:42s} {value:8.2f}{'x' if 'speedup' in key or 'saving' in key else ''}")
    p = variants.get("pack")
    if p:
        print(f"dedup: {p['storages']} storages -> {p['blobs']} blobs ({p['zero_filled']} all-zero stored without a "
              f"blob; {p['inputs_sharing_a_storage']} inputs share a storage); "
              f"{_fmt_bytes(p['stored_bytes'])} stored of "
              f"{_fmt_bytes(p['input_bytes'])}; identical bytes every run: {p.get('identical_bytes_every_run')}")
    for name in ("load", "read-one", "contentstore-load", "torchsave-load"):
        s = variants.get(name)
        if s and "bit_exact" in s:
            print(f"{name}: bit-exact {s['bit_exact']} ({s['checked_tensors']} tensors)"
                  + (f", aliasing kept {s['aliasing_kept']}" if "aliasing_kept" in s else ""))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--gib", type=float, default=None, help="GiB of distinct input storage (default 1)")
    size.add_argument("--mib", type=float, default=None, help="MiB of distinct input storage")
    ap.add_argument("--repeat", type=int, default=1, help="runs per variant (median and range reported)")
    ap.add_argument("--only", default=None, help="comma-separated variants (default: all)")
    ap.add_argument("--no-baselines", action="store_true", help="skip ContentStoreWriter+tar and torch.save+zstd")
    ap.add_argument("--cores", default=None,
                    help="pin every process (ours, the baselines and the tools they run) to the first N cores this "
                         "process may use; a list such as 1,2 runs every variant at each count, interleaved")
    ap.add_argument("--busy", action="store_true",
                    help="competing load: one busy-looping process per core for the length of the run")
    ap.add_argument("--byteshuffle", action="store_true",
                    help="also measure zstd on byte planes of the fp32/bf16 weights (not part of the format)")
    ap.add_argument("--nice", type=int, default=0, help="run children under `nice -n N` (negative needs root)")
    ap.add_argument("--work", default=None, help="folder for the archives (default: a temp folder, removed after)")
    ap.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--bytes", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--busy-seconds", type=float, default=1800, help=argparse.SUPPRESS)  # bound if we die
    args = ap.parse_args(argv)

    if args.child:
        print(json.dumps(child(args.child, args.bytes, args.work)))
        return 0

    total = int((args.mib or 0) * (1 << 20)) if args.mib else int((args.gib or 1.0) * (1 << 30))
    variants = (OURS_PACK + OURS_READ + ([] if args.no_baselines else BASELINES)
                + (["byteshuffle"] if args.byteshuffle else []))
    if args.only:
        wanted = args.only.split(",")
        unknown = set(wanted) - set(OURS_PACK + OURS_READ + BASELINES + ["byteshuffle"])
        if unknown:
            ap.error(f"unknown variants: {', '.join(sorted(unknown))}")
        # readers need the archives their writers make
        need = set(wanted)
        if need & {"verify", "load", "read-one", "first-touch"}:
            need.add("pack")
        if need & {"contentstore-load", "contentstore-read-one"}:
            need.add("contentstore-pack")
        if "torchsave-load" in need:
            need.add("torchsave-pack")
        variants = [v for v in OURS_PACK + OURS_READ + BASELINES + ["byteshuffle"] if v in need]
    try:
        counts = [int(c) for c in args.cores.split(",")] if args.cores else [None]
    except ValueError:
        ap.error("--cores takes a number of cores, or a comma-separated list of them")
    pins = {n: pinned_cpus(n) if n else None for n in counts}

    work = args.work or tempfile.mkdtemp(prefix="reproarchive-bench-")
    os.makedirs(work, exist_ok=True)
    busy = start_busy_load(sorted(os.sched_getaffinity(0)), args.busy_seconds) if args.busy else []
    loadavg_before = [round(x, 2) for x in os.getloadavg()]
    results: dict = {n: {} for n in counts}
    try:
        # Core counts interleave run by run, so each count sees the same machine conditions.
        for variant in variants:
            for _ in range(max(1, args.repeat)):
                for n in counts:
                    results[n].setdefault(variant, []).append(run_child(variant, total, work, args.nice, pins[n]))
    finally:
        stop_busy_load(busy)
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    loadavg_after = [round(x, 2) for x in os.getloadavg()]
    tables = [{"cores": n, "cpus": pins[n], **summarise(results[n], total), "runs": results[n]} for n in counts]
    first = results[counts[0]]
    report = {
        "input_bytes": first.get("pack", [{}])[0].get("input_bytes", total),
        "requested_bytes": total,
        "repeat": args.repeat,
        "one_tensor": ONE_TENSOR,
        "versions": _versions(),
        "loadavg_before": loadavg_before,
        "loadavg_after": loadavg_after,
        "busy_loops": len(busy),
        # the first core count's tables also at the top level (one --cores value: the only ones)
        "variants": tables[0]["variants"],
        "ratios": tables[0]["ratios"],
        "tables": tables,
    }
    if args.json:
        print(json.dumps(report, indent=1, sort_keys=False))
    else:
        print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
