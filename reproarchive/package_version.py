"""The package version, in a module of its own so that nothing imports the package ``__init__``."""

__version__ = "0.1.0"

#: The torch releases this release of reproarchive was tested with: CI runs the whole suite on
#: the one constraints.txt pins and the demo and the core tests on the others (.ci/torch-matrix);
#: the floor in pyproject.toml is the oldest of them. tests/test_packaging.py keeps the four equal.
TESTED_TORCH = ("2.11.0", "2.13.0", "2.15.0")


def torch_release(version: str | None) -> str | None:
    """``2.15.0+cu132`` -> ``2.15.0``: the release, without the build's local label (a CPU and a
    CUDA build of one release are one torch version)."""
    return version.split("+", 1)[0] if version else version


def tested_torch(version: str | None) -> bool:
    """Whether ``version`` is a release this reproarchive was tested with."""
    return torch_release(version) in TESTED_TORCH
