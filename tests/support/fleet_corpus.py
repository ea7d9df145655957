"""A fleet of failures: archives of five seeded bugs, each packed from several models, shapes and
"machines", for the triage tests and benchmark.

Every archive holds a real failure of a real compiler function on a real FX graph, recorded the
way capture records it (``record_from_exception`` / ``check_accuracy``), but without Dynamo or
Inductor: the graph is traced with ``fx.symbolic_trace`` and handed to the backend directly, so
two hundred archives take seconds. The bugs:

* ``relu-compile``: PyTorch's ``relu_compile_error_TESTING_ONLY`` (compile, ``ReluCompileError``);
* ``relu-runtime``: ``relu_runtime_error_TESTING_ONLY`` (forward, ``AssertionError``);
* ``relu-accuracy``: ``relu_accuracy_error_TESTING_ONLY`` (accuracy);
* ``no-sigmoid`` / ``no-tanh``: ``no_lowering`` below, a compiler that has no lowering for
  ``torch.sigmoid`` / ``torch.tanh``: one exception type and one message pattern for both, told
  apart only by the node that failed;
* ``racy-gelu`` (not among the default five): ``racy_lowering``, a compiler whose lowering of
  ``gelu`` fails one compile in two, as a race does: a flaky bug.

A "machine" is where the model's source lives (a folder named after a user, so the paths in
tracebacks and messages differ), how far down its file the model is defined (line numbers) and
what the model calls its parts and inputs (node names).
"""

from __future__ import annotations

import copy
import importlib.util
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import fx

import reproarchive
from reproarchive.context import failure as failure_mod
from reproarchive.context.config import config_snapshot
from reproarchive.context.environment import environment_snapshot
from reproarchive.context.system import system_snapshot
from reproarchive.replay.accuracy import check_accuracy

BUGS = ("relu-compile", "relu-runtime", "relu-accuracy", "no-sigmoid", "no-tanh")
NO_LOWERING = f"{__name__}:no_lowering"
_UNSUPPORTED = ("sigmoid", "tanh")


class LoweringError(RuntimeError):
    """What ``no_lowering`` raises: a compile error of a compiler missing an op."""


#: "Another torch" for ``triage --against``: ops this variable names (``sigmoid,tanh``) have a
#: lowering now; ops ``FLEET_BROKEN_ENV`` names have one that fails differently. Both variables
#: steer the compiler, so they are part of the environment a verdict is cached under.
FLEET_FIXED_ENV = "TORCHINDUCTOR_FLEET_TEST_LOWERED"
FLEET_BROKEN_ENV = "TORCHINDUCTOR_FLEET_TEST_BROKEN"


def no_lowering(gm: fx.GraphModule, example_inputs):
    """A compiler without lowerings for ``sigmoid`` and ``tanh`` (the function or the Tensor
    method): it raises on the first node calling one. Its message says the bug two ways, as a
    real compiler's messages do: mostly it quotes the node and the input size it was compiled
    for; on a rank-3 input (its sequence kernels' path), the op's aten name and the
    rank."""
    lowered = set(filter(None, os.environ.get(FLEET_FIXED_ENV, "").split(",")))
    broken = set(filter(None, os.environ.get(FLEET_BROKEN_ENV, "").split(",")))
    ranks = {}
    for node in gm.graph.nodes:
        op = _op(node)
        if op in broken:
            raise ValueError(f"the lowering of {node.name} produced a tensor of the wrong layout")
        if op in _UNSUPPORTED and op not in lowered:
            ranks = ranks or _ranks(gm, example_inputs)
            rank = ranks.get(node.args[0].name) if isinstance(node.args[0], fx.Node) else None
            if rank == 3:  # the sequence kernels' path, which words its errors its own way
                raise LoweringError(f"missing lowering for aten.{op}.default on a {rank}-d input")
            size = sum(t.numel() for t in example_inputs)
            raise LoweringError(f"no lowering for node {node.name} (compiling for {size} input elements)")
    return gm.forward


def _op(node: fx.Node) -> str:
    """The op a node calls, by name: ``torch.sigmoid`` and ``Tensor.sigmoid`` are both ``sigmoid``."""
    if node.op == "call_function":
        return getattr(node.target, "__name__", "")
    return node.target if node.op == "call_method" else ""


