"""Side by side on a real compiler: ``reproarchive run --minify`` against PyTorch's own flow.

    python benchmarks/minify_inductor.py --list
    python benchmarks/minify_inductor.py --row compile_error-10 --out DIR    # one row -> DIR/compile_error-10.json
    python benchmarks/minify_inductor.py --all --out DIR [--skip-done]       # every row, one after another
    python benchmarks/minify_inductor.py --table DIR                          # the markdown table from DIR/*.json

Every row is one failure of inductor on CPU, made by PyTorch's bug injectors
(``torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY``: ``compile_error``,
``runtime_error`` -- the compiled kernel throws and the process aborts -- or ``accuracy``,
relu computed as ``x + 1``) in a generated program of about 10, 100 or 500 ops: four chains of
sin/cos/tanh/neg/abs/add/mul/sub on 64x64 tensors joined at the end, one ``relu`` in the middle
of a chain (the known minimum is that relu alone, 1 op). Per row, in one process tree:

1. the program runs once with PyTorch's repro-after settings (``TORCHDYNAMO_REPRO_AFTER=aot``,
   ``TORCHDYNAMO_REPRO_LEVEL`` 2, 3 for the crash, 4 for accuracy), which writes
   ``minifier_launcher.py``: the failure both tools start from;
2. PyTorch: ``python minifier_launcher.py minify`` (its defaults: a subprocess per query);
3. reproarchive: ``reproarchive pack`` of that launcher (timed apart), then
   ``reproarchive run --minify --isolate`` (warm workers, default --jobs, inputs shrunk too).

The two tools run one after the other (which goes first alternates by row) on the same
machine, each with a fresh inductor cache directory (the launcher's own line pointing at the
dump's cache is rewritten; the dump ran once before both, so neither gets the other's cache).
Wall time is ``perf_counter`` around the command; CPU time is user + system of the command and
every process it waited for (``RUSAGE_CHILDREN``). ``TORCHINDUCTOR_COMPILE_THREADS=1`` for
both, so that no compile worker outlives the accounting.

For the runtime_error rows the harness packs with ``--no-replay`` and records the failure from
one isolated replay (``record_crash``), keeping absent inputs absent: when the rows in
benchmarks/README.md were measured, ``pack`` could not record a crash itself (it can now: its
replay runs in a child), and the harness is kept as it was so that the rows stay comparable.

The ``strict`` row is PyTorch's ``test_accuracy_vs_strict_accuracy`` scenario (relu and log1p
accuracy injectors): PyTorch's ``minify`` and ``minify --strict-accuracy`` against
``run --minify`` and ``run --minify --strict-accuracy``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
KINDS = {"compile_error": 2, "runtime_error": 3, "accuracy": 4}
SIZES = (10, 100, 500)
ROWS = [f"{kind}-{n}" for kind in KINDS for n in SIZES] + ["strict"]
TIMEOUT = 4 * 3600

UNARY = ["torch.sin", "torch.cos", "torch.tanh", "torch.neg", "torch.abs"]
BINARY = ["+", "*", "-"]


def program(kind: str, n: int, seed: int) -> str:
    """The failing program: ``n`` ops in four chains joined at the end, one relu planted."""
    rng = random.Random(seed)
    lines, counter = [], [0]

    def new() -> str:
        counter[0] += 1
        return f"v{counter[0]}"

    chains = [[f"x{i}"] for i in range(4)]
    ops = 0
    for c in chains:
        v = new()
        lines.append(f"    {v} = torch.sin({c[-1]})")
        c.append(v)
        ops += 1
    per = max(2, (n - 3) // 4)
    planted = False
    for step in range(1, per):
        for bi, c in enumerate(chains):
            if bi == 1 and not planted and step >= per // 2:
                v = new()
                lines.append(f"    {v} = torch.relu({c[-1]})")
                c.append(v)
                ops += 1
                planted = True
            if ops >= n - 3:
                continue
            v = new()
            if rng.random() < 0.6 or len(c) < 3:
                lines.append(f"    {v} = {rng.choice(UNARY)}({c[-1]})")
            else:
                lines.append(f"    {v} = {c[-1]} {rng.choice(BINARY)} {c[-rng.randint(2, min(4, len(c) - 1))]}")
            c.append(v)
            ops += 1
    if not planted:
        v = new()
        lines.append(f"    {v} = torch.relu({chains[1][-1]})")
        chains[1].append(v)
    out = chains[0][-1]
    for c in chains[1:]:
        v = new()
        lines.append(f"    {v} = {out} + {c[-1]}")
        out = v
    body = "\n".join(lines)
    return f'''import torch
import torch._inductor.config

torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY = {kind!r}


@torch.compile()
def inner(x0, x1, x2, x3):
{body}
    return {out}


torch.manual_seed({seed})
inner(*[torch.randn(64, 64) for _ in range(4)])
'''


def visible_seed(n: int, start: int) -> int:
    """The first seed from ``start`` on whose ``relu -> x + 1`` error reaches the output by
    PyTorch's accuracy rule (saturating ops hide it on long chains, as in real models)."""
    import torch
    from torch._dynamo.utils import same

    for seed in range(start, start + 100):
        body = program("accuracy", n, seed).split("@torch.compile()")[1].split("torch.manual_seed")[0]
        scope: dict[str, Any] = {"torch": torch}
        exec(body, scope)  # our own generated source, run eagerly
        torch.manual_seed(seed)
        xs = [torch.randn(64, 64) for _ in range(4)]
        ref, f64 = scope["inner"](*xs), scope["inner"](*[x.double() for x in xs])
        relu = torch.relu
        torch.relu = lambda x: x + 1
        try:
            bad = scope["inner"](*xs)
        finally:
            torch.relu = relu
        if not same(ref, bad, f64, tol=1e-3, equal_nan=True, log_error=lambda *a: None):
            return seed
    raise SystemExit(f"no seed shows the accuracy bug at {n} ops")


