"""The environment record: which variables steer torch, and applying them to a replay.

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
from collections.abc import Iterator, Mapping
from typing import Any

from reproarchive.compat.inductor import default_cache_dir
from reproarchive.context.admission import variable_problem
from reproarchive.context.redaction import redact_paths, redacted_records
from reproarchive.format.schema import EnvironmentRecord

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
#: Names of the variables reproarchive set itself for a run it watches (``capture --`` sets
#: ``TORCH_COMPILE_DEBUG_DIR`` to its own temporary folder), comma-separated: not the user's,
#: so never recorded (a replay on the same machine would list them as differences).
OWN_VARIABLES_ENV = "REPROARCHIVE_OWN_VARIABLES"


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


def environment_snapshot(environ: Mapping[str, str] | None = None) -> EnvironmentRecord:
    """Environment variables that change PyTorch's behaviour, redacted.

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

    Redacted names are listed in "redacted"; a replay must never set a redacted value. The
    variables reproarchive set itself (named in ``$REPROARCHIVE_OWN_VARIABLES``) are left out.
    """
    env = os.environ if environ is None else environ
    variables: dict[str, str] = {}
    redacted: list[str] = []
    reasons: dict[str, str] = {}
    ours = set(env.get(OWN_VARIABLES_ENV, "").split(","))
    for name in sorted(env):
        if not _selected(name) or name in ours:
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
    return EnvironmentRecord(variables=variables, redacted=tuple(redacted), reasons=reasons)


# ---------------------------------------------------------------------------------------------
# System snapshot


def environment_diff(recorded: EnvironmentRecord, current: EnvironmentRecord | None = None) -> list[dict[str, Any]]:
    """Variables that differ, as ``{"what": "env NAME", "recorded", "current", "important"}``
    rows (None: not set on that side); redacted values are compared as present/absent only.

    ``current`` defaults to this process; then a variable set on one side only, to the value
    torch itself gives it on this machine when compiling (``set_by_torch_here``), is not a
    difference: it says that one process had compiled something, not how.
    """
    here = current is None
    raw: dict[str, str] = {}
    if current is None:
        # this process, redacted as every capture redacts (so "<inductor-cache>" == its folder)

        snapshot = environment_snapshot()
        raw = dict(snapshot.variables)
        current = redacted_records({"environment": snapshot})["environment"]
    out: list[dict[str, Any]] = []
    rec_vars, cur_vars = recorded.variables, current.variables
    for name in sorted(set(rec_vars) | set(cur_vars)):
        rv, cv = rec_vars.get(name), cur_vars.get(name)
        if rv in (REDACTED, PROCESS_SPECIFIC) or cv in (REDACTED, PROCESS_SPECIFIC):
            if (rv is None) == (cv is None):
                continue
        if rv == cv or (rv is not None and rv == raw.get(name)):  # or recorded before paths were redacted
            continue
        if here and (rv is None or cv is None) and set_by_torch_here(name, rv if cv is None else cv):
            continue
        out.append({"what": f"env {name}", "recorded": rv, "current": cv, "important": False})
    return out


def set_by_torch_here(name: str, value: str) -> bool:
    """Whether torch sets ``name`` to ``value`` (as recorded: paths redacted) by itself on this
    machine: inductor's cache folder and Triton's inside it, which torch exports when unset,
    and the pointer inductor exports for its C++ wrapper in every process that compiles."""
    if name.startswith("_TORCHINDUCTOR_PYOBJECT"):
        return True
    if name not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        return False
    try:
        plain = redact_paths(os.path.abspath(default_cache_dir()))
        defaults = {plain, redacted_records({"dir": plain})["dir"]}  # as recorded before and since
    except Exception:  # noqa: BLE001 - no inductor here: nothing is set by it
        return False
    if name == "TORCHINDUCTOR_CACHE_DIR":
        return value in defaults
    return any(value.startswith(d + os.sep + "triton" + os.sep) for d in defaults)


# ---------------------------------------------------------------------------------------------
# Applying recorded variables to a replay
# ---------------------------------------------------------------------------------------------

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


def machine_specific(name: str) -> bool:
    """Whether a variable's value is a location or identity on the recording machine (a path, a
    port, a cache): a replay never sets it, and two ranks' values differ by nature."""
    return _MACHINE_SPECIFIC.search(name) is not None


def plan(environment: EnvironmentRecord | None, *, config_applied: bool) -> tuple[dict[str, str], list[str]]:
    """(variables to set for the replay, warnings about those that cannot take effect)."""
    to_set: dict[str, str] = {}
    warnings: list[str] = []
    late: list[str] = []
    refused: list[str] = []
    for name, value in sorted((environment.variables if environment else {}).items()):
        if machine_specific(name) or _REDACTED.search(value) or value.startswith(("~", "<")):
            continue
        if variable_problem(name, value) is not None:
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
            "recorded environment variables not set because they could name a program, library or path, "
            "or make torch write files: "
            + ", ".join(refused[:10]) + (f" and {len(refused) - 10} more" if len(refused) > 10 else "")
        )
    if late:
        warnings.append(
            "recorded environment variables that only take effect when torch is imported: "
            + ", ".join(late)
            + " (use --isolate to apply them, or set them before running)"
        )
    return to_set, warnings


def take_thread_count(variables: Mapping[str, str]) -> None:
    """Set torch's thread count as ``OMP_NUM_THREADS`` in ``variables`` asks, as a process
    takes it when it starts (torch reads the variable once)."""
    import torch

    omp = variables.get("OMP_NUM_THREADS", "")
    if omp.isdigit() and int(omp) > 0:
        torch.set_num_threads(int(omp))


@contextlib.contextmanager
def applied_environment(to_set: Mapping[str, str]) -> Iterator[None]:
    """Set ``to_set`` in os.environ (and the thread count) for the duration; restore after."""
    import torch

    saved = {name: os.environ.get(name) for name in to_set}
    threads = torch.get_num_threads()
    try:
        os.environ.update(to_set)
        take_thread_count(to_set)
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


def child_environment(environment: EnvironmentRecord | None) -> dict[str, str]:
    """The environment for an isolated replay process: this one plus the recorded variables."""
    env = dict(os.environ)
    to_set, _ = plan(environment, config_applied=True)
    env.update(to_set)
    return env