def _ranks(gm: fx.GraphModule, example_inputs) -> dict[str, int]:
    """Each node's output rank, from running the graph on the example inputs."""
    from torch.fx.passes.shape_prop import ShapeProp, TensorMetadata

    ShapeProp(gm).propagate(*example_inputs)
    return {n.name: len(n.meta["tensor_meta"].shape) for n in gm.graph.nodes
            if isinstance(n.meta.get("tensor_meta"), TensorMetadata)}


RACY_BUG = "racy-gelu"
RACY_LOWERING = f"{__name__}:racy_lowering"
#: A folder: when set, how ``racy_lowering``'s race falls is counted in it per graph (its code),
#: across processes: a graph's first compile wins, the next loses, and so on. Otherwise a coin.
RACE_DIR_ENV = "FLEET_RACE_DIR"


def racy_lowering(gm: fx.GraphModule, example_inputs):
    """A compiler whose lowering of ``gelu`` loses a race with its worker one compile in two
    (``RACE_DIR_ENV`` makes the race's fall predictable for tests)."""
    if not any(_op(node) == "gelu" for node in gm.graph.nodes):
        return gm.forward
    if _race_lost(gm.code):
        raise LoweringError("lowering of gelu raced with its compile worker: the kernel's buffer was freed")
    return gm.forward


