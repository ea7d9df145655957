"""Environments for ``bisect torch --torch SPEC``: virtual environments made with pip, cached.

Bisecting across torch releases means one environment per release, and building each by hand is
where such a bisection stops. Here a spec names a torch (``2.13.0``, a requirement such as
``torch>=2.12,<2.13``, or a wheel file: a local build or a patched copy) and the environment is
made once, with pip (so the user's own pip configuration, indexes and local wheels, applies),
and kept in a cache folder keyed by everything installed into it: a second bisection reuses it.

What goes in besides torch, each pinned:

* what the bundled reader needs (reproarchive's own requirements, at this environment's
  versions): the replay there runs this reproarchive's code from a copy, with that torch;
* the archive's recorded packages that torch does not pin for itself (``RECORDED``: numpy,
  transformers, accelerate), at their recorded versions; torch's own requirements (sympy,
  triton, ...) are left to that torch, since another release may need other versions.

An environment is built in a folder of its own and renamed into place when pip succeeded, so a
build that fails or is interrupted leaves nothing a later run would take for ready, and two
bisections building the same environment at once both end with one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Callable

from reproarchive.bisect.nightlies import pip_said
from reproarchive.errors import ReproArchiveError

#: Recorded packages pinned as recorded: those a model's code imports that torch does not require.
RECORDED = ("numpy", "transformers", "accelerate")
#: What the bundled reader imports, when this reproarchive's metadata cannot say.
_READER_FALLBACK = ("zstandard", "xxhash", "msgpack", "click", "tqdm")
_READY = "reproarchive-environment.json"
_VERSION = re.compile(r"\d+(\.\d+)*([a-z]+\d*)?(\.dev\d+)?(\+[\w.]+)?")
_PIP_TIMEOUT = 3600


class BuildError(ReproArchiveError):
    """An environment could not be built: the bisection skips it (it says nothing of torch)."""


@dataclasses.dataclass(frozen=True)
class Built:
    """An environment made (or found made) for one spec."""

    spec: str
    python: Path
    requirements: tuple[str, ...]
    reused: bool
    seconds: float


def default_cache() -> Path:
    """``$XDG_CACHE_HOME/reproarchive/torch-envs`` (``~/.cache/...`` without it)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "reproarchive" / "torch-envs"


def torch_requirement(spec: str) -> str:
    """What pip is asked for: ``2.13.0`` -> ``torch==2.13.0``; a wheel file -> its absolute path;
    a requirement naming torch, as given."""
    text = spec.strip()
    if _VERSION.fullmatch(text):
        return f"torch=={text}"
    if text.endswith(".whl"):
        path = Path(text).expanduser()
        if not path.is_file():
            raise BuildError(f"no such wheel file: {spec}", "give the path of a torch wheel, or a version")
        return str(path.resolve())
    if re.match(r"torch\s*([=<>!~]=?|===|@|\[|$)", text):
        return text
    raise BuildError(f"{spec!r} names no torch",
                     "give a version (2.13.0), a requirement (torch>=2.12,<2.13) or a wheel file")


