"""The built-in example behind ``reproarchive demo``: the whole story on one real failure.

A small model is compiled with the real inductor backend while PyTorch's own testing bug
injector (``torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY``) makes inductor emit C++
that does not compile for ``relu``. The failure is captured into an archive, verified,
inspected, replayed in this process *after the injected setting has been removed* (so it only
reproduces because replay applies the recorded config), and minified to the one op that
breaks. Then a native crash: a program whose kernel aborts the whole process (the injector's
``runtime_error``, a C++ ``throw`` inside an OpenMP loop) still leaves an archive, written
before the kernel ran, and ``run`` replays it in a child process, so the crash becomes a
verdict instead of taking the demo down. Each step checks what it should see, so the demo
doubles as a smoke test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import torch

import reproarchive
from reproarchive import ReproArchiveError
from reproarchive.compat import dynamo, inductor

INJECTOR = "cpp.inject_relu_bug_TESTING_ONLY"


class DemoModel(torch.nn.Module):
    """A transformer-style MLP block: 30-odd FX nodes, one of them the relu inductor breaks on."""

    def __init__(self, dim: int = 32):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.up = torch.nn.Linear(dim, 4 * dim)
        self.down = torch.nn.Linear(4 * dim, dim)
        self.gate = torch.nn.Linear(dim, dim)

    def forward(self, x):
        h = self.norm(x)
        u = torch.nn.functional.gelu(self.up(h))
        d = self.down(u)
        g = torch.sigmoid(self.gate(h))
        y = x + d * g
        return torch.relu(y).mean(dim=-1) + y.abs().amax(dim=-1)


def _failed(what: str) -> ReproArchiveError:
    """A step of the demo did not see what it should (exit 2, like any error of ours)."""
    return ReproArchiveError(f"demo step failed: {what}")


def run_demo(out_dir: str | Path, *, say: Callable[[str], None] = print, minify: bool = True) -> dict:
    """Run every step; returns the paths and outcomes. Raises ReproArchiveError on a surprise."""

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    archive = out / "repro.tar.zst"
    minified = out / "repro.min.tar.zst"
    for stale in (archive, minified):
        stale.unlink(missing_ok=True)
    started = time.monotonic()
    step = lambda text: say(f"\n[{time.monotonic() - started:5.1f}s] {text}")  # noqa: E731

    step("1. compile a small model with inductor while PyTorch's relu bug injector is on")
    _capture_demo(archive, say)

    step(f"2. reproarchive verify {archive}")
    report = reproarchive.verify(archive)
    say(f"   ok: format {report.format}, {report.blobs} blobs, index digest {report.digest[:23]}...")

    step(f"3. reproarchive inspect {archive}")
    info = reproarchive.inspect(archive)
    say(f"   graph: {info.graph.nodes} nodes, {info.graph.ops} ops; inputs: {len(info.inputs)} "
        f"({sum(1 for r in info.inputs if r.fidelity.startswith('real'))} with real data)")
    say(f"   failure: {getattr(info.failure, 'stage', None)} {getattr(info.failure, 'exception_type', None)}")
    changed = (info.config_changed or {}).get("torch._inductor.config", {})
    say(f"   recorded config: {INJECTOR} = {changed.get(INJECTOR)!r}")
    if inductor.config_value(INJECTOR) is not None:
        raise _failed("the injector is still set in this process")

    step(f"4. reproarchive run {archive}   (the injector is NOT set here; the archive's config is)")
    outcome = reproarchive.run(archive)
    say(f"   {outcome.status.upper()} (exit {outcome.exit_code}): {outcome.kind}")
    if outcome.exit_code != 1:
        raise _failed(f"replay should reproduce the failure (exit 1), got {outcome.status}")

    result = {"archive": str(archive), "run": outcome.to_dict()}
    if minify:
        step(f"5. reproarchive run --minify {archive} -o {minified}")
        result.update(minified=str(minified), minify=_minify_demo(archive, minified, say))
    step("6. a native crash: the same injector makes the kernel throw, and the process aborts")
    crashed = out / "crash.tar.zst"
    result["crash"] = _crash_demo(crashed, say)

    say(f"\ndone in {time.monotonic() - started:.1f}s: send {archive.name}"
        + (f" (or {minified.name}) " if minify else " ") + "to a teammate; they run `reproarchive run` on it.")
    return result


def _capture_demo(archive: Path, say: Callable[[str], None]) -> None:
    """Step 1: compile DemoModel with the relu bug injected; the failure must be captured into ``archive``."""

    torch.manual_seed(0)
    model = DemoModel()
    x = torch.randn(8, 32)
    compiled = torch.compile(model, backend=reproarchive.capture("inductor", path=archive))
    # inference: inductor compiles the forward graph alone, without a joint forward/backward
    # graph to trace and partition, and so does every replay of the archive (its inputs need no
    # grad): the same failure, a few seconds less (46.7 -> 42.1-44.2 s on 2 cores)
    with inductor.patched_config({INJECTOR: "compile_error"}), torch.no_grad():
        try:
            compiled(x)
        except Exception as exc:  # noqa: BLE001 - the failure is the point
            say(f"   torch.compile failed as expected: {type(exc).__name__}")
        else:
            raise _failed("the injected inductor bug did not make torch.compile fail")
    dynamo.reset()
    if not archive.exists():
        raise _failed(f"capture did not write {archive}")
    say(f"   captured into {archive} ({archive.stat().st_size} bytes)")


def _minify_demo(archive: Path, minified: Path, say: Callable[[str], None]) -> dict:
    """Step 5: minify ``archive`` into ``minified``, which must be smaller and still fail; returns the stats."""

    rep = reproarchive.minify_archive(archive, minified)
    s = rep.stats
    say(f"   {s['initial_ops']} ops -> {s['final_ops']} ops in {s['calls']} replays "
        f"({s['cache_hits']} answered from the memo), {s['wall_s']:.1f}s")
    say("   the minimized graph:")
    for line in rep.code.strip().splitlines():
        say(f"     {line}")
    again = reproarchive.run(minified)
    say(f"   reproarchive run {minified}: {again.status.upper()} (exit {again.exit_code})")
    if again.exit_code != 1 or s["final_ops"] >= s["initial_ops"]:
        raise _failed("the minified archive must be smaller and still reproduce")
    return s


# The crashing program runs in its own process: the crash is real and ends that process.
_CRASHING_PROGRAM = """
import sys, torch, reproarchive
torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY = "runtime_error"
def f(a):
    return torch.relu(a + 1) * 2
