"""The environment snapshot, and applying recorded variables to a replay.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

from reproarchive.context.redaction import redact_paths
from reproarchive.context.system import _SYSTEM_FIELDS, nested_get, system_snapshot


# ---------------------------------------------------------------------------------------------
# Environment snapshot
# ---------------------------------------------------------------------------------------------

#: Name prefixes of variables that change what PyTorch, Triton, CUDA or the CPU runtimes do.
ENV_PREFIXES = (
    "TORCH", "_TORCH", "PYTORCH", "TORCHDYNAMO", "TORCHINDUCTOR", "_TORCHINDUCTOR", "INDUCTOR",
    "TRITON", "CUDA", "CUBLAS", "CUBLASLT", "CUDNN", "NCCL", "NVIDIA_TF32", "HIP", "ROCM",
    "HSA_", "MIOPEN", "OMP_", "KMP_", "GOMP_", "MKL", "DNNL", "ONEDNN", "ATEN", "XLA", "ZE_",
    "SYCL", "ONEAPI", "CXX", "CC",
)
#: Exact names outside those prefixes that matter too.
ENV_NAMES = ("LD_PRELOAD", "PYTHONHASHSEED", "CUBLAS_WORKSPACE_CONFIG")
#: Substrings that also select a variable (what PyTorch's own dumps select on).
ENV_SUBSTRINGS = ("DYNAMO", "INDUCTOR", "TRITON")
#: A variable whose name contains one of these has its value replaced by "<redacted>".
SECRET_MARKERS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH")
#: Process-specific values (pointers, pids, sockets) that mean nothing on another machine and
#: would be wrong if a replay set them: recorded as "<process-specific>".
_PROCESS_SPECIFIC = re.compile(r"(_PTR|POINTER|_ADDR|_PID|_FD)(_|$)")

REDACTED = "<redacted>"
PROCESS_SPECIFIC = "<process-specific>"


def _selected(name: str) -> bool:
    upper = name.upper()
    if name in ENV_NAMES:
        return True
    if upper in ("CC", "CXX"):
        return True
    if upper.startswith(("CC_", "CXX_")) or upper in ("CXXFLAGS", "CFLAGS"):
        return True
    prefixes = tuple(p for p in ENV_PREFIXES if p not in ("CC", "CXX"))
    return upper.startswith(prefixes) or any(s in upper for s in ENV_SUBSTRINGS)


def environment_snapshot(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Environment variables that change PyTorch's behaviour, redacted.

    Returns ``{"variables": {name: value}, "redacted": [names], "reasons": {name: reason}}``.
    Selection: names starting with TORCH/PYTORCH/TORCHDYNAMO/TORCHINDUCTOR/INDUCTOR/TRITON/
    CUDA/CUBLAS/CUDNN/NCCL/HIP/ROCM/OMP_/KMP_/MKL/DNNL/ONEDNN/... (``ENV_PREFIXES``), names that
    contain DYNAMO/INDUCTOR/TRITON anywhere (PyTorch's own rule, so we record a superset of its
    dumps), CC/CXX/CFLAGS/CXXFLAGS (inductor's C++ compiler) and ``ENV_NAMES``.

    Redaction choices:

    * a name containing TOKEN, KEY, SECRET, PASSWORD, PASSWD, CREDENTIAL or AUTH
      (case-insensitive): value ``"<redacted>"``;
    * a process-specific value (name with _PTR/POINTER/_ADDR/_PID/_FD, e.g. inductor's
      ``_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR`` which PyTorch's dumps leak):
      ``"<process-specific>"``, because it is meaningless and harmful elsewhere;
    * the home directory in any value: ``~``. Other absolute paths (cache dirs) are kept: they
      explain behaviour ("the cache was on NFS") and are not personal.

    Redacted names are listed in "redacted"; a replay must never set a redacted value.
    """
    env = os.environ if environ is None else environ
    variables: dict[str, str] = {}
    redacted: list[str] = []
    reasons: dict[str, str] = {}
    for name in sorted(env):
        if not _selected(name):
            continue
        upper = name.upper()
        if any(marker in upper for marker in SECRET_MARKERS):
            variables[name] = REDACTED
            redacted.append(name)
            reasons[name] = "secret-looking name"
        elif _PROCESS_SPECIFIC.search(upper):
            variables[name] = PROCESS_SPECIFIC
            redacted.append(name)
            reasons[name] = "process-specific value (pointer, pid or descriptor)"
        else:
            variables[name] = redact_paths(str(env[name]))
    return {"variables": variables, "redacted": redacted, "reasons": reasons}


