"""Small failing torch.compile jobs that write real TORCH_TRACE logs.

Each job runs in a subprocess with TORCH_TRACE set, as a user's training job would, and fails
in each of these ways: a compile error, a runtime error, an accuracy failure, a graph break
leaving several compiles, dynamic shapes with a recompile, an Inductor compile error whose
inputs TORCH_COMPILE_DEBUG_SAVE_REAL kept, and an Inductor compile error inside a ``torch.cond``
branch. PyTorch's own bug-injecting backends keep them cheap (no Inductor) except the last two.
The jobs save the tensors they compiled (``inputs.pt``) so tests can compare what an archive
holds with what the job really passed.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

# A module with parameters (Dynamo lifts them to graph inputs, requires_grad) and a strided
# view input, so the logged describe_tensor records carry more than a plain shape.
_MODEL = """
import torch
torch.manual_seed(0)

class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, y):
        return torch.relu(self.lin(x) + y).sum(1)

m = M()
x = torch.randn(3, 4)
base = torch.randn(3, 8)
y = base[:, ::2]
torch.save({"x": x, "y": y, "weight": m.lin.weight.detach()}, "inputs.pt")
"""

PROGRAMS = {
    "compile_error": _MODEL + textwrap.dedent("""
        torch.compile(m, backend="relu_compile_error_TESTING_ONLY")(x, y)
    """),
    "runtime_error": _MODEL + textwrap.dedent("""
        torch.compile(m, backend="relu_runtime_error_TESTING_ONLY")(x, y).sum().backward()
    """),
    "accuracy": _MODEL + textwrap.dedent("""
        out = torch.compile(m, backend="relu_accuracy_error_TESTING_ONLY")(x, y)
        if not torch.allclose(out, m(x, y)):
            raise SystemExit("compiled result differs from eager")
    """),
    # the print breaks the graph: [0/0] (cos) compiles, [1/0] (relu, in the resume function) fails
    "graph_break": textwrap.dedent("""
        import torch

        def f(x):
            y = torch.cos(x) * 2
            print("step")
            return torch.relu(y) + 1

        torch.compile(f, backend="relu_compile_error_TESTING_ONLY")(torch.randn(5, 3))
    """),
    # three sizes: [0/0] static, then a recompile with a dynamic size s77 ([0/1], [0/2]); the
    # job catches the errors and goes on, as a training loop with suppressed errors would
    "dynamic": textwrap.dedent("""
        import torch

        def f(x):
            return torch.relu(torch.cos(x) * x.shape[0]).sum(0)

        c = torch.compile(f, backend="relu_compile_error_TESTING_ONLY")
        for n in (3, 4, 5):
            try:
                c(torch.randn(n, 6))
            except Exception as err:
                print("failed", n, type(err).__name__)
        raise SystemExit(1)
    """),
    # Inductor with its C++ relu bug, under TORCH_COMPILE_DEBUG with real tensors saved: the
    # trace goes to torch_compile_debug/tlparse/, the runnable with data to run_*/torchinductor/;
    # the dropout puts Inductor's random-number operators into the logged AOT graph
    "inductor_real": textwrap.dedent("""
        import torch
        torch.manual_seed(0)
        torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY = "compile_error"

        def f(a, b):
            return torch.relu(torch.nn.functional.dropout(a @ b, 0.5, True) + 1).sum(1)

        a = torch.randn(3, 4)
        b = torch.randn(4, 5)
        torch.save({"a": a, "b": b}, "inputs.pt")
        torch.compile(f, backend="inductor")(a, b)
    """),
    # a torch.cond whose true branch holds the relu, under Inductor with its C++ relu bug: the log's
    # fx_graph_runnable is not Python (PyTorch prints the branches as `<lambda>()`), so the
    # archive is made from the Dynamo graph with its subgraphs (under TORCH_COMPILE_DEBUG too, whose
    # saved data belongs to that runnable)
    "hop_inductor": textwrap.dedent("""
        import torch
        torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY = "compile_error"

        def f(a):
            return torch.cond(a.sum() > 0, lambda t: torch.relu(t + 1), lambda t: t - 1, (a,)).sum(1)

        torch.compile(f, backend="inductor")(torch.ones(3, 5))
    """),
}

TRACE_DIR = "trace"
#: jobs run under TORCH_COMPILE_DEBUG with their real tensors saved (their trace goes beside them)
DEBUG_JOBS = ("inductor_real", "hop_inductor")


def start(folder: Path, name: str) -> subprocess.Popen:
    """Start job ``name`` in ``folder`` with TORCH_TRACE=folder/trace (or TORCH_COMPILE_DEBUG for
    ``DEBUG_JOBS``); the caller waits, so several jobs can run at once."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "job.py").write_text(PROGRAMS[name])
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TORCHDYNAMO_REPRO", "TORCH_COMPILE_DEBUG", "TORCH_TRACE", "TORCH_LOGS"))}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if name in DEBUG_JOBS:
        # torch 2.13 and later trace into torch_compile_debug/tlparse under TORCH_COMPILE_DEBUG by
        # themselves; older releases only where TORCH_TRACE says
        env.update(TORCH_COMPILE_DEBUG="1", TORCH_COMPILE_DEBUG_SAVE_REAL="1",
                   TORCH_TRACE=str(trace_of(folder, name)))
    else:
        env["TORCH_TRACE"] = str(folder / TRACE_DIR)
    return subprocess.Popen([sys.executable, "job.py"], cwd=folder, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def trace_of(folder: Path, name: str) -> Path:
    """The folder the job's trace went to."""
    return folder / ("torch_compile_debug/tlparse" if name in DEBUG_JOBS else TRACE_DIR)


def finish(proc: subprocess.Popen, folder: Path, name: str, timeout: float = 300) -> Path:
    out, err = proc.communicate(timeout=timeout)
    if proc.returncode == 0:
        raise AssertionError(f"job {name} did not fail:\n{err[-2000:]}")
    trace = trace_of(folder, name)
    if not any(trace.glob("*.log")):
        raise AssertionError(f"job {name} wrote no TORCH_TRACE log in {trace}:\n{err[-2000:]}")
    return trace


def recorded_on_cuda(log: Path, folder: Path) -> Path:
    """A copy of ``log`` (alone: no data beside it) as the same job on ``cuda:0`` would have
    logged it: the placeholders' annotations (``f32[3, 4][4, 1]cuda:0``), Dynamo's
    ``describe_tensor`` devices, the graphs' device constants and the runnable's storages name
    the GPU. The bytes are this
    machine's CPU job otherwise; what a test of it shows is how the pack treats a device this
    machine lacks, not anything of a GPU compile."""
    text = log.read_text(encoding="utf-8")
    text = text.replace("device(type='cpu')", "device(type='cuda', index=0)")
    text = re.sub(r'(\]\[[0-9, ]*\])cpu"', r'\1cuda:0"', text)
    # the runnable's load_args name a storage's device only off the CPU
    text = re.sub(r"reader\.storage\((\w+), (\d+)\)", r"reader.storage(\1, \2, device=device(type='cuda', index=0))",
                  text)
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / log.name
    out.write_text(_resealed(text), encoding="utf-8")
    return out


def _resealed(text: str) -> str:
    """``text`` with each payload's MD5 (the envelope's ``has_payload``) made to match the edited
    payload: the tab-indented lines after the envelope, without their tab, joined by newlines."""
    lines = text.split("\n")
    for i, line in enumerate(lines):
        m = re.search(r'"has_payload": "([0-9a-f]{32})"', line)
        if not m or line.startswith("\t"):
            continue
        end = i + 1
        while end < len(lines) and lines[end].startswith("\t"):
            end += 1
        digest = hashlib.md5("\n".join(x[1:] for x in lines[i + 1:end]).encode()).hexdigest()
        lines[i] = line.replace(m[1], digest)
    return "\n".join(lines)
