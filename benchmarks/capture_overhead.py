"""What capture costs a job that does not fail: side by side, in one run.

    python benchmarks/capture_overhead.py                      # 0.4 GB, eager and inductor
    python benchmarks/capture_overhead.py --gb 0.4,1.5,4       # three sizes
    python benchmarks/capture_overhead.py --cores 1 --busy     # pinned to one core, beside a busy loop
    python benchmarks/capture_overhead.py --repeat 3 --variants "capture,capture(calls)"  # medians, a subset
    python benchmarks/capture_overhead.py --quick --json       # seconds: what tests/benchmarks runs
    python benchmarks/capture_overhead.py --device cuda --gb 1.5,4  # a GPU job

The job: a model of ``Linear(2048, 2048)`` + ``ReLU`` blocks (``--gb`` of fp32 weights), compiled
with ``dynamic=False``, one training step (forward, ``sum().backward()``) per call. "recompiles"
calls it with four batch sizes (four graphs), "one graph" with one.
Each variant runs in a fresh process, with an inductor cache of its own (every compile is cold):

  plain       ``torch.compile(model, backend=B)``, plain ``python``
  capture     ``torch.compile(model, backend=reproarchive.capture(B))``, plain ``python``: the
              defaults (the first-call check; the crash record spooled, each storage once)
  capture(calls)  the same with ``check_runtime="calls"`` (no check run before the first call:
              every call guarded, the first covered by the crash record; a failing backward is
              not archived)
  capture(no spool)  the same with ``spool=False`` (each graph's crash record written whole
              before its first call, as before spooling became the default)
  capture--   the plain program under ``reproarchive capture --`` (PyTorch's after_dynamo hook and
              the crash guard, in the child)

and reports the whole run's wall time, from the outside (the command's start to its end: for
``capture--``, the CLI, the program's start-up under the shim, the spool guardian, and what the
CLI does after the program), and, from inside the job: the first calls (compile + first step, summed over the batch
sizes), the median of three later steps (the cost every call pays), its peak RSS
(``ru_maxrss``) plus the most memory a forked spool writer held on its own (the pages copied
while it lived: system memory the job would not have used) and the spool guardian's resident
memory, and the bytes it wrote (``wchar``
of ``/proc/self/io``, which counts the writers it reaped too: archives written before a first
run and removed after it count, stdout is negligible). The table gives capture's
whole-run, first-call and later-call time as a ratio of plain's, its extra peak RSS in MiB and as a
fraction of the weights, and bytes written per byte of distinct storage (weights + inputs).
The targets: extra RSS at most 5% of the weights + 64 MiB, first calls at most 1.15x
(inductor) / 1.5x (eager), the whole run of ``capture--`` at most 1.15x, bytes written at most
1.05x the distinct storage bytes.

``--cores N`` pins every process to the first N cores this one may use; ``--busy`` runs one
busy-looping process per such core for the length of the run. Numbers on a shared machine are
noisy: the load average before and after is printed with the table.

``--device cuda``: the model and its inputs on the GPU, each step synchronized (its kernels are
part of its time), and one more column: the peak device memory allocated
(``max_memory_allocated``) beyond plain's, i.e. what capture took on the device.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WIDTH = 2048
BLOCK_BYTES = (WIDTH * WIDTH + WIDTH) * 4  # one Linear(2048, 2048) in fp32
SIZES_RECOMPILE = (8, 16, 24, 32)
VARIANTS = ("plain", "capture", "capture(calls)", "capture(no spool)", "capture--")
OPTIONS = {"capture": {}, "capture(calls)": {"check_runtime": "calls"}, "capture(no spool)": {"spool": False}}


# ---------------------------------------------------------------------------------------------
# the job (a child process)


def job(spec: dict[str, Any]) -> dict[str, Any]:
    """One variant's run; returns what it measured from inside."""
    import resource

    import torch

    torch.manual_seed(0)
    width, device = spec["width"], torch.device(spec.get("device", "cpu"))
    layers = []
    for _ in range(spec["blocks"]):
        layers += [torch.nn.Linear(width, width, device=device), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers)
    accelerator = None if device.type == "cpu" else getattr(torch, device.type)
    backend: Any = spec["backend"]
    if spec["variant"] != "plain":  # the forked writer's own memory is part of capture's (27 ms per graph)
        from reproarchive.sources.capture import snapshot_writer

        snapshot_writer.measure_memory = True
    if spec["variant"] in OPTIONS:
        import reproarchive

        backend = reproarchive.capture(backend, path=spec["archives"], **OPTIONS[spec["variant"]])
    compiled = torch.compile(model, backend=backend, dynamic=False)
    weights = sum(p.untyped_storage().nbytes() for p in model.parameters())
    inputs = [torch.randn(n, width, device=device) for n in spec["sizes"]]
    if accelerator is not None:
        accelerator.synchronize()
        accelerator.reset_peak_memory_stats()
    written0 = _wchar()

    def step(x: Any) -> None:
        compiled(x).sum().backward()
        model.zero_grad(set_to_none=True)
        if accelerator is not None:  # the step's kernels are part of its time
            accelerator.synchronize()

    first = 0.0
    for x in inputs:
        started = time.perf_counter()
        step(x)
        first += time.perf_counter() - started
    later = []
    for _ in range(3):
        started = time.perf_counter()
        step(inputs[-1])
        later.append(time.perf_counter() - started)
    return {"first_s": first, "later_s": statistics.median(later), "peak_rss": _peak_rss(resource),
            "writer_rss": _writer_rss() + _guardian_rss(), "written": _wchar() - written0,
            "distinct": weights + sum(x.untyped_storage().nbytes() for x in inputs),
            "weights": weights, "device_peak": accelerator.max_memory_allocated() if accelerator else 0}