# ---------------------------------------------------------------------------------------------
# System snapshot


def environment_diff(
    recorded_env: Mapping[str, Any] | None,
    recorded_system: Mapping[str, Any] | None,
    current_env: Mapping[str, Any] | None = None,
    current_system: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """What differs between the packing machine and this one, most consequential first.

    Each entry is ``{"what", "recorded", "current", "important"}``. ``current_*`` default to
    snapshots of this process. "important" marks the differences that usually change a
    compiler's behaviour (torch version or commit, GPU model, CUDA/HIP/cuDNN, Triton, CPU ISA);
    other system fields, package versions and environment variables follow. Redacted
    variables are compared as present/absent only.
    """
    out: list[dict[str, Any]] = []
    if recorded_system:
        if current_system is None:
            current_system = system_snapshot()  # runs nvidia-smi/nvcc/g++: only when needed
        # A partial record (e.g. from a TORCH_TRACE log) knows only some facts; a missing one is
        # unknown, not a difference.
        partial = bool(recorded_system.get("partial"))
        for label, getter, important in _SYSTEM_FIELDS:
            rv, cv = getter(recorded_system), getter(current_system)
            if rv is None and partial:
                continue
            if rv != cv:
                out.append({"what": label, "recorded": rv, "current": cv, "important": important})
        rec_pk = nested_get(recorded_system, "packages") or {}
        cur_pk = nested_get(current_system, "packages") or {}
        for name in sorted(set(rec_pk) | set(cur_pk)):
            if name in ("torch", "triton", "pytorch-triton"):
                continue  # reported above
            if rec_pk.get(name) is None and partial:
                continue
            if rec_pk.get(name) != cur_pk.get(name):
                out.append({"what": f"package {name}", "recorded": rec_pk.get(name),
                            "current": cur_pk.get(name), "important": False})
    if recorded_env is not None:
        if current_env is None:
            current_env = environment_snapshot()
        rec_vars = recorded_env.get("variables") or {}
        cur_vars = (current_env or {}).get("variables") or {}
        for name in sorted(set(rec_vars) | set(cur_vars)):
            rv, cv = rec_vars.get(name), cur_vars.get(name)
            if rv in (REDACTED, PROCESS_SPECIFIC) or cv in (REDACTED, PROCESS_SPECIFIC):
                if (rv is None) == (cv is None):
                    continue
            if rv != cv:
                out.append({"what": f"env {name}", "recorded": rv, "current": cv, "important": False})
    out.sort(key=lambda d: not d["important"])  # stable: keeps the field order within groups
    return out


# ---------------------------------------------------------------------------------------------
# Applying recorded variables to a replay
# ---------------------------------------------------------------------------------------------
# Applying the recorded environment variables to a replay, and saying which cannot be applied.
#
# Environment variables change PyTorch's behaviour at three different moments: at import (most
# ``TORCHINDUCTOR_*`` / ``TORCHDYNAMO_*`` variables only seed config defaults; ``TORCH_LOGS``,
# ``PYTORCH_CUDA_ALLOC_CONF``, ``CUDA_*`` are read once), at call time (a few are read lazily), or
# never again after start-up (``OMP_NUM_THREADS``, which has an in-process equivalent). Setting
# them all in ``os.environ`` for the duration of a replay is right for the lazy ones and harmless
# for the rest; the import-time ones are either covered by the recorded config snapshot (the config
# value they seeded was recorded) or reported as a warning. A child process started with
# ``--isolate`` gets them all before torch is imported, so nothing is lost there.
#
# Machine-specific values (cache and debug directories, trace paths, pointer values) are never
# copied: PyTorch's own dumps copy them and then point the replay at directories that do not exist.

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
