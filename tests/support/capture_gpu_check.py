"""Capture of CUDA jobs (spooled device storages), checked on a machine with a GPU, by hand or by the device tool:

    python tests/support/capture_gpu_check.py          # every check
    python tests/support/capture_gpu_check.py 2b 4a    # some (keys: 1, 2a, 2b, 3a, 3b, 4a, 4b)

1. a Triton compile error under ``capture("inductor")`` on cuda: an archive that verifies, holds the
   input's bytes, and replays to the same failure on cuda;
2. a device-side assert in a Triton kernel (a poisoned CUDA context: the inputs cannot be read
   after it), under ``capture("inductor")`` and under ``reproarchive capture --``: the program
   fails as it would without capture, and leaves an archive that verifies, whose every real
   storage is the job's bytes (the rest absent, said so);
3. a process that aborts during a CUDA graph's first call, at once and after a few seconds: the
   guardian completes an archive that verifies; what it calls real is the job's bytes, and
   after a few seconds every weight is there (written while the call ran);
4. training steps of a 1 GiB model with ``capture("eager")`` and ``capture("inductor")``: the peak
   device memory is plain's (capture takes none on the device but the seed of the inductor
   check's backward, the size of the graph's output), the host staging buffers are pinned, and
   the first calls' waits for the spool are reported.
Prints one line per check; exit 1 if any fails.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import reproarchive  # noqa: E402
from support.captures import archives_after_death  # noqa: E402

MIB = 1 << 20
#: a dry run of the script's own code elsewhere: CAPTURE_CHECK_DEVICE=cpu (checks 1 and 2 then fail)
DEVICE = os.environ.get("CAPTURE_CHECK_DEVICE", "cuda")
BIG_BLOCKS = int(os.environ.get("CAPTURE_CHECK_BLOCKS", "64"))  # 64 MiB each

# A job whose parameters' digests are written beside it before anything is compiled, so that
# a checker can tell real bytes in an archive from anything else.
_JOB = """
import hashlib, json, os, sys, time, torch
import reproarchive
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096, device="{device}") for _ in range({blocks})], torch.nn.ReLU())
x = torch.randn(64, 4096, device="{device}")
digests = [hashlib.sha256(p.detach().cpu().numpy().tobytes()).hexdigest() for p in model.parameters()]
digests.append(hashlib.sha256(x.cpu().numpy().tobytes()).hexdigest())
open(sys.argv[2], "w").write(json.dumps(digests))
{setup}
compiled = torch.compile(model, backend={backend})
try:
    out = compiled(x)
    getattr(torch, "{device}").synchronize() if "{device}" != "cpu" else None
except Exception as err:
    print("RAISED", type(err).__name__, str(err).splitlines()[0][:200], flush=True)
    sys.exit(3)
print("NO FAILURE", flush=True)
"""

_ABORTING = """
import os, time

def abort_after(seconds):
    def backend(gm, example_inputs):
        def run(*args):
            time.sleep(seconds)
            os.abort()
        return run
    return backend

