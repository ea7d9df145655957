"""Side by side on the same planted bug: ``reproarchive bisect compiler`` against PyTorch's own
``python -m torch._inductor.compiler_bisector run``.

    python benchmarks/bisect_compiler_bench.py [--json] [--out FILE.json]

The bug is the one tests/bisect plant (PyTorch's test_compiler_bisector.py style): a custom
post-grad pass that makes the one ``x * 3 + 1`` add 2 instead, on CPU inductor.

* reproarchive: the failure is captured once (``reproarchive.capture`` around the custom backend
  ``support.bisect_bugs:post_grad_bug``, accuracy on) and ``bisect_compiler`` replays it.
* PyTorch: ``compiler_bisector run python test_bug.py``, where ``test_bug.py`` is the script its
  own help text describes (compile with ``$TORCH_COMPILE_BACKEND``, compare with eager by
  ``allclose``, exit 0 when they agree), with the same pass set as ``post_grad_custom_post_pass``;
  each run appends a line to a counter file, which is how its replays are counted.

Both run one after the other in the same process tree, each with a fresh inductor cache folder
of its own (PyTorch's ``run`` keeps its state in the cache folder and removes that whole folder
when it starts and ends, so it must not get the user's), ``TORCHINDUCTOR_COMPILE_THREADS=1``.
Reported per tool: replays, wall time, and the backend / subsystem / bisect number named.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

_TEST_SCRIPT = """
import os, sys
import torch
from torch._inductor import config
sys.path.insert(0, {tests!r})
from support.bisect_bugs import CorruptAddOperand, scaled_sin

with open({counter!r}, "a") as f:
    f.write("run\\n")
torch._dynamo.reset()
torch.manual_seed(0)
x = torch.randn(8)
with config.patch(post_grad_custom_post_pass=CorruptAddOperand()):
    compiled = torch.compile(scaled_sin, backend=os.environ.get("TORCH_COMPILE_BACKEND", "inductor"))(x)
sys.exit(0 if torch.allclose(compiled, scaled_sin(x), rtol=1e-4, atol=1e-4) else 1)
"""


def _env(cache: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_BISECT_")}
    env.update(TORCHINDUCTOR_CACHE_DIR=cache, TORCHINDUCTOR_COMPILE_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    return env


def run_ours(work: Path) -> dict:
    """Capture the planted failure, then ``bisect compiler`` it in a fresh process (the CLI)."""
    import torch

    import reproarchive
    from support import bisect_bugs

    archive = work / "post_grad.tar.zst"
    torch._dynamo.reset()
    compiled = torch.compile(bisect_bugs.scaled_sin, backend=reproarchive.capture(
        bisect_bugs.post_grad_bug, path=archive, accuracy=True))
    try:
        compiled(torch.randn(8))
    except Exception:  # noqa: BLE001 - the planted accuracy failure, archived
        pass
    assert archive.exists(), "the planted bug was not captured"
    cache = tempfile.mkdtemp(prefix="bench-ours-cache-", dir=work)
    code = "import sys; from reproarchive.cli import main; sys.exit(main())"
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, "bisect", "compiler", str(archive), "--backend",
                           bisect_bugs.POST_GRAD_BACKEND, "--json", "--no-sidecar"],
                          env=_env(cache), capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - start
    result = json.loads(done.stdout)
    return {"tool": "reproarchive bisect compiler", "replays": result["replays"], "wall_s": round(wall, 1),
            "backend": result["backend"], "subsystem": result["subsystem"],
            "bisect_number": result["bisect_number"], "debug_info": result["debug_info"],
            "exit_code": done.returncode}


def run_torch(work: Path) -> dict:
    counter = work / "torch_runs.txt"
    script = work / "test_bug.py"
    script.write_text(textwrap.dedent(_TEST_SCRIPT.format(tests=str(ROOT / "tests"), counter=str(counter))))
    cache = tempfile.mkdtemp(prefix="bench-torch-cache-", dir=work)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "torch._inductor.compiler_bisector", "run", sys.executable,
                           str(script)], env=_env(cache), capture_output=True, text=True, timeout=3600, cwd=work)
    wall = time.perf_counter() - start
    found = re.search(r"BisectionResult\(backend='([^']*)', subsystem=(?:'([^']*)'|None), bisect_number=(\w+), "
                      r"debug_info=(?:'([^']*)'|None)\)", done.stdout)
    runs = len(counter.read_text().splitlines()) if counter.exists() else 0
    return {"tool": "torch._inductor.compiler_bisector run", "replays": runs, "wall_s": round(wall, 1),
            "backend": found.group(1) if found else None, "subsystem": found.group(2) if found else None,
            "bisect_number": int(found.group(3)) if found and found.group(3).isdigit() else None,
            "debug_info": found.group(4) if found else None, "exit_code": done.returncode,
            "cache_folder_left": os.path.exists(cache)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON lines as well")
    parser.add_argument("--out", help="write the rows to this JSON file")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bisect-bench-") as tmp:
        rows = [run_ours(Path(tmp)), run_torch(Path(tmp))]
    same = all(rows[0][k] == rows[1][k] for k in ("backend", "subsystem", "bisect_number"))
    print("| tool | replays | wall s | backend | subsystem | bisect number | debug info |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['tool']} | {r['replays']} | {r['wall_s']} | {r['backend']} | {r['subsystem']} | "
              f"{r['bisect_number']} | {r['debug_info']} |")
    print(f"same stage named: {same}")
    if args.json:
        for r in rows:
            print(json.dumps(r))
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "same_stage": same}, indent=1) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
