"""Applying the recorded environment variables to a replay, and saying which cannot be applied.

Environment variables change PyTorch's behaviour at three different moments: at import (most
``TORCHINDUCTOR_*`` / ``TORCHDYNAMO_*`` variables only seed config defaults; ``TORCH_LOGS``,
``PYTORCH_CUDA_ALLOC_CONF``, ``CUDA_*`` are read once), at call time (a few are read lazily), or
never again after start-up (``OMP_NUM_THREADS``, which has an in-process equivalent). Setting
them all in ``os.environ`` for the duration of a replay is right for the lazy ones and harmless
for the rest; the import-time ones are either covered by the recorded config snapshot (the config
value they seeded was recorded) or reported as a warning. A child process started with
``--isolate`` gets them all before torch is imported, so nothing is lost there.

Machine-specific values (cache and debug directories, trace paths, pointer values) are never
copied: PyTorch's own dumps copy them and then point the replay at directories that do not exist.
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Any, Iterator, Mapping

# Variables whose value is a location or identity on the recording machine.
_MACHINE_SPECIFIC = re.compile(
    r"(_DIR|_PATH|_HOME|_ROOT|_FILE|CACHE|TORCH_TRACE|_PTR|VISIBLE_DEVICES|_SOCKET|_PORT|_ADDR)$|"
    r"^(TORCH_COMPILE_DEBUG_DIR|TORCHINDUCTOR_CACHE_DIR|TRITON_CACHE_DIR|CUDA_HOME|CUDA_PATH)$|"
    r"^_TORCHINDUCTOR_PYOBJECT"
)
# Seed torch config defaults at import; the recorded config snapshot holds the resulting values.
_CONFIG_SEEDING = re.compile(r"^(TORCHDYNAMO_|TORCHINDUCTOR_|TORCH_COMPILE_|TORCHFUNCTORCH_|INDUCTOR_)")
# Read once, at import or at device initialisation.
_IMPORT_TIME = re.compile(
    r"^(CUDA_|NCCL_|PYTORCH_|TORCH_LOGS|TORCH_SHOW_CPP|TORCH_CPP_LOG|TRITON_|MKL_|KMP_|HIP_|ROCM_)"
)
_REDACTED = re.compile(r"^<(redacted|process-specific)>$")
# Only variables that steer PyTorch and its libraries are replayed. An archive may come from
# anyone: LD_PRELOAD, PYTHONPATH, CXX or a *_FLAGS value would let it choose code we run.
_REPLAYABLE = re.compile(
    r"^(TORCH|PYTORCH|INDUCTOR|TRITON_|CUDA_|CUBLAS|CUDNN|NCCL_|OMP_NUM_THREADS$|MKL_|KMP_|DNNL_|ONEDNN_|HIP_|ROCM_)"
)
_PROGRAM_LIKE = re.compile(r"(CXX|CC$|_CC_|COMPILER|LINKER|LD_|FLAGS|CMD|COMMAND|PRELOAD|PLUGIN|EXEC|SHELL|_BIN$|LIBRARY)")
_UNSAFE_VALUE = re.compile(r"[/\\`$;|&<>\s]")


def replayable(name: str, value: str) -> bool:
    """Whether a recorded variable may be set for a replay (see ``_REPLAYABLE``)."""
    return bool(_REPLAYABLE.match(name)) and not _PROGRAM_LIKE.search(name) and not _UNSAFE_VALUE.search(value)


def recorded_variables(environment: Mapping[str, Any] | None) -> dict[str, str]:
    """The name -> value pairs of an environment record (either layout the snapshot may use)."""
    if not environment:
        return {}
    variables = environment.get("variables", environment)
    if not isinstance(variables, Mapping):
        return {}
    return {str(k): str(v) for k, v in variables.items() if isinstance(v, (str, int, float)) and not isinstance(v, bool)}


def plan(environment: Mapping[str, Any] | None, *, config_applied: bool) -> tuple[dict[str, str], list[str]]:
    """(variables to set for the replay, warnings about those that cannot take effect)."""
    to_set: dict[str, str] = {}
    warnings: list[str] = []
    late: list[str] = []
    refused: list[str] = []
    for name, value in sorted(recorded_variables(environment).items()):
        if _MACHINE_SPECIFIC.search(name) or _REDACTED.search(value) or value.startswith("~"):
            continue
        if not replayable(name, value):
            refused.append(name)
            continue
        if os.environ.get(name) == value:
            continue
        to_set[name] = value
        if name == "OMP_NUM_THREADS":
            continue  # applied with torch.set_num_threads
        if _CONFIG_SEEDING.match(name):
            if not config_applied:
                late.append(f"{name}={value}")
        elif _IMPORT_TIME.match(name):
            late.append(f"{name}={value}")
    if refused:
        warnings.append(
            "recorded environment variables not set because they could name a program, library or path: "
            + ", ".join(refused[:10]) + (f" and {len(refused) - 10} more" if len(refused) > 10 else "")
        )
    if late:
        warnings.append(
            "recorded environment variables that only take effect when torch is imported: "
            + ", ".join(late)
            + " (use --isolate to apply them, or set them before running)"
        )
    return to_set, warnings


@contextlib.contextmanager
def applied_environment(to_set: Mapping[str, str]) -> Iterator[None]:
    """Set ``to_set`` in os.environ (and the thread count) for the duration; restore after."""
    import torch

    saved = {name: os.environ.get(name) for name in to_set}
    threads = torch.get_num_threads()
    try:
        os.environ.update(to_set)
        omp = to_set.get("OMP_NUM_THREADS", "")
        if omp.isdigit() and int(omp) > 0:
            torch.set_num_threads(int(omp))
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


def child_environment(environment: Mapping[str, Any] | None) -> dict[str, str]:
    """The environment for an isolated replay process: this one plus the recorded variables."""
    env = dict(os.environ)
    to_set, _ = plan(environment, config_applied=True)
    env.update(to_set)
    return env
