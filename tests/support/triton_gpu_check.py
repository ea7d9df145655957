"""User Triton kernels on a GPU, checked by hand or by the device tool (the suite runs the same
paths on CPU through Triton's interpreter, ``tests/codec/test_triton_kernels.py``):

    OMP_NUM_THREADS=1 python tests/support/triton_gpu_check.py

1. a CUDA compile of a function launching three user kernels (one autotuned over two
   configurations, one writing in place) fails in inductor (``triton.inject_relu_bug_TESTING_ONLY``):
   the archive records the three kernels and what each launch wrote, and verifies;
2. `run` with stand-ins (no kernel here) reproduces the compile error: inductor compiled around them;
3. `run --import tests.support.triton_kernels` reproduces it with the real kernels (no stand-in);
4. a runtime failure after the launches (``relu_runtime_error_TESTING_ONLY``) reproduces with
   stand-ins (they run, on cuda) and with the real kernels;
5. `doctor` names the kernels that are not here;
Prints one line per check; exit 1 if any fails. (A minification of the inductor compile error is
left out: each candidate is a CUDA inductor compile, and it did not finish in 7 minutes.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from reproarchive.cli import main; main()", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=400, env=dict(os.environ, OMP_NUM_THREADS="1"))


def capture(backend: str, folder: Path, *, inject: bool) -> Path:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    code = ("import torch._inductor.config as c; c.triton.inject_relu_bug_TESTING_ONLY = 'compile_error'; "
            if inject else "") + "import runpy; runpy.run_module('tests.support.triton_program', run_name='__main__')"
    subprocess.run([sys.executable, "-c", code, backend, str(folder), "cuda"], cwd=ROOT, env=env, timeout=400,
                   capture_output=True, text=True)
    found = sorted(folder.glob("*.tar.zst"))
    if not found:
        raise SystemExit(f"FAIL no archive from {backend}")
    return found[0]


def main() -> int:
    ok = True

    def check(name: str, passed: bool, detail) -> None:
        nonlocal ok
        ok &= passed
        print(f"{'ok  ' if passed else 'FAIL'} {name}: {detail}", flush=True)

    def outcome(*args: str) -> dict:
        proc = cli("run", "--json", *args)
        try:
            return json.loads(proc.stdout)
        except ValueError:
            return {"status": f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"}

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        archive = capture("inductor", tmp / "compile", inject=True)
        from reproarchive.format.reader import ContainerReader

        with ContainerReader(archive) as reader:
            kernels = reader.index.triton_kernels or ()
            summary = [(k.name, len(k.configs), [sorted(c.written) for c in k.calls]) for k in kernels]
        verified = cli("verify", str(archive))
        check("1 archive of a CUDA compile error with 3 user kernels", len(kernels) == 3 and verified.returncode == 0,
              f"{summary}; verify exit {verified.returncode}")
        result = outcome(str(archive))
        check("2 run, stand-ins, inductor",
              result.get("status") == "reproduced" and len(result.get("stand_ins", [])) == 3,
              f"{result.get('status')}, stand-ins {result.get('stand_ins')}")
        result = outcome(str(archive), "--import", "tests.support.triton_kernels")
        check("3 run --import (real kernels)", result.get("status") == "reproduced" and not result.get("stand_ins"),
              f"{result.get('status')}, stand-ins {result.get('stand_ins')}")
        runtime = capture("relu_runtime_error_TESTING_ONLY", tmp / "runtime", inject=False)
        a = outcome(str(runtime))
        b = outcome(str(runtime), "--import", "tests.support.triton_kernels")
        check("4 runtime failure after the launches", a.get("status") == b.get("status") == "reproduced",
              f"stand-ins: {a.get('status')}; real kernels: {b.get('status')}")
        doctor = cli("doctor", str(archive))
        check("5 doctor names the missing kernels", doctor.stdout.count("triton kernel") >= 3,
              f"exit {doctor.returncode}, {doctor.stdout.count('triton kernel')} kernel rows")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
