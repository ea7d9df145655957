"""Python environments that differ from this one in one planted way, for ``bisect torch``:
venvs on this machine's Python that see this environment's packages and its torch (its site
folders, added by a ``.pth`` file: a venv made with ``--system-site-packages`` from the base
interpreter would see the base's packages instead, another torch or none, when the suite runs
in a venv of its own), no pip; one with a
``sitecustomize`` that patches a decomposition the way PyTorch's bisector tests patch
``select_decomp_table``, one whose reproarchive reads only an older major format."""

from __future__ import annotations

import shutil
import site
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: what the bad environment's sitecustomize runs at start; ``planted_silu`` is the same patch
#: in this process, for capturing the archive
SILU_BUG = '''
import torch
import torch._inductor.compile_fx as _compile_fx

_original = _compile_fx.select_decomp_table


def _planted_table():
    table = dict(_original())
    table[torch.ops.aten.silu.default] = lambda x: x * torch.sigmoid(x) * 1.01
    return table


_compile_fx.select_decomp_table = _planted_table
'''


def make_env(root: Path, name: str, *, sitecustomize: str | None = None) -> Path:
    """A venv at ``root/name`` on this machine's base Python that sees this environment's site
    folders after its own; returns its interpreter."""
    folder = root / name
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(folder)], check=True, capture_output=True, timeout=120)
    # addsitedir, not a plain path: their own .pth files (an editable install's finder) count too
    here = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (site_packages(folder) / "_this_environment.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in here))
    if sitecustomize is not None:
        (site_packages(folder) / "sitecustomize.py").write_text(sitecustomize)
    return folder / "bin" / "python"


def site_packages(folder: Path) -> Path:
    return folder / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def install_old_reader(folder: Path) -> None:
    """Install into the venv at ``folder`` this reproarchive (library and CLI) as a release that
    reads only format 0.x would be: the same code with ``FORMAT_MAJOR = 0``, so that it refuses
    this archive's format as too new (E_VERSION) exactly as an older reader refuses a newer one."""
    target = site_packages(folder) / "reproarchive"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "reproarchive", target, ignore=ignore)
    shutil.copytree(ROOT / "cli", target / "cli", ignore=ignore)
    schema = target / "format" / "schema" / "version.py"
    text = schema.read_text()
    assert "FORMAT_MAJOR = 1\n" in text
    schema.write_text(text.replace("FORMAT_MAJOR = 1\n", "FORMAT_MAJOR = 0\n"))


class planted_silu:
    """``SILU_BUG`` in this process, undone on exit."""

    def __enter__(self):
        import torch._inductor.compile_fx as compile_fx

        self._module, self._original = compile_fx, compile_fx.select_decomp_table
        namespace: dict = {}
        exec(compile(SILU_BUG, "sitecustomize", "exec"), namespace)  # the test's own code, not an archive's
        compile_fx.select_decomp_table = namespace["_planted_table"]
        return self

    def __exit__(self, *exc):
        self._module.select_decomp_table = self._original
