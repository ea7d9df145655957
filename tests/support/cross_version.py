"""Archives captured on one torch release and replayed on another (torch version matrix).

Two real captures, made by the capture backend around inductor in a fresh process:

* ``compile-error``: inductor's C++ relu bug injector, a compile error every torch release
  since 2.1 has: it must reproduce on any other release, the verdict naming both;
* ``gone-elsewhere``: an accuracy failure from a bug planted in the recording torch alone (a
  silu decomposition 1% off, ``torch_envs.SILU_BUG``): replayed on a torch without it, it
  passes, "PASSED on torch X (recorded on Y)".

``tests/data/cross_version/torch-<release>/`` keeps the two captured on each release of the
matrix, made by ``python tests/support/cross_version.py tests/data/cross_version`` under that
torch (the folder is named after the running release). ``capture_into`` makes them in a child
process of any interpreter, for a capture here and a replay there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "cross_version"
NAMES = ("compile-error", "gone-elsewhere")

_PROGRAM = '''
import sys
import torch
import reproarchive

out = sys.argv[1]
torch.manual_seed(0)

import torch._inductor.config as inductor_config

def f(x):
    return torch.relu(x + 1) * 2

with inductor_config.patch({"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"}), torch.no_grad():
    try:
        torch.compile(f, backend=reproarchive.capture("inductor", path=out + "/compile-error.tar.zst"))(torch.randn(16))
    except Exception:
        pass
torch._dynamo.reset()

sys.path.insert(0, sys.argv[2])
from support.torch_envs import planted_silu

def g(x):
    return torch.nn.functional.silu(x) * 2

with planted_silu(), torch.no_grad():
    try:
        torch.compile(g, backend=reproarchive.capture("inductor", path=out + "/gone-elsewhere.tar.zst",
                                                      accuracy=True))(torch.randn(64))
    except Exception:
        pass
'''


def capture_into(python: str | os.PathLike, folder: Path) -> list[Path]:
    """Both archives captured by ``python`` (any interpreter with torch and this reproarchive)
    into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([str(python), "-c", _PROGRAM, str(folder), str(ROOT / "tests")], env=env,
                          capture_output=True, text=True, timeout=600)
    paths = [folder / f"{name}.tar.zst" for name in NAMES]
    missing = [p.name for p in paths if not p.exists()]
    if missing:
        raise RuntimeError(f"{python} captured no {missing} (exit {done.returncode}): {done.stderr[-2000:]}")
    return paths


def committed() -> dict[str, Path]:
    """The committed folders by torch release."""
    return {p.name.removeprefix("torch-"): p for p in sorted(DATA.glob("torch-*")) if p.is_dir()}


if __name__ == "__main__":
    import torch

    release = torch.__version__.split("+")[0]
    print(capture_into(sys.executable, Path(sys.argv[1]) / f"torch-{release}"))