at_once = abort_after(0.0)
after_a_while = abort_after(6.0)
"""


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().cpu().contiguous().numpy().tobytes()).hexdigest()


def _job(tmp: Path, name: str, *, blocks: int, backend: str, setup: str = "",
         under_capture: bool = False) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """Run ``_JOB`` compiled with ``capture(backend)``, or with ``backend`` itself under
    ``reproarchive capture --`` (``under_capture``); its archives go to the folder returned."""
    folder = tmp / name
    folder.mkdir()
    (folder / "aborting.py").write_text(_ABORTING)
    archives, digests = folder / "archives", folder / "digests.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDYNAMO_REPRO")}
    started = time.perf_counter()
    program = [sys.executable, "job.py", str(archives), str(digests)]
    if under_capture:
        program = [sys.executable, "-c", "from reproarchive.cli import main; main()", "capture", "-q", "-o",
                   str(archives), "--", *program]
    else:
        backend = f"reproarchive.capture({backend}, path=sys.argv[1])"
    (folder / "job.py").write_text(textwrap.dedent(_JOB).format(blocks=blocks, backend=backend, setup=setup,
                                                                 device=DEVICE))
    done = subprocess.run(program, cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    print(f"     ({name}: exit {done.returncode} in {time.perf_counter() - started:.1f} s; "
          f"{(done.stdout.strip().splitlines() or ['no output'])[-1][:160]})", flush=True)
    return done, archives, digests


def _honest(archive: Path, digests: Path) -> tuple[bool, str]:
    """Whether every storage the archive calls real holds the job's bytes (parameters, then the
    input, in the order the job wrote them): (ok, how many of each fidelity)."""
    repro = reproarchive.load(archive, device="cpu")
    expected = set(json.loads(digests.read_text()))
    wrong = [i for i, (arg, fidelity) in enumerate(zip(repro.args, repro.fidelity))
             if fidelity == "real" and isinstance(arg, torch.Tensor) and _digest(arg) not in expected]
    counts = {f: repro.fidelity.count(f) for f in sorted(set(repro.fidelity))}
    return not wrong, f"{counts}, not the job's bytes: {wrong}"


def main() -> int:
    ok = True

    def check(name: str, passed: bool, detail) -> None:
        nonlocal ok
        ok &= bool(passed)
        print(f"{'ok  ' if passed else 'FAIL'} {name}: {detail}", flush=True)

    def attempt(name, fn):
        try:
            fn()
        except Exception as err:  # noqa: BLE001 - a check that breaks is a failed check, and the rest run
            check(name, False, f"{type(err).__name__}: {err}\n{traceback.format_exc()[-1500:]}")

    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0) if DEVICE == 'cuda' else DEVICE}", flush=True)
    # a writer a failed check left running may still be finishing in it: cleaning up must not hide the verdicts
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        tmp = Path(tmp)

        def compile_error():
            torch._dynamo.reset()
            x = torch.randn(1 << 16, device=DEVICE)
            with torch._inductor.config.patch({"triton.inject_relu_bug_TESTING_ONLY": "compile_error"}):
                try:
                    torch.compile(lambda a: torch.relu(a + 1) * 2, backend=reproarchive.capture(
                        "inductor", path=tmp / "c1"))(x)
                    raised = None
                except Exception as err:  # noqa: BLE001
                    raised = type(err).__name__
            (archive,) = sorted((tmp / "c1").glob("*.tar.zst"))
            reproarchive.verify(archive)
            repro = reproarchive.load(archive)
            same = repro.args[0].device.type == DEVICE and torch.equal(repro.args[0], x)
            outcome = reproarchive.run(archive)
            check("1 Triton compile error on cuda", raised and same and outcome.status == "reproduced"
                  and outcome.device.startswith(DEVICE), f"raised {raised}; input on {repro.args[0].device}, "
                  f"same bytes {same}; run: {outcome.status} on {outcome.device}")

        def device_assert(under_capture: bool):
            setup = 'torch._inductor.config.triton.inject_relu_bug_TESTING_ONLY = "runtime_error"'
            name = "assert-under-capture" if under_capture else "assert"
            done, archives, digests = _job(tmp, name, blocks=16, backend='"inductor"', setup=setup,
                                           under_capture=under_capture)
            found = sorted(archives.glob("*.tar.zst")) if archives.exists() else []
            left = sorted(p.name for p in archives.glob("*")) if archives.exists() else []
            if not found:
                check(f"2 {name}", False, f"exit {done.returncode}, no archive (left {left}); stderr:\n"
                      f"{done.stderr[-1500:]}")
                return
            reproarchive.verify(found[0])
            honest, counts = _honest(found[0], digests)
            failure = reproarchive.load(found[0]).records.failure
            check(f"2 {name}", done.returncode == 3 and honest and len(found) == 1,
                  f"exit {done.returncode}, {len(found)} archive(s), stage {failure.stage} "
                  f"{failure.exception_type}: {failure.message[:120]!r}; {counts}")

        def aborts(name: str, backend: str, all_written: bool):
            done, archives, digests = _job(tmp, name, blocks=BIG_BLOCKS, backend=backend)
            found = archives_after_death(archives, timeout=240) if archives.exists() else []
            if len(found) != 1:
                check(f"3 abort {name}", False, f"exit {done.returncode}, archives {found}; {done.stderr[-1500:]}")
                return
            reproarchive.verify(found[0])
            honest, counts = _honest(found[0], digests)
            complete = reproarchive.load(found[0], device="cpu").fidelity.count("absent") == 0
            check(f"3 abort {name}", done.returncode == -6 and honest and (complete or not all_written),
                  f"exit {done.returncode}; {counts}")

        def memory(backend: str):
            torch._dynamo.reset()
            torch.manual_seed(0)
            model = torch.nn.Sequential(*[m for _ in range(16) for m in (torch.nn.Linear(4096, 4096, device=DEVICE),
                                                                           torch.nn.ReLU())])
            inputs = [torch.randn(n, 4096, device=DEVICE) for n in (8, 16)]
            from reproarchive.sources.capture import process_spool

            waited = []
            wait = process_spool.ProcessSpool.wait

            def timed(self, name, **options):
                started = time.perf_counter()
                try:
                    return wait(self, name, **options)
                finally:
                    waited.append(time.perf_counter() - started)

            def steps(compiled) -> tuple[int, float]:
                cuda = torch.cuda if DEVICE == "cuda" else None
                if cuda:
                    cuda.synchronize()
                    cuda.reset_peak_memory_stats()
                base = cuda.memory_allocated() if cuda else 0
                started = time.perf_counter()
                for x in inputs:
                    compiled(x).sum().backward()
                    model.zero_grad(set_to_none=True)
                if cuda:
                    cuda.synchronize()
                return (cuda.max_memory_allocated() - base if cuda else 0), time.perf_counter() - started

            plain, plain_s = steps(torch.compile(model, backend=backend))
            torch._dynamo.reset()
            process_spool.ProcessSpool.wait = timed
            try:
                captured, captured_s = steps(torch.compile(model, backend=reproarchive.capture(
                    backend, path=tmp / f"m-{backend}")))
            finally:
                process_spool.ProcessSpool.wait = wait
            buffers = [b for s in process_spool._spools.values() for b in s.spool.staging.buffers]
            pinned = all(b.is_pinned() for b in buffers) and (buffers or DEVICE == "cpu")
            # the one device allocation capture may make: the seed of the check's backward, the
            # size of the graph's output (eager's first call is its own check: none)
            seed = max(x.numel() for x in inputs) * 4 if backend != "eager" else 0
            check(f"4 {backend}: device memory and staging", captured <= plain + seed and pinned,
                  f"peak above the model: plain {plain / 1024:,.0f} KiB, capture {captured / 1024:,.0f} KiB "
                  f"(allowed: plain + {seed / 1024:.0f} KiB); "
                  f"{len(buffers)} pinned staging buffer(s) of {sum(b.numel() for b in buffers) / MIB:.0f} MiB; "
                  f"first calls {plain_s:.2f} s plain, {captured_s:.2f} s capture, of which waits for the "
                  f"spool {sum(waited):.2f} s ({len(waited)})")

        checks = {
            "1": ("1 Triton compile error on cuda", compile_error),
            "2a": ("2 device-side assert", lambda: device_assert(False)),
            "2b": ("2 device-side assert under capture --", lambda: device_assert(True)),
            "3a": ("3 abort at once", lambda: aborts("at_once", "__import__('aborting').at_once", False)),
            "3b": ("3 abort after a while", lambda: aborts("after_a_while", "__import__('aborting').after_a_while",
                                                           True)),
            "4a": ("4 eager", lambda: memory("eager")),
            "4b": ("4 inductor", lambda: memory("inductor")),
        }
        for key in sys.argv[1:] or checks:
            attempt(*checks[key])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
