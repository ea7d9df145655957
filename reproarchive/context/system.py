"""The system record: versions and hardware that take part in compiling and running a graph.

PyTorch's repro scripts say nothing about the CPU, the driver or Triton; "fails there, passes
here" then has no explanation. ``system_snapshot`` records them, ``system_diff`` says which
differ and marks the ones that usually change a compiler's behaviour.
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
from importlib import metadata
from typing import Any

from reproarchive.codec.device_runtime import cuda_runtime
from reproarchive.format.plain import from_plain
from reproarchive.format.schema import SystemRecord
from reproarchive.package_version import __version__

#: Distributions whose version changes what torch.compile produces or how it runs.
PACKAGES = (
    "torch", "triton", "pytorch-triton", "pytorch-triton-rocm", "pytorch-triton-xpu", "numpy",
    "sympy", "mpmath", "networkx", "jinja2", "filelock", "fsspec", "typing_extensions",
    "setuptools", "zstandard", "msgpack", "reproarchive", "torchvision", "torchaudio",
    "transformers", "accelerate", "nvidia-cuda-runtime-cu12", "nvidia-cudnn-cu12",
    "nvidia-cublas-cu12", "nvidia-nccl-cu12", "nvidia-cuda-nvrtc-cu12", "nvidia-nvjitlink-cu12",
    "nvidia-cuda-runtime", "nvidia-cudnn-cu13", "nvidia-cublas", "nvidia-nccl-cu13",
    "intel-openmp", "mkl",
)

#: CPU flags that decide which vector ISA inductor's C++ backend generates code for.
CPU_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq",
    "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "amx_fp16",
    "asimd", "sve", "sve2", "bf16", "i8mm",
)

_SUBPROCESS_TIMEOUT = 2.0


def _first_line(text: str, want: str | None = None) -> str | None:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if want:
        for ln in lines:
            if want in ln:
                return ln
    return lines[0] if lines else None


@functools.lru_cache(maxsize=1)
def _tool_versions() -> dict[str, Any]:
    """``nvidia-smi``, ``nvcc`` and the C++ compiler, queried concurrently with a short timeout.

    Cached for the process: tools do not change while it runs, and a wedged GPU can make
    ``nvidia-smi`` hang for minutes, which a capture must never inherit.
    """
    cxx = os.environ.get("CXX") or "g++"
    queries = {
        "driver": (["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], None),
        "nvcc": (["nvcc", "--version"], "release"),
        "cxx": ([cxx, "--version"], None),
    }
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    running = {}
    for name, (argv, _) in queries.items():
        exe = shutil.which(argv[0])
        if exe is None and name == "nvcc" and cuda_home:
            candidate = os.path.join(cuda_home, "bin", "nvcc")
            exe = candidate if os.access(candidate, os.X_OK) else None
        if exe is None:
            continue
        try:
            running[name] = subprocess.Popen(
                [exe, *argv[1:]], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                stdin=subprocess.DEVNULL, text=True,
            )
        except OSError:
            continue
    out: dict[str, Any] = {name: None for name in queries}
    for name, proc in running.items():
        try:
            stdout, _ = proc.communicate(timeout=_SUBPROCESS_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            out[name] = "<timed out>"
            continue
        if proc.returncode == 0:
            out[name] = _first_line(stdout, queries[name][1])
    out["cxx_command"] = os.path.basename(cxx)
    return out


def _cpu_info() -> dict[str, Any]:
    model = None
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if model is None and key in ("model name", "hardware", "cpu model", "uarch"):
                    model = value.strip()
                elif not flags and key in ("flags", "features"):
                    flags = set(value.split())
                if model and flags:
                    break
    except OSError:
        pass
    if not model:
        model = platform.processor() or None
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    info: dict[str, Any] = {
        "model": model,
        "machine": platform.machine(),
        "count": os.cpu_count(),
        "usable": affinity,
        "flags": sorted(f for f in CPU_FLAGS if f in flags),
    }
    return info


def _package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
        except Exception:  # a broken dist-info must not break a capture
            versions[name] = None
    if versions.get("reproarchive") is None:
        try:
            versions["reproarchive"] = __version__
        except ImportError:  # pragma: no cover
            pass
    # Only the packages that are present are interesting, plus the ones people ask about first.
    always = {"torch", "triton", "numpy", "sympy", "filelock", "networkx", "jinja2", "setuptools",
              "zstandard", "reproarchive"}
    return {k: v for k, v in versions.items() if v is not None or k in always}


@functools.lru_cache(maxsize=1)
def _system_snapshot_cached() -> SystemRecord:
    import torch

    tools = _tool_versions()
    try:
        cpu_capability = torch.backends.cpu.get_cpu_capability()
    except Exception:
        cpu_capability = None
    cpu = _cpu_info()
    cpu["capability"] = cpu_capability
    libc = platform.libc_ver()
    return from_plain(SystemRecord, {
        "torch": {
            "version": torch.__version__,
            "git_version": getattr(torch.version, "git_version", None),
            "debug": bool(getattr(torch.version, "debug", False)),
            "cuda": torch.version.cuda,
            "hip": getattr(torch.version, "hip", None),
            "xpu": getattr(torch.version, "xpu", None),
            "num_threads": torch.get_num_threads(),
        },
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
        },
        "os": {
            "system": platform.system(),
            "release": platform.release(),
            "platform": platform.platform(),
            "libc": " ".join(x for x in libc if x) or None,
        },
        "cpu": cpu,
        "cuda": cuda_runtime().system_info(torch, tools.get("driver")),
        "hip": {"version": getattr(torch.version, "hip", None)},
        "nvcc": tools.get("nvcc"),
        "cxx": {"command": tools.get("cxx_command"), "version": tools.get("cxx")},
        "packages": _package_versions(),
    })


def system_snapshot() -> SystemRecord:
    """Versions and hardware that take part in compiling and running a graph.

    Includes torch version and git hash, CUDA/cuDNN/HIP versions, Python, OS, CPU model, vector
    flags and the ISA torch dispatches to, GPUs (name, compute capability, memory), the driver
    (``nvidia-smi``), ``nvcc`` (its "release" line, the one that names the version), the C++
    compiler inductor's CPU backend calls, and the versions of the packages in ``PACKAGES``
    (missing ones as None). Without a usable GPU, ``"cuda"`` is ``{"available": False,
    "reason": ...}``. Computed once per process (well under a second; tool queries run
    concurrently with a 2 s cap).
    """
    return _system_snapshot_cached()


# ---------------------------------------------------------------------------------------------


def torch_version(system: SystemRecord | None) -> str | None:
    """The torch version a system record names (None: not recorded)."""
    return _get(system, "torch", "version")


def torch_here() -> str:
    """The torch version of this process."""
    import torch

    return torch.__version__


def _get(record: Any, *path: str) -> Any:
    """``record.a.b`` (records) or ``record[a]`` (maps), None where a level is missing."""
    for p in path:
        if record is None:
            return None
        record = record.get(p) if isinstance(record, dict) else getattr(record, p, None)
    return record


def _gpu_summary(system: SystemRecord) -> Any:
    devices = _get(system, "cuda", "devices")
    if not _get(system, "cuda", "available") or not devices:
        return "none"
    return [f"{d.name} (sm {d.capability})" for d in devices]


#: (label, getter, important). Important differences are the likely reason a replay differs.
_SYSTEM_FIELDS: tuple[tuple[str, Any, bool], ...] = (
    ("torch version", lambda s: _get(s, "torch", "version"), True),
    ("torch git hash", lambda s: _get(s, "torch", "git_version"), True),
    ("GPUs", _gpu_summary, True),
    ("CUDA version", lambda s: _get(s, "torch", "cuda"), True),
    ("HIP version", lambda s: _get(s, "torch", "hip"), True),
    ("cuDNN version", lambda s: _get(s, "cuda", "cudnn"), True),
    ("GPU driver", lambda s: _get(s, "cuda", "driver_version"), False),
    ("triton version", lambda s: _get(s, "packages", "triton") or _get(s, "packages", "pytorch-triton"), True),
    ("CPU ISA", lambda s: _get(s, "cpu", "capability"), True),
    ("CPU model", lambda s: _get(s, "cpu", "model"), False),
    ("C++ compiler", lambda s: _get(s, "cxx", "version"), False),
    ("nvcc", lambda s: _get(s, "nvcc"), False),
    ("Python version", lambda s: _get(s, "python", "version"), False),
    ("OS", lambda s: _get(s, "os", "platform"), False),
)


def system_diff(recorded: SystemRecord, current: SystemRecord | None = None) -> list[dict[str, Any]]:
    """System facts that differ, as ``{"what", "recorded", "current", "important"}`` rows:
    "important" ones (torch version or commit, GPU model, CUDA/HIP/cuDNN, Triton, CPU ISA)
    first, then other fields and package versions. ``current`` defaults to this machine."""
    if current is None:
        current = system_snapshot()  # runs nvidia-smi/nvcc/g++: only when needed
    # A partial record (e.g. from a TORCH_TRACE log) knows only some facts; one it lacks is
    # unknown, not a difference.
    partial = bool(recorded.partial)
    out: list[dict[str, Any]] = []
    for label, getter, important in _SYSTEM_FIELDS:
        rv, cv = getter(recorded), getter(current)
        if rv is None and partial:
            continue
        if rv != cv:
            out.append({"what": label, "recorded": rv, "current": cv, "important": important})
    rec_pk = recorded.packages or {}
    cur_pk = current.packages or {}
    for name in sorted(set(rec_pk) | set(cur_pk)):
        if name in ("torch", "triton", "pytorch-triton"):
            continue  # reported above
        if rec_pk.get(name) is None and partial:
            continue
        if rec_pk.get(name) != cur_pk.get(name):
            out.append({"what": f"package {name}", "recorded": rec_pk.get(name),
                        "current": cur_pk.get(name), "important": False})
    out.sort(key=lambda d: not d["important"])  # stable: keeps the field order within groups
    return out