def _wchar() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("wchar:")).split()[1])


def _writer_rss() -> int:
    """The most memory a forked spool writer of this process held on its own (0: none forked)."""
    spools = sys.modules.get("reproarchive.sources.capture.process_spool")
    if spools is None:
        return 0
    return max((s.writer_memory for (pid, _), s in spools._spools.items() if pid == os.getpid()), default=0)


def _guardian_rss() -> int:
    """The resident memory of this process's spool guardian (0: none)."""
    spools = sys.modules.get("reproarchive.sources.capture.process_spool")
    guardian = spools._guardians.get(os.getpid()) if spools is not None else None
    if guardian is None:
        return 0
    status = Path(f"/proc/{guardian.proc.pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1]) * 1024


def _peak_rss(resource: Any) -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# ---------------------------------------------------------------------------------------------
# the parent


def run_variant(spec: dict[str, Any], cores: list[int] | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="capture-overhead-") as tmp:
        result_file = Path(tmp) / "result.json"
        spec = dict(spec, archives=str(Path(tmp) / "archives"), result=str(result_file))
        program = [sys.executable, str(Path(__file__).resolve()), "--job", json.dumps(spec)]
        if spec["variant"] == "capture--":
            cli = [sys.executable, "-c", "from reproarchive.cli import main; main()"]
            command = [*cli, "capture", "-q", "-o", str(Path(tmp) / "archives"), "--", *program]
        else:
            command = program
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                                          os.environ.get("PYTHONPATH")])))
        # every variant compiles cold, as a fresh job does: an inductor cache warmed by the variant
        # before would make whichever ran first look slow
        env["TORCHINDUCTOR_CACHE_DIR"] = str(Path(tmp) / "inductor-cache")
        started = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=tmp,
                              preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None)
        if done.returncode != 0 or not result_file.exists():
            raise SystemExit(f"{spec['variant']} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        result = json.loads(result_file.read_text())
        left = sorted(p.name for p in (Path(tmp) / "archives").glob("*")) if (Path(tmp) / "archives").exists() else []
        return dict(result, wall_s=time.perf_counter() - started, archives_left=left)


def measure(gb: float, backend: str, recompiles: bool, *, quick: bool, cores: list[int] | None,
            variants: tuple[str, ...] = VARIANTS, repeat: int = 1, device: str = "cpu") -> dict[str, Any]:
    width = 128 if quick else WIDTH
    blocks = 2 if quick else max(1, round(gb * 1e9 / BLOCK_BYTES))
    sizes = (SIZES_RECOMPILE[:2] if quick else SIZES_RECOMPILE) if recompiles else SIZES_RECOMPILE[:1]
    spec = {"width": width, "blocks": blocks, "backend": backend, "sizes": list(sizes), "device": device}
    # round-robin, so that a burst of load on a shared machine falls on every variant alike
    rounds = [{v: run_variant(dict(spec, variant=v), cores) for v in variants} for _ in range(repeat)]
    runs = {v: _median_run([r[v] for r in rounds]) for v in variants}
    plain = runs["plain"]
    row: dict[str, Any] = {"gb": gb, "backend": backend, "graphs": len(sizes), "blocks": blocks,
                           "weights": plain["weights"], "plain_first_s": plain["first_s"],
                           "plain_later_s": plain["later_s"], "plain_peak_rss": plain["peak_rss"],
                           "plain_wall_s": plain["wall_s"],
                           "device": device, "plain_device_peak": plain["device_peak"]}
    for v in variants[1:]:
        r = runs[v]
        extra = r["peak_rss"] + r["writer_rss"] - plain["peak_rss"]
        row[v] = {"first_ratio": r["first_s"] / plain["first_s"], "later_ratio": r["later_s"] / plain["later_s"],
                  "wall_ratio": r["wall_s"] / plain["wall_s"],
                  "extra_rss": extra, "extra_rss_of_weights": extra / plain["weights"], "writer_rss": r["writer_rss"],
                  "written": r["written"], "written_per_distinct": r["written"] / r["distinct"],
                  "extra_device_peak": r["device_peak"] - plain["device_peak"],
                  "archives_left": r["archives_left"]}
    row["plain_written_per_distinct"] = plain["written"] / plain["distinct"]
    return row


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One variant's figures over its repeats: the median of each number, every archive left."""
    out = {k: statistics.median(r[k] for r in runs) for k, v in runs[0].items() if isinstance(v, (int, float))}
    return dict(out, archives_left=sorted({name for r in runs for name in r["archives_left"]}))


def table(rows: list[dict[str, Any]]) -> str:
    mib = 1 << 20
    on_device = any(r["device"] != "cpu" for r in rows)
    head = ("| weights, backend, graphs | variant | whole run | first calls | later calls | extra peak RSS "
            "| written / distinct |")
    out = [head + (" extra device peak |" if on_device else ""), "|---" * (8 if on_device else 7) + "|"]
    for r in rows:
        label = f"{r['weights'] / mib:,.0f} MiB, {r['backend']}, {r['graphs']}"
        device = f" ({r['plain_device_peak'] / mib:,.0f} MiB) |" if on_device else ""
        out.append(f"| {label} | plain | {r['plain_wall_s']:.2f} s | {r['plain_first_s']:.2f} s | "
                   f"{r['plain_later_s'] * 1000:.0f} ms | "
                   f"({r['plain_peak_rss'] / mib:,.0f} MiB) | {r['plain_written_per_distinct']:.2f}x |{device}")
        for v in [v for v in VARIANTS[1:] if v in r]:
            c = r[v]
            device = f" {c['extra_device_peak'] / mib:+,.0f} MiB |" if on_device else ""
            out.append(f"| | {v} | {c['wall_ratio']:.2f}x | {c['first_ratio']:.2f}x | {c['later_ratio']:.2f}x | "
                       f"{c['extra_rss'] / mib:+,.0f} MiB ({c['extra_rss_of_weights']:+.0%}) | "
                       f"{c['written_per_distinct']:.2f}x |{device}")
    return "\n".join(out)


def _busy(cores: list[int]) -> list[subprocess.Popen]:
    loop = "while True: pass"
    return [subprocess.Popen([sys.executable, "-c", loop],
                             preexec_fn=(lambda c=c: os.sched_setaffinity(0, [c]))) for c in cores]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", default="0.4", help="model sizes in GB of weights, comma-separated")
    parser.add_argument("--backends", default="eager,inductor")
    parser.add_argument("--recompiles", default="yes,no", help="yes (four batch sizes), no (one), or both")
    parser.add_argument("--quick", action="store_true", help="tiny models, eager only: seconds")
    parser.add_argument("--cores", type=int, help="pin every process to the first N cores")
    parser.add_argument("--busy", action="store_true", help="a busy loop on each of those cores meanwhile")
    parser.add_argument("--device", default="cpu", help="where the model and inputs live (cuda: a GPU job)")
    parser.add_argument("--variants", default=",".join(VARIANTS[1:]),
                        help=f"capture variants beside plain, comma-separated (default: all of {VARIANTS[1:]})")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each variant (round-robin); medians")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    parser.add_argument("--job", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.job:
        spec = json.loads(args.job)
        Path(spec["result"]).write_text(json.dumps(job(spec)))
        return 0
    allowed = sorted(os.sched_getaffinity(0))
    cores = allowed[:args.cores] if args.cores else None
    backends = ["eager"] if args.quick else args.backends.split(",")
    sizes = [0.0] if args.quick else [float(g) for g in args.gb.split(",")]
    recompile_modes = [m == "yes" for m in args.recompiles.split(",")]
    unknown = set(args.variants.split(",")) - set(VARIANTS[1:])
    if unknown:
        parser.error(f"unknown variant(s) {sorted(unknown)}; known: {', '.join(VARIANTS[1:])}")
    variants = ("plain", *(v for v in VARIANTS[1:] if v in args.variants.split(",")))
    if args.quick:
        recompile_modes = [True]
    load_before = os.getloadavg()
    busy = _busy(cores or allowed) if args.busy else []
    try:
        rows = []
        for gb in sizes:
            for b in backends:
                for rc in recompile_modes:
                    rows.append(measure(gb, b, rc, quick=args.quick, cores=cores, variants=variants,
                                        repeat=max(1, args.repeat), device=args.device))
                    print(table(rows[-1:]).splitlines()[-len(variants):], file=sys.stderr, flush=True)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    print(table(rows))
    print(f"medians of {max(1, args.repeat)} run(s) per variant; "
          f"load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after; "
          f"cores {cores or allowed}{', busy loop on each' if busy else ''}")
    if args.json:
        print(json.dumps({"rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
