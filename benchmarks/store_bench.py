"""Push and pull through a store against moving the whole file, on a real S3 API.

    python benchmarks/store_bench.py              # 1 GiB archive (~3 min on 2 busy cores)
    python benchmarks/store_bench.py --mib 64     # smaller
    python benchmarks/store_bench.py --json       # also print the measurements as JSON

In one run, against one moto S3 server started on 127.0.0.1 in a process of its own (so that
server and client do not share a GIL):

  whole-file put / get   s3fs ``put`` and ``get`` of the archive file: what a team does today
                         with ``aws s3 cp`` or any bucket client
  push / pull            ``reproarchive push`` of the same archive to an empty store, then
                         ``reproarchive pull`` of it to a new file (rebuilt, hashed, verified)
  second push            ``reproarchive push`` of a second archive that shares 90% of its
                         blobs with the first (the next failure of the same model)

The archives hold a model's worth of fp32 weights (randn * 0.02, 64 tensors of 1/64 of the
size each); the second one replaces 6 of the 64 tensors. Every byte count is read from the
results (bytes sent by push), every time is wall clock around one call. Targets:
second push sends <= 12% of the bytes and takes <= 20% of the whole-file put; push and pull
take <= 1.3x the whole-file put and get. Exit status 1 when a target is missed or a pulled
file differs from the pushed one.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

TENSORS = 64
REPLACED = 6  # of 64: the second archive shares 58/64 = 90.6% of its blobs


def build_archive(path: Path, total: int, replaced: int) -> Path:
    import torch

    import reproarchive

    n = total // TENSORS // 4
    inputs = []
    for i in range(TENSORS):
        seed = i if i >= replaced else 10_000 + i + 1000 * replaced
        inputs.append(torch.randn(n, generator=torch.Generator().manual_seed(seed)) * 0.02)

    gm = _sum_graph(TENSORS)
    return reproarchive.pack(gm, inputs, path, backend="eager", snapshot=False,
                             failure={"stage": "compile", "exception_type": "RuntimeError", "message": "bench",
                                      "signature": "compile|RuntimeError|bench"})


def _sum_graph(count: int):
    import torch
    import torch.fx as fx

    graph = fx.Graph()
    xs = [graph.placeholder(f"w{i}") for i in range(count)]
    total = graph.call_method("sum", (xs[0],))
    for x in xs[1:]:
        total = graph.call_function(torch.add, (total, graph.call_method("sum", (x,))))
    graph.output(total)
    return fx.GraphModule(torch.nn.Module(), graph)


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover
        return "?"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=None, help="archive size in GiB (default 1)")
    parser.add_argument("--mib", type=int, default=None, help="archive size in MiB")
    parser.add_argument("--json", action="store_true", help="also print the measurements as JSON")
    parser.add_argument("--workdir", type=Path, default=None, help="folder for the archives (default: a temp dir)")
    args = parser.parse_args(argv)
    total = (args.mib << 20) if args.mib else int((args.gib or 1.0) * (1 << 30))

    import s3fs

    import reproarchive
    from support import s3server

    report: dict = {"machine": f"{platform.machine()}, {os.cpu_count()} cores", "python": platform.python_version(),
                    "bytes_of_inputs": total, "load_before": loadavg()}
    with tempfile.TemporaryDirectory(prefix="store-bench-", dir=args.workdir) as tmp:
        tmp = Path(tmp)
        first = build_archive(tmp / "first.tar.zst", total, 0)
        second = build_archive(tmp / "second.tar.zst", total, REPLACED)
        report["archive_bytes"] = first.stat().st_size
        report["second_archive_bytes"] = second.stat().st_size
        with s3server.process_server() as endpoint, s3server.client_environment(endpoint):
            bucket = f"bench-{uuid.uuid4().hex[:8]}"
            s3server.make_bucket(bucket)
            fs = s3fs.S3FileSystem(skip_instance_cache=True)
            store = f"s3://{bucket}/store"

            t_put, _ = timed(lambda: fs.put_file(str(first), f"{bucket}/whole/first.tar.zst"))
            t_get, _ = timed(lambda: fs.get_file(f"{bucket}/whole/first.tar.zst", str(tmp / "got.tar.zst")))
            assert (tmp / "got.tar.zst").stat().st_size == first.stat().st_size
            (tmp / "got.tar.zst").unlink()

            t_push, (pushed,) = timed(lambda: reproarchive.push([first], store))
            t_pull, pulled = timed(lambda: reproarchive.pull(f"{store}/{pushed.name}", tmp / "pulled.tar.zst"))
            same = _same(first, pulled.path)
            (tmp / "pulled.tar.zst").unlink()
            t_push2, (pushed2,) = timed(lambda: reproarchive.push([second], store))
            t_pull2, pulled2 = timed(lambda: reproarchive.pull(f"{store}/{pushed2.name}", tmp / "pulled2.tar.zst"))
            same = same and _same(second, pulled2.path)
        report.update(
            whole_put_s=t_put, whole_get_s=t_get, push_s=t_push, pull_s=t_pull, second_push_s=t_push2,
            second_pull_s=t_pull2, push_sent_bytes=pushed.uploaded_bytes, second_push_sent_bytes=pushed2.uploaded_bytes,
            second_push_new_blobs=f"{pushed2.uploaded_blobs}/{pushed2.blobs}", byte_identical=same,
            load_after=loadavg(),
        )
    r = report
    ratios = {
        "push / whole put": (r["push_s"] / r["whole_put_s"], 1.3),
        "pull / whole get": (r["pull_s"] / r["whole_get_s"], 1.3),
        "second push / whole put": (r["second_push_s"] / r["whole_put_s"], 0.20),
        "second push bytes / archive bytes": (r["second_push_sent_bytes"] / r["second_archive_bytes"], 0.12),
    }
    report["ratios"] = {k: v for k, (v, _) in ratios.items()}
    gib = r["archive_bytes"] / (1 << 30)
    print(f"archive {r['archive_bytes']:,} bytes ({gib:.2f} GiB) from {total:,} bytes of fp32 weights; "
          f"load average {r['load_before']} -> {r['load_after']}")
    print("| operation | seconds | bytes sent |")
    print("|---|---|---|")
    print(f"| whole-file put (s3fs) | {r['whole_put_s']:.1f} | {r['archive_bytes']:,} |")
    print(f"| whole-file get (s3fs) | {r['whole_get_s']:.1f} | |")
    print(f"| push | {r['push_s']:.1f} | {r['push_sent_bytes']:,} |")
    print(f"| pull (rebuild, hash, verify) | {r['pull_s']:.1f} | |")
    print(f"| second push (90% shared) | {r['second_push_s']:.1f} | {r['second_push_sent_bytes']:,} "
          f"({r['second_push_new_blobs']} blobs new) |")
    print(f"| second pull | {r['second_pull_s']:.1f} | |")
    print()
    print("| ratio | measured | target |")
    print("|---|---|---|")
    ok = same
    for name, (value, target) in ratios.items():
        met = value <= target
        ok = ok and met
        print(f"| {name} | {value:.3f} | <= {target} {'ok' if met else 'MISSED'} |")
    print(f"pulled archives byte-identical: {same}")
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    return 0 if ok else 1


def _same(a: Path, b: Path) -> bool:
    import hashlib

    def digest(p):
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(16 << 20), b""):
                h.update(chunk)
        return h.digest()

    return digest(a) == digest(b)


if __name__ == "__main__":
    sys.exit(main())