def _race_lost(code: str) -> bool:
    folder = os.environ.get(RACE_DIR_ENV)
    if not folder:
        return random.SystemRandom().random() < 0.5
    import fcntl
    import hashlib

    with open(Path(folder) / hashlib.sha256(code.encode()).hexdigest()[:16], "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        count = int(f.read().strip() or 0)
        f.seek(0)
        f.truncate()
        f.write(str(count + 1))
    return count % 2 == 1


def segfaulting(gm: fx.GraphModule, example_inputs):
    """A compiler that dies of SIGSEGV (reads address 0), as native compiler bugs do."""
    import ctypes

    ctypes.string_at(0)


def hanging(gm: fx.GraphModule, example_inputs):
    """A compiler that never returns."""
    while True:
        time.sleep(1)


SEGFAULTING, HANGING = f"{__name__}:segfaulting", f"{__name__}:hanging"


def pack_with_backend(path: Path, backend: str, *, seed: int = 0) -> Path:
    """A small real graph recorded as failing to compile with ``backend`` (a compile error of
    the kind the backend's bug shows as elsewhere): what a fleet holds for a compiler that
    crashes or hangs on replay."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    failure = {"stage": "compile", "exception_type": "RuntimeError", "message": f"{backend} failed",
               "signature": f"compile|RuntimeError|{backend} failed", "backend": backend}
    return reproarchive.pack(fx.symbolic_trace(model), [torch.randn(2, 4)], path, backend=backend, failure=failure,
                             snapshot=False)


# The models, written per machine into a file of their own so that paths and line numbers differ.
# {a}/{b} are the machine's names for the layers, {x} its name for the input, {act} the op
# (torch.relu for the relu bugs, torch.sigmoid / torch.tanh for the lowering bugs).
_MODELS = {
    "mlp": """
class Model(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.{a} = torch.nn.Linear(n, 2 * n)
        self.{b} = torch.nn.Linear(2 * n, n)

    def forward(self, {x}):
        h = self.{a}({x})
        h = {act}(h)
        return self.{b}(h) * 2
""",
    "residual": """
class Model(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.{a} = torch.nn.Linear(n, n)
        self.{b} = torch.nn.LayerNorm(n)

    def forward(self, {x}):
        y = self.{b}({x})
        y = {act}(self.{a}(y)) + {x}
        return y.sum(dim=-1)
""",
    "conv": """
class Model(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.{a} = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.{b} = torch.nn.Linear(4, n)

    def forward(self, {x}):
        h = {act}(self.{a}({x}))
        h = h.mean(dim=(2, 3))
        return self.{b}(h)
""",
}
# The varied corpus' models besides those: more inputs and outputs, and a rank-3 input to the op.
_VARIED_MODELS = {
    "sequence": """
class Model(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.{a} = torch.nn.Linear(n, n)
        self.{b} = torch.nn.Linear(n, 2)

    def forward(self, {x}, mask):
        h = {act}(self.{a}({x})) * mask
        return self.{b}(h), h.sum(dim=1)
""",
    "gated": """
class Model(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.{a} = torch.nn.Linear(n, n)
        self.{b} = torch.nn.Linear(n, n)

    def forward(self, {x}, gate, scale):
        h = self.{a}({x}) + gate
        return self.{b}({act}(h) * scale)
""",
}
# A machine whose author calls the op as a Tensor method (the graph holds call_method, not the function).
_METHOD_ACT = """
def _method_act(t):
    return t.{op}()
"""
_USERS = ("alice", "bob", "carol", "dmitri", "erin", "farid", "gu", "hana")
_LAYER_NAMES = (("fc1", "fc2"), ("proj_in", "proj_out"), ("layer_0", "layer_1"), ("encoder", "decoder"))
_INPUT_NAMES = ("x", "inp", "hidden_states", "x_1")


@dataclass(frozen=True)
class Member:
    """One archive of the corpus and the bug it holds (the ground truth grouping is judged by)."""

    path: Path
    bug: str
    model: str
    machine: int


def _act(bug: str) -> str:
    return {"no-sigmoid": "torch.sigmoid", "no-tanh": "torch.tanh",
            RACY_BUG: "torch.nn.functional.gelu"}.get(bug, "torch.relu")


def _model_class(root: Path, model: str, bug: str, machine: int, method: bool = False):
    """The model class as machine ``machine`` wrote it: in its own file, under its user's home,
    a machine-dependent number of lines down; with ``method``, calling the op as a Tensor method."""
    user = _USERS[machine % len(_USERS)]
    a, b = _LAYER_NAMES[machine % len(_LAYER_NAMES)]
    x = _INPUT_NAMES[machine % len(_INPUT_NAMES)]
    folder = root / f"machine{machine}" / "home" / user / "src"
    folder.mkdir(parents=True, exist_ok=True)
    name = f"fleet_{model}_{bug.replace('-', '_')}_{machine}{'_method' if method else ''}"
    file = folder / f"{name}.py"
    padding = "\n" * (3 + 7 * machine)
    act, header = _act(bug), ""
    if method:
        act, header = "_method_act", _METHOD_ACT.format(op=_act(bug).split(".")[-1])
    source = {**_MODELS, **_VARIED_MODELS}[model].format(a=a, b=b, x=x, act=act)
    file.write_text("import torch\n" + header + padding + source)
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module.Model


def _inputs(model: str, n: int, batch: int, gen: torch.Generator) -> list[torch.Tensor]:
    if model == "conv":
        return [torch.randn(batch, 3, 6, 6, generator=gen)]
    if model == "sequence":
        return [torch.randn(batch, 5, n, generator=gen), (torch.rand(batch, 5, 1, generator=gen) > 0.3).float()]
    if model == "gated":
        return [torch.randn(batch, n, generator=gen), torch.randn(batch, n, generator=gen),
                torch.rand(batch, n, generator=gen)]
    return [torch.randn(batch, n, generator=gen)]


def _failure(bug: str, gm: fx.GraphModule, inputs: list) -> tuple[str, object]:
    """(backend name, failure record) of ``bug`` on ``gm``, observed by running the backend."""
    from torch._dynamo.backends import debugging

    if bug == "relu-compile":
        backend = "relu_compile_error_TESTING_ONLY"
        try:
            debugging.relu_compile_error_TESTING_ONLY(copy.deepcopy(gm), inputs)
        except debugging.ReluCompileError as exc:
            return backend, failure_mod.record_from_exception(exc, "compile", backend=backend)
    elif bug == "relu-runtime":
        backend = "relu_runtime_error_TESTING_ONLY"
        compiled = debugging.relu_runtime_error_TESTING_ONLY(copy.deepcopy(gm), inputs)
        try:
            compiled(*inputs)
        except AssertionError as exc:
            return backend, failure_mod.record_from_exception(exc, "forward", backend=backend)
    elif bug == "relu-accuracy":
        backend = "relu_accuracy_error_TESTING_ONLY"
        compiled = debugging.relu_accuracy_error_TESTING_ONLY(copy.deepcopy(gm), inputs)
        report = check_accuracy(gm, compiled, inputs, fwd_only=True)
        if not report.passed:
            return backend, failure_mod.accuracy_record(report, backend=backend)
    else:
        backend, compiler = (RACY_LOWERING, racy_lowering) if bug == RACY_BUG else (NO_LOWERING, no_lowering)
        for _ in range(64):  # the race is lost one time in two: recorded when it was
            try:
                compiler(gm, inputs)
            except LoweringError as exc:
                return backend, failure_mod.record_from_exception(exc, "compile", backend=backend)
    raise AssertionError(f"bug {bug} did not fail on this graph")


def build(root: Path, count: int = 200, *, seed: int = 0, bugs: tuple[str, ...] = BUGS,
          varied: bool = False, dynamo: bool = False) -> list[Member]:
    """``count`` archives under ``root/archives``, spread evenly over ``bugs`` (default: all
    five), each packed from a model, a shape and a machine chosen by ``seed``. ``varied``: each
    bug is also reached from models of 1-3 inputs and 1-2 outputs, one with a rank-3 input to the
    op, and on odd machines the lowering bugs' op is called as a Tensor method: the compiler
    says one bug in several ways (its message, the node's target), as a real fleet's do.
    ``dynamo``: each archive is a real capture, the model run under ``torch.compile`` with
    ``reproarchive.capture`` around the bug's compiler (Dynamo's graph, inputs, records and
    failure, as a user's program leaves them; about a second each)."""
    rng = random.Random(seed)
    out = root / "archives"
    out.mkdir(parents=True, exist_ok=True)
    classes: dict[tuple, type] = {}
    # one snapshot of this process's records, shared (taking one per archive costs more than packing)
    records = {"config": config_snapshot(), "environment": environment_snapshot(), "system": system_snapshot()}
    members = []
    for k in range(count):
        bug = bugs[k % len(bugs)]
        model = rng.choice(sorted({**_MODELS, **_VARIED_MODELS} if varied else _MODELS))
        machine = rng.randrange(8)
        n, batch = rng.choice((4, 6, 8, 12)), rng.choice((1, 2, 3, 5))
        method = varied and machine % 2 == 1 and bug.startswith("no-")
        key = (model, bug, machine, method)
        if key not in classes:
            classes[key] = _model_class(root / "src", model, bug, machine, method)
        torch.manual_seed(k)
        if dynamo:
            path = out / f"{k:04d}-{model}-m{machine}.tar.zst"
            _captured(path, bug, classes[key](n).eval(), _inputs(model, n, batch, torch.Generator().manual_seed(k)))
            members.append(Member(path, bug, model, machine))
            continue
        tracer = fx.Tracer()
        tracer.record_stack_traces = True
        root_module = classes[key](n).eval()
        gm = fx.GraphModule(root_module, tracer.trace(root_module))
        gen = torch.Generator().manual_seed(k)
        inputs = _inputs(model, n, batch, gen)
        backend, failure = _failure(bug, gm, inputs)
        path = out / f"{k:04d}-{model}-m{machine}.tar.zst"
        reproarchive.pack(gm, inputs, path, backend=backend, failure=failure,
                          accuracy=True if bug == "relu-accuracy" else None, level=1, **records)
        members.append(Member(path, bug, model, machine))
    return members


def _captured(path: Path, bug: str, model: torch.nn.Module, inputs: list[torch.Tensor]) -> None:
    """``model(*inputs)`` under ``torch.compile`` with ``capture`` around ``bug``'s compiler: the
    archive the program leaves at ``path`` (a racy compile is retried until its race is lost)."""
    import torch._dynamo

    compiler = {"relu-compile": "relu_compile_error_TESTING_ONLY", "relu-runtime": "relu_runtime_error_TESTING_ONLY",
                "relu-accuracy": "relu_accuracy_error_TESTING_ONLY", RACY_BUG: racy_lowering}.get(bug, no_lowering)
    for _ in range(64):
        torch._dynamo.reset()
        backend = reproarchive.capture(compiler, path=path, accuracy=bug == "relu-accuracy", crash=False, spool=False)
        try:
            torch.compile(model, backend=backend, fullgraph=True)(*inputs)
        except Exception:  # noqa: BLE001 - the program's failure, archived by capture
            pass
        if path.exists():
            return
    raise AssertionError(f"bug {bug} left no archive")