torch.compile(f, backend=reproarchive.capture("inductor", path=sys.argv[1]))(torch.randn(1 << 16))
"""


def _crash_demo(archive: Path, say: Callable[[str], None]) -> dict:
    archive.unlink(missing_ok=True)
    # The injected kernel throws inside its OpenMP loop; with one OpenMP thread that loop runs on
    # the calling thread and the throw becomes a Python RuntimeError instead of an abort. Two
    # threads (recorded with the archive's environment, so the replay gets them too) keep the
    # crash a crash on a one-core machine or under OMP_NUM_THREADS=1.
    env = dict(os.environ)
    if not env.get("OMP_NUM_THREADS", "").isdigit() or int(env["OMP_NUM_THREADS"]) < 2:
        env["OMP_NUM_THREADS"] = "2"
    done = subprocess.run([sys.executable, "-c", _CRASHING_PROGRAM, str(archive)], capture_output=True, text=True,
                          env=env)
    if done.returncode >= 0:
        raise _failed(f"the crashing program did not crash (exit {done.returncode})")
    say(f"   the program was killed by {signal.Signals(-done.returncode).name}; it left {archive} "
        f"({archive.stat().st_size if archive.exists() else 0} bytes): prepared before the kernel ran, "
        "completed by its guardian process when it died")
    if not archive.exists():
        raise _failed("the crashing program left no archive")
    reproarchive.verify(archive)
    say(f"   reproarchive run {archive}   (replayed in a child process)")
    outcome = reproarchive.run(archive)
    observed = outcome.observed
    say(f"   {outcome.status.upper()} (exit {outcome.exit_code}): {outcome.kind}, "
        f"{observed.exception_type if observed else '-'}" + (", isolated" if outcome.isolated else ""))
    for line in (observed.message.splitlines()[1:2] if observed else []):
        say(f"   the crashed process said: {line}")
    if outcome.exit_code != 1 or not outcome.isolated:
        raise _failed(f"the crash should reproduce in a child process (exit 1), got {outcome.status}")
    return {"archive": str(archive), "run": outcome.to_dict()}
