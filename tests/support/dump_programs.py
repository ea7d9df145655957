"""Small failing torch.compile programs that make PyTorch write real repro dumps.

Each program is run in a subprocess (in a tmp folder) with PyTorch's repro env vars, exactly as
a user would, using PyTorch's testing bug injectors so the failures are cheap and certain.
``make_dump`` returns the dump script and the tensors the program compiled, saved with
``torch.save`` next to the program, so tests can compare what the archive holds with what the
program really passed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

# The model: a parameter-holding Linear (Dynamo lifts its weight and bias to graph inputs), a
# non-contiguous view input and a requires_grad input, so the dump has several storages, a
# backward, and strides that are not the default.
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
x = torch.randn(3, 4, requires_grad=True)
base = torch.randn(3, 8)
y = base[:, ::2]  # a strided view of a larger storage
torch.save({"weight": m.lin.weight.detach(), "bias": m.lin.bias.detach(), "x": x.detach(),
            "y": y.detach(), "base": base}, "inputs.pt")
"""

DYNAMO_PROGRAMS = {
    # backend name -> what goes wrong
    "compile_error": "relu_compile_error_TESTING_ONLY",
    "runtime_error": "relu_runtime_error_TESTING_ONLY",
    "accuracy": "relu_accuracy_error_TESTING_ONLY",
}


def dynamo_program(kind: str) -> str:
    backend = DYNAMO_PROGRAMS[kind]
    return _MODEL + textwrap.dedent(f"""
        f = torch.compile(m, backend={backend!r})
        f(x, y).sum().backward()
    """)


def aot_program(bug: str, *, dynamic: bool = False) -> str:
    """Inductor (CPU) with an injected relu bug: "compile_error", "runtime_error" or "accuracy";
    ``dynamic``: compiled with ``dynamic=True`` (the dump writes symbolic sizes)."""
    return textwrap.dedent(f"""
        import torch
        torch.manual_seed(0)
        torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY = {bug!r}

        def f(a, b):
            return torch.relu(a @ b + 1).sum(1)

        a = torch.randn(3, 4)
        b = torch.randn(4, 5)
        torch.save({{"a": a, "b": b}}, "inputs.pt")
        torch.compile(f, backend="inductor", dynamic={dynamic!r})(a, b)
    """)


def aot_grad_program(bug: str) -> str:
    """Inductor (CPU) with an injected relu bug on a Linear whose input and parameters require
    grad: the after_aot forward graph has an addmm over inputs that require grad."""
    return textwrap.dedent(f"""
        import torch
        torch.manual_seed(0)
        torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY = {bug!r}
        lin = torch.nn.Linear(4, 5)

        def f(a):
            return torch.relu(lin(a)).sum(1)

        a = torch.randn(3, 4, requires_grad=True)
        torch.compile(f, backend="inductor")(a).sum().backward()
    """)


def run_program(folder: Path, source: str, *, after: str, level: int,
                timeout: float = 240) -> subprocess.CompletedProcess:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "prog.py").write_text(source)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHDYNAMO_REPRO", "TORCH_COMPILE_DEBUG"))}
    env.update(TORCHDYNAMO_REPRO_AFTER=after, TORCHDYNAMO_REPRO_LEVEL=str(level), PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable, "prog.py"], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=timeout)


def launcher_in(folder: Path) -> Path:
    found = sorted(folder.glob("torch_compile_debug/run_*/minifier/minifier_launcher.py"))
    if not found:
        raise AssertionError(f"PyTorch wrote no minifier_launcher.py in {folder}")
    return found[-1]


def make_dump(folder: Path, source: str, *, after: str, level: int) -> Path:
    """Run the program; return the dump script PyTorch wrote (launcher, or repro.py at level 1)."""
    proc = run_program(folder, source, after=after, level=level)
    if proc.returncode == 0:
        raise AssertionError(f"the failing program did not fail:\n{proc.stderr[-2000:]}")
    if level == 1:
        repro = folder / "repro.py"
        if not repro.is_file():
            raise AssertionError(f"PyTorch wrote no repro.py:\n{proc.stderr[-2000:]}")
        return repro
    return launcher_in(folder)


def bert_step_program(bug: str = "compile_error") -> str:
    """A BERT-style training step (token, position and token-type embeddings, a Transformer
    encoder layer with a padding mask, a classifier and a cross-entropy loss, backward and an
    optimizer step) under torch.compile with Inductor's C++ relu bug injector. The token-type
    table has 2 rows and the classifier 3 classes: generated integers in [0, 16) index past
    both. The encoder's dropout puts random ops into the graph Inductor is handed. The program
    saves its real ids and labels to ``inputs.pt``."""
    return textwrap.dedent(f"""
        import torch
        from torch import nn

        torch.manual_seed(0)
        torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY = {bug!r}

        class TinyBert(nn.Module):
            def __init__(self, vocab=100, hidden=16, seq=8, classes=3):
                super().__init__()
                self.words = nn.Embedding(vocab, hidden)
                self.positions = nn.Embedding(seq, hidden)
                self.token_types = nn.Embedding(2, hidden)
                self.norm = nn.LayerNorm(hidden)
                layer = nn.TransformerEncoderLayer(hidden, 2, 2 * hidden, dropout=0.1, batch_first=True)
                self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
                self.classifier = nn.Linear(hidden, classes)

            def forward(self, ids, token_types, padding):
                positions = torch.arange(ids.shape[1], device=ids.device)
                h = self.norm(self.words(ids) + self.positions(positions) + self.token_types(token_types))
                return self.classifier(self.encoder(h, src_key_padding_mask=padding)[:, 0])

        model = TinyBert()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ids = torch.randint(0, 100, (2, 8))
        token_types = torch.ones(2, 8, dtype=torch.long)
        padding = torch.zeros(2, 8, dtype=torch.bool)
        padding[1, 6:] = True
        labels = torch.tensor([0, 2])
        torch.save({{"ids": ids, "labels": labels}}, "inputs.pt")

        def step():
            loss = nn.functional.cross_entropy(model(ids, token_types, padding), labels)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        torch.compile(step)()
    """)