STRICT_PROGRAM = '''import torch
import torch._inductor.config

torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY = "accuracy"
torch._inductor.config.cpp.inject_log1p_bug_TESTING_ONLY = "accuracy"


@torch.compile()
def inner(x):
    y = torch.log1p(x)
    b = y > 0
    # Need to ensure suffix removal hits a boolean output
    b = torch.logical_not(b)
    b = torch.logical_not(b)
    x = torch.relu(x)
    return torch.where(b, x, x)


torch.manual_seed(0)
inner(torch.randn(20))
'''


def _run(cmd: list[str], cwd: Path, env: dict[str, str], log: Path, timeout: float = TIMEOUT) -> dict[str, Any]:
    """Run ``cmd``; wall seconds, CPU seconds (it and what it waited for), exit status, output."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, errors="replace", timeout=timeout)
        out, rc = proc.stdout, proc.returncode
    except subprocess.TimeoutExpired as exc:
        out, rc = (exc.stdout or "") if isinstance(exc.stdout, str) else "", "timeout"
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    log.write_text(out)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "rc": rc, "output": out}


def _env(cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHDYNAMO_REPRO", "TORCH_COMPILE_DEBUG"))}
    env.update(TORCHINDUCTOR_CACHE_DIR=str(cache), TORCHINDUCTOR_COMPILE_THREADS="1", **extra)
    return env


def _launcher(folder: Path) -> Path:
    found = sorted(folder.rglob("minifier_launcher.py"))
    if not found:
        raise SystemExit(f"no minifier_launcher.py under {folder}: the program did not fail as planned")
    return found[-1]


def _forward_ops(code: str) -> list[str]:
    """The aten ops of the first ``forward`` in a repro script, in order."""
    ops, inside = [], False
    for line in code.splitlines():
        if line.strip().startswith("def forward("):
            inside = True
            continue
        if inside:
            if line.strip().startswith("return"):
                break
            m = re.search(r"torch\.ops\.aten\.(\w+)", line)
            if m:
                ops.append(m.group(1))
    return ops


def run_torch(minifier_dir: Path, cache: Path, extra: list[str], log: Path) -> dict[str, Any]:
    launcher = minifier_dir / "minifier_launcher.py"
    text = launcher.read_text()
    launcher.write_text(re.sub(r"os\.environ\['TORCHINDUCTOR_CACHE_DIR'\] = '[^']*'",
                               f"os.environ['TORCHINDUCTOR_CACHE_DIR'] = '{cache}'", text))
    for leftover in ("repro.py", "isolate", "checkpoints/minified"):
        shutil.rmtree(minifier_dir / leftover, ignore_errors=True) if (minifier_dir / leftover).is_dir() \
            else (minifier_dir / leftover).unlink(missing_ok=True)
    res = _run([sys.executable, "minifier_launcher.py", "minify", *extra], minifier_dir, _env(cache), log)
    m = re.findall(r"Made (\d+) queries", res["output"])
    repro = minifier_dir / "repro.py"
    ops = _forward_ops(repro.read_text()) if repro.exists() and m else None
    return {"tool": "torch", "command": f"minifier_launcher.py minify {' '.join(extra)}".strip(),
            "wall_s": res["wall_s"], "cpu_s": res["cpu_s"], "rc": res["rc"],
            "calls": int(m[-1]) if m else None, "ops_after": None if ops is None else len(ops), "final": ops}


def record_crash(archive: Path, env: dict[str, str]) -> None:
    """The failure of one isolated replay, written into the archive, absent inputs kept absent
    (the harness records crashes itself: see the module docstring)."""
    code = f'''
import dataclasses
import warnings
warnings.simplefilter("ignore")
from reproarchive.archive.loading import load
from reproarchive.archive.packing import pack
from reproarchive.codec.tensors import AbsentTensor, FIDELITY_ABSENT
from reproarchive.replay.isolation import run_in_child
path = {str(archive)!r}
repro = load(path)
outcome = run_in_child(path, environment=repro.records.environment)
assert outcome.observed and outcome.observed.stage == "crash", outcome.observed
args = [AbsentTensor(tuple(a.shape), a.dtype, tuple(a.stride()), a.storage_offset(), str(a.device), a.requires_grad)
        if f == FIDELITY_ABSENT else a for a, f in zip(repro.args, repro.fidelity)]
pack(repro.gm, args, path, records=dataclasses.replace(repro.records, failure=outcome.observed))
'''
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


def run_ours(launcher: Path, workdir: Path, cache: Path, extra: list[str], log: Path, crash: bool) -> dict[str, Any]:
    exe = [str(Path(sys.executable).parent / "reproarchive")]
    workdir.mkdir(parents=True, exist_ok=True)
    archive, out = workdir / "repro.tar.zst", workdir / "min.tar.zst"
    env = _env(cache)
    pack = _run(exe + ["pack", str(launcher), "-o", str(archive), "-q", "--json"] + (["--no-replay"] if crash else []),
                workdir, env, workdir / "pack.log")
    if crash and pack["rc"] == 0:
        record_crash(archive, env)
    if pack["rc"] != 0:
        return {"tool": "reproarchive", "error": f"pack failed: {pack['output'][-400:]}", "pack_wall_s": pack["wall_s"]}
    res = _run(exe + ["run", "--minify", str(archive), "-o", str(out), "--isolate", "--json", "-q", *extra],
               workdir, env, log)
    try:
        report = json.loads(res["output"][res["output"].index("{"):])
    except ValueError:
        return {"tool": "reproarchive", "error": res["output"][-600:], "wall_s": res["wall_s"], "cpu_s": res["cpu_s"]}
    s = report["stats"]
    node_calls = sum(p["calls"] for name, p in s["passes"].items()
                     if name not in ("shrink_shapes", "narrow_dtypes", "fill_inputs"))
    return {"tool": "reproarchive", "command": f"run --minify --isolate {' '.join(extra)}".strip(),
            "wall_s": res["wall_s"], "cpu_s": res["cpu_s"], "rc": res["rc"],
            "pack_wall_s": pack["wall_s"], "pack_cpu_s": pack["cpu_s"],
            "calls": s["calls"], "node_calls": node_calls, "input_calls": s["calls"] - node_calls,
            "ops_before": s["initial_ops"], "ops_after": s["final_ops"], "final": _forward_ops(report["code"]),
            "minify_wall_s": s["wall_s"], "jobs": s["jobs"], "workers_started": s.get("workers_started"),
            "passes": s["passes"], "inputs": s.get("inputs"), "input_bytes": [s["initial_input_bytes"],
                                                                                s["final_input_bytes"]]}


def run_row(row: str, out_dir: Path, order: int) -> dict[str, Any]:
    root = out_dir / row
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    if row == "strict":
        kind, n, level, text = "accuracy", 6, 4, STRICT_PROGRAM
    else:
        kind, n = row.rsplit("-", 1)
        n, level = int(n), KINDS[kind]
        text = program(kind, n, seed=visible_seed(n, n) if kind == "accuracy" else n)
    (root / "program.py").write_text(text)
    load_before = os.getloadavg()
    dump = _run([sys.executable, "program.py"], root, _env(root / "cache-dump", TORCHDYNAMO_REPRO_AFTER="aot",
                                                           TORCHDYNAMO_REPRO_LEVEL=str(level),
                                                           TORCH_COMPILE_DEBUG_DIR=str(root / "dump")),
                root / "dump.log")
    launcher = _launcher(root / "dump")
    ops_before = len(_forward_ops(launcher.read_text()))
    variants = [([], [])] if row != "strict" else [([], []), (["--strict-accuracy"], ["--strict-accuracy"])]
    results = []
    for k, (theirs, ours_extra) in enumerate(variants):
        tag = f"-{k}" if len(variants) > 1 else ""
        first_torch = (order + k) % 2 == 0
        pair: dict[str, Any] = {}
        for tool in (("torch", "ours") if first_torch else ("ours", "torch")):
            if tool == "torch":
                pair["torch"] = run_torch(launcher.parent, root / f"cache-torch{tag}", theirs, root / f"torch{tag}.log")
            else:
                pair["ours"] = run_ours(launcher, root / f"ours{tag}", root / f"cache-ours{tag}", ours_extra,
                                        root / f"ours{tag}.log", crash=kind == "runtime_error")
        pair["first"] = "torch" if first_torch else "reproarchive"
        pair["variant"] = " ".join(theirs) or "default"
        results.append(pair)
    record = {"row": row, "kind": kind, "ops_before": ops_before, "minimum": 1, "dump_wall_s": dump["wall_s"],
              "load_before": load_before, "load_after": os.getloadavg(), "cores": os.cpu_count(),
              "time": time.strftime("%Y-%m-%d %H:%M:%S"), "results": results}
    (out_dir / f"{row}.json").write_text(json.dumps(record, indent=1, default=str))
    return record


def _cell(x, fmt="{:.0f}") -> str:
    return "–" if x is None else fmt.format(x)


def table(out_dir: Path) -> str:
    rows = [json.loads(p.read_text()) for p in sorted(out_dir.glob("*.json"))]
    rows.sort(key=lambda r: ROWS.index(r["row"]) if r["row"] in ROWS else 99)
    head = ["row", "ops", "torch ops", "torch calls", "torch wall s", "torch CPU s", "ours ops", "ours calls",
            "ours wall s", "ours CPU s", "ours pack s", "wall ours/torch", "load (1 min)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    tw = ow = op = 0.0
    counted = 0
    for r in rows:
        for pair in r["results"]:
            t, o = pair["torch"], pair["ours"]
            label = r["row"] + ("" if pair["variant"] == "default" else f" {pair['variant']}")
            ours_ops = o.get("ops_after")
            ours_calls = f"{o['calls']} ({o['node_calls']}+{o['input_calls']})" if "calls" in o else "–"
            ratio = f"{o['wall_s'] / t['wall_s']:.0%}" if o.get("wall_s") and t.get("wall_s") else "–"
            load = f"{r['load_before'][0]:.1f} → {r['load_after'][0]:.1f}"
            t_ops = _cell(t.get("ops_after")) + (f" ({','.join(t['final'])})" if t.get("final") else "")
            o_ops = _cell(ours_ops) + (f" ({','.join(o['final'])})" if o.get("final") else "")
            lines.append("| " + " | ".join([label, str(r["ops_before"]), t_ops, _cell(t.get("calls")),
                                            _cell(t.get("wall_s")), _cell(t.get("cpu_s")), o_ops, ours_calls,
                                            _cell(o.get("wall_s")), _cell(o.get("cpu_s")),
                                            _cell(o.get("pack_wall_s")), ratio, load]) + " |")
            if r["row"] != "strict":
                counted += 1
                tw += t.get("wall_s") or 0
                ow += o.get("wall_s") or 0
                op += o.get("pack_wall_s") or 0
    if tw:
        lines.append("")
        lines.append(f"total wall time ({counted} rows but strict): PyTorch {tw:.0f} s, reproarchive {ow:.0f} s "
                     f"({ow / tw:.0%}), {ow + op:.0f} s with pack ({(ow + op) / tw:.0%})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--row", action="append", default=[])
    parser.add_argument("--all", action="store_true")
    parser.add_argument("--skip-done", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("minify-inductor-results"))
    parser.add_argument("--table", type=Path)
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(ROWS))
        return 0
    if args.table:
        print(table(args.table))
        return 0
    rows = ROWS if args.all else args.row
    if not rows:
        parser.error("pass --row, --all, --list or --table")
    args.out.mkdir(parents=True, exist_ok=True)
    for row in rows:
        if row not in ROWS:
            parser.error(f"unknown row {row!r}; --list shows them")
        if args.skip_done and (args.out / f"{row}.json").exists():
            continue
        print(f"[{time.strftime('%H:%M:%S')}] {row} (load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
        record = run_row(row, args.out, ROWS.index(row))
        for pair in record["results"]:
            t, o = pair["torch"], pair["ours"]
            print(f"  {pair['variant']}: torch {t.get('ops_after')} ops {t.get('calls')} calls {t.get('wall_s')} s | "
                  f"ours {o.get('ops_after')} ops {o.get('calls')} calls {o.get('wall_s')} s {o.get('error', '')}",
                  file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
