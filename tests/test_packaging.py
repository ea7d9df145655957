"""What a plain ``pip install .`` gets, and what the package says about the torch it was tested
with.

CI installs the project editable, which imports from the tree and so hides a package left out
of the wheel (``reproarchive/bisect/`` was: ``reproarchive bisect`` failed after a plain
install). Here the wheel is built as pip builds it and its files are compared with the tree:
every module, template and page. And the torch releases: ``reproarchive.package_version.TESTED_TORCH``
(what ``doctor`` reports), the pinned one (constraints.txt, the whole suite), the matrix
(.ci/torch-matrix, the demo and the core tests) and pyproject's floor must say the same."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from reproarchive.package_version import TESTED_TORCH

ROOT = Path(__file__).resolve().parents[1]


def _tree_files() -> set[str]:
    """The files a wheel must hold: the library's and the CLI's (installed as reproarchive.cli)."""
    found = set()
    for folder, installed in ((ROOT / "reproarchive", "reproarchive"), (ROOT / "cli", "reproarchive/cli")):
        for path in folder.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                found.add(f"{installed}/{path.relative_to(folder).as_posix()}")
    return found


def test_the_wheel_holds_every_module_template_and_page_of_the_tree(tmp_path):
    # built from a copy: setuptools keeps what an earlier build put in build/ and packs it again
    source = tmp_path / "source"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("reproarchive", "cli"):
        shutil.copytree(ROOT / name, source / name, ignore=skip)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(tmp_path), str(source)], check=True, capture_output=True, timeout=300)
    [wheel] = tmp_path.glob("reproarchive-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        held = {n for n in zf.namelist() if n.startswith("reproarchive/")}
    tree = _tree_files()
    assert not tree - held, f"in the tree but not in the wheel: {sorted(tree - held)[:20]}"
    assert not held - tree, f"in the wheel but not in the tree: {sorted(held - tree)[:20]}"


def _release_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


def test_the_tested_torch_releases_are_the_pinned_one_and_the_matrix():
    pinned = re.search(r"^torch==(\S+)$", (ROOT / "constraints.txt").read_text(), re.MULTILINE).group(1)
    matrix = [line.strip() for line in (ROOT / ".ci" / "torch-matrix").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    assert sorted({pinned, *matrix}, key=_release_tuple) == list(TESTED_TORCH)


def test_the_floor_in_pyproject_is_the_oldest_tested_release():
    # (tomllib is 3.11's; the package supports 3.10)
    [torch] = re.findall(r'^\s*"(torch\s*>=[^"]*)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    floor = re.search(r">=\s*([\d.]+)", torch).group(1)
    oldest = min(TESTED_TORCH, key=_release_tuple)
    assert _release_tuple(oldest)[:len(_release_tuple(floor))] == _release_tuple(floor), (torch, oldest)