def pinned_packages(recorded: dict[str, str | None]) -> tuple[str, ...]:
    """The pins besides torch: the bundled reader's requirements at this environment's versions,
    and the archive's ``RECORDED`` packages at their recorded versions (a recorded version that
    is not a plain version number is not pinned: nothing else of an archive reaches pip)."""
    pins = {}
    for name in _reader_requirements():
        try:
            pins[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    for name in RECORDED:
        version = str(recorded.get(name) or "")
        if _VERSION.fullmatch(version):  # an archive's text goes to pip only as a plain version
            pins[name] = version
    return tuple(f"{name}=={version}" for name, version in sorted(pins.items()))


def _reader_requirements() -> tuple[str, ...]:
    try:
        requires = metadata.requires("reproarchive") or []
    except metadata.PackageNotFoundError:
        return _READER_FALLBACK
    names = []
    for line in requires:
        if "extra ==" in line:
            continue
        name = re.split(r"[\s<>=!~;\[(]", line, maxsplit=1)[0]
        if name and name.lower() != "torch":
            names.append(name)
    return tuple(names) or _READER_FALLBACK


def build_environment(spec: str, *, cache: Path, pins: tuple[str, ...],
                      on_build: Callable[[str, Path], None] | None = None, pip_options: tuple[str, ...] = ()) -> Built:
    """The environment for ``spec`` under ``cache``: reused when one with the same requirements
    is there, else made (``on_build(requirement, folder)`` is called first: it takes minutes).
    ``pip_options``: given to pip install (a nightly's ``--pre`` and index), part of the key."""
    start = time.monotonic()
    requirement = torch_requirement(spec)
    requirements = (requirement, *pins)
    folder = cache / _folder_name(requirement, (*requirements, *pip_options))
    python = folder / "bin" / "python"
    if (folder / _READY).is_file() and python.exists():
        return Built(spec, python, requirements, True, round(time.monotonic() - start, 3))
    if on_build is not None:
        on_build(requirement, folder)
    cache.mkdir(parents=True, exist_ok=True)
    building = cache / f".{folder.name}.building-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    try:
        _make(building, requirements, pip_options)
        (building / _READY).write_text(json.dumps({"spec": spec, "requirements": list(requirements)}, indent=1))
        try:
            os.rename(building, folder)
        except OSError:
            if not (folder / _READY).is_file():  # not another build's: a leftover in the way
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return Built(spec, python, requirements, False, round(time.monotonic() - start, 3))


def _folder_name(requirement: str, requirements: tuple[str, ...]) -> str:
    """``torch-2.13.0-<key>``: readable, and keyed by the interpreter and every requirement (a
    wheel file by its size and time too, so a rebuilt wheel of one name is another environment)."""
    key = [sys.version, sys.executable, *requirements]
    if requirement.endswith(".whl"):
        stat = os.stat(requirement)
        key += [str(stat.st_size), str(stat.st_mtime_ns)]
    label = re.sub(r"[^\w.+-]+", "_", Path(requirement).name if requirement.endswith(".whl") else requirement)
    return f"{label[:60]}-{hashlib.sha256(repr(key).encode()).hexdigest()[:12]}"


#: What a replay imports first: compiled to bytecode once, when the environment is made.
_WARM_UP = "import torch, torch._dynamo, torch.fx, torch._inductor.compile_fx"


def _make(folder: Path, requirements: tuple[str, ...], pip_options: tuple[str, ...] = ()) -> None:
    """A venv with ``requirements``. pip does not byte-compile them (torch is thousands of
    modules a replay never imports); the modules a replay does import are compiled by importing
    them once, with bytecode writing on, so every replay there reads them compiled, even where
    ``PYTHONDONTWRITEBYTECODE`` is set."""
    base = getattr(sys, "_base_executable", sys.executable)
    python = str(folder / "bin" / "python")
    # no pip of its own where this process has one (ensurepip costs seconds per environment):
    # this process's pip installs into it (``--python``)
    own_pip = importlib.util.find_spec("pip") is not None
    _run([base, "-m", "venv", *(["--without-pip"] if own_pip else []), str(folder)], "python -m venv")
    pip = [sys.executable, "-m", "pip", "--python", python] if own_pip else [python, "-m", "pip"]
    _run([*pip, "install", "--quiet", "--disable-pip-version-check", "--no-compile", *pip_options, *requirements],
         "pip install")
    try:
        _run([python, "-c", _WARM_UP], "importing torch", env={"PYTHONDONTWRITEBYTECODE": None})
    except BuildError:
        pass  # a torch that cannot import says so in each replay's verdict, as any environment's does


def _run(argv: list[str], what: str, env: dict[str, str | None] | None = None) -> None:
    """``argv`` without this process's Python paths (``env``: changes, None removes)."""
    changes = env or {}
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
           and k not in changes}
    env.update({k: v for k, v in changes.items() if v is not None})
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, errors="replace",
                              timeout=_PIP_TIMEOUT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise BuildError(f"{what} ran past {_PIP_TIMEOUT} s", "build the environment by hand and give --env") from None
    except OSError as exc:
        raise BuildError(f"{what} could not start: {exc.strerror or exc}", "check the Python installation") from None
    if done.returncode != 0:
        raise BuildError(f"{what} failed: {pip_said(done)}",
                         "check the version exists for this Python and platform, or give --env")
