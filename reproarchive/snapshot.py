"""Config, environment and system snapshots: what, besides the graph, decides how it compiles.

PyTorch's repro scripts record only the config values that differ from the defaults, silently
drop the ones they cannot print (custom passes), copy machine-specific environment values
(cache dirs, pointer values) and say nothing about the CPU, the driver or Triton. A failure that
depends on any of these then "does not reproduce" on a teammate's machine and nobody knows why.
So an archive records:

* ``config``: the FULL value of every setting of the four compiler config modules, not just the
  changed ones, because defaults move between torch versions; the changed ones again, for people;
  every value that cannot be stored listed by name with the reason (never dropped silently);
* ``environment``: the variables that change PyTorch's behaviour, with secrets redacted;
* ``system``: versions of everything that takes part in compilation, and the hardware.

All three are plain msgpack-able dicts (str keys; str/int/float/bool/None/list/dict values) so
they go into the archive index unchanged. ``applied_config`` puts a recorded config back for a
replay; ``config_diff`` / ``environment_diff`` say what differs when a replay's outcome does.
"""

from __future__ import annotations

import contextlib
import copy
import enum
import functools
import importlib
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

#: The config modules every snapshot records in full. Other ``ConfigModule`` instances that are
#: already imported when the snapshot is taken (``torch.compiler.config``, ``torch._export.config``,
#: a third-party backend's config ...) are recorded too, but never imported just for this.
CONFIG_MODULES = (
    "torch._dynamo.config",
    "torch._inductor.config",
    "torch._functorch.config",
    "torch.fx.experimental._config",
)

# ---------------------------------------------------------------------------------------------
# Path redaction
# ---------------------------------------------------------------------------------------------

_PATH_END = r"(?![\w.\-+@])"  # "/home/ann" must not match inside "/home/anna"


def _prefix_variants(prefix: str) -> list[str]:
    out = []
    for p in (prefix, os.path.realpath(prefix)):
        p = p.rstrip("/\\")
        if len(p) > 1 and p not in out:
            out.append(p)
    return out


def redact_paths(
    text: str,
    prefixes: Iterable[str | os.PathLike] | Mapping[str, str] = (),
    *,
    home: bool = True,
) -> str:
    """Replace machine-specific absolute path prefixes in ``text``.

    The home directory becomes ``~`` (it names the user). ``prefixes`` adds other directories:
    as a mapping ``{prefix: replacement}`` (e.g. ``{save_dir: "<save_dir>", cwd: "."}``) or as a
    plain list, whose entries become ``<path>``. Both the given and the symlink-resolved
    spelling of each prefix are replaced; a prefix only matches at a path-component boundary,
    and longer prefixes win over shorter ones (so a cwd inside the home directory is replaced
    as the cwd, not as ``~/...``).
    """
    if not isinstance(text, str) or not text:
        return text
    pairs: dict[str, str] = {}
    items = prefixes.items() if isinstance(prefixes, Mapping) else ((p, "<path>") for p in prefixes)
    for prefix, repl in items:
        for variant in _prefix_variants(os.fspath(prefix)):
            pairs.setdefault(variant, repl)
    if home:
        home_dir = os.path.expanduser("~")
        if home_dir not in ("~", "/", ""):
            for variant in _prefix_variants(home_dir):
                pairs.setdefault(variant, "~")
    for prefix in sorted(pairs, key=len, reverse=True):
        text = re.sub(re.escape(prefix) + _PATH_END, lambda _m, r=pairs[prefix]: r, text)
    return text


_ABS_PATH = re.compile(r"(?:^|[\s=:'\"(\[,])(?:/[\w.\-+@~]+|[A-Za-z]:\\)")


def _looks_like_path(value: Any) -> bool:
    if isinstance(value, str):
        return bool(_ABS_PATH.search(value))
    if isinstance(value, (list, tuple)):
        return any(_looks_like_path(v) for v in value)
    if isinstance(value, dict):
        return any(_looks_like_path(v) for v in value.values())
    return False


def _redact_value(value: Any, prefixes: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        return redact_paths(value, prefixes)
    if isinstance(value, list):
        return [_redact_value(v, prefixes) for v in value]
    if isinstance(value, dict):
        return {k: _redact_value(v, prefixes) for k, v in value.items()}
    return value


# ---------------------------------------------------------------------------------------------
# Config snapshot
# ---------------------------------------------------------------------------------------------


class _Unrepresentable(Exception):
    pass


_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1


def _plain(value: Any) -> Any:
    """Convert a config value to plain msgpack data, or raise _Unrepresentable(reason).

    Tuples become lists and sets sorted lists (their container type is recorded next to the
    value so that ``applied_config`` can restore it). Anything whose meaning would change in
    the conversion (callables, classes, enums, dicts with non-str keys, objects) is refused.
    """
    if value is None or isinstance(value, (bool, str, float)):
        return value
    if isinstance(value, enum.Enum):
        raise _Unrepresentable(f"enum value {type(value).__qualname__}.{value.name}")
    if isinstance(value, int):
        if not _INT_MIN <= value <= _INT_MAX:
            raise _Unrepresentable("integer out of the 64-bit range")
        return int(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        items = [_plain(v) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return sorted(items, key=repr)
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise _Unrepresentable("dict with non-string keys")
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, type):
        raise _Unrepresentable(f"class {value.__module__}.{value.__qualname__}")
    if callable(value):
        name = getattr(value, "__qualname__", None) or type(value).__qualname__
        module = getattr(value, "__module__", None) or type(value).__module__
        raise _Unrepresentable(f"callable {module}.{name} (code is never stored in an archive)")
    raise _Unrepresentable(f"object of type {type(value).__module__}.{type(value).__qualname__}")


def _container_type(value: Any) -> str | None:
    if isinstance(value, tuple):
        return "tuple"
    if isinstance(value, (set, frozenset)):
        return "set"
    return None


def _short_repr(value: Any, limit: int = 300) -> str:
    try:
        text = repr(value)
    except Exception as exc:  # a broken __repr__ must not break a capture
        text = f"<repr failed: {type(exc).__name__}>"
    text = redact_paths(text)
    text = re.sub(r" at 0x[0-9a-fA-F]+", "", text)  # addresses differ every run
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _config_modules(import_required: bool = True) -> dict[str, Any]:
    mods: dict[str, Any] = {}
    for name in CONFIG_MODULES:
        mod = sys.modules.get(name)
        if mod is None and import_required:
            try:
                mod = importlib.import_module(name)
            except ImportError:
                mod = None
        if mod is not None:
            mods[name] = mod
    try:
        from torch.utils._config_module import ConfigModule
    except ImportError:  # pragma: no cover - very old torch
        return mods
    for name, mod in list(sys.modules.items()):
        if name not in mods and isinstance(mod, ConfigModule):
            mods[name] = mod
    return dict(sorted(mods.items()))


def _is_changed(mod: Any, key: str, value: Any) -> bool:
    """True when the current value differs from the setting's default.

    ``ConfigModule._is_default`` also calls a setting "not default" when it was merely assigned
    its default value; people reading "changed" want values, so compare values.
    """
    entry = mod._config[key]
    default = entry.default
    if getattr(entry, "justknob", None) is not None and default is not None:
        return value != default
    try:
        return bool(value != default)
    except Exception:  # exotic __eq__ (tensors, arrays): identity is the best we can do
        return value is not default


def config_snapshot() -> dict[str, Any]:
    """The full current compiler configuration as plain data.

    Returns ``{"modules": {module: {key: value}}, "changed": {module: {key: value}},
    "defaults": {module: {key: default}} (for the changed keys), "unrepresentable": [{module,
    key, reason, repr}], "types": {module: {key: "tuple"|"set"}}, "machine_specific": [{module,
    key}]}``. Nested config classes appear flattened with dotted keys
    (``"cpp.inject_relu_bug_TESTING_ONLY"``), as ``ConfigModule`` stores them. A value that is
    not plain data is absent from "modules"/"changed" and listed in "unrepresentable" with a
    redacted ``repr``. Values that are absolute paths (cache and debug dirs, the CUTLASS
    checkout) are recorded with the home directory and cwd redacted and listed in
    "machine_specific": they describe the packing machine, so ``applied_config`` never
    applies them. Settings that are aliases of another setting are not recorded twice.
    """
    cwd = os.getcwd()
    path_prefixes = {cwd: "<cwd>"} if cwd not in ("/", "") else {}
    modules: dict[str, dict[str, Any]] = {}
    changed: dict[str, dict[str, Any]] = {}
    defaults: dict[str, dict[str, Any]] = {}
    types: dict[str, dict[str, str]] = {}
    unrepresentable: list[dict[str, str]] = []
    machine_specific: list[dict[str, str]] = []

    for mod_name, mod in _config_modules().items():
        try:
            values = mod._get_dict()  # skips aliases; reads values without deprecation warnings
        except Exception:
            values = mod.get_config_copy()
        plain_values: dict[str, Any] = {}
        for key in sorted(values):
            value = values[key]
            is_changed = _is_changed(mod, key, value)
            try:
                plain = _plain(value)
            except _Unrepresentable as why:
                unrepresentable.append(
                    {
                        "module": mod_name,
                        "key": key,
                        "reason": str(why),
                        "repr": _short_repr(value),
                        "changed": is_changed,
                    }
                )
                continue
            if _looks_like_path(plain):
                plain = _redact_value(plain, path_prefixes)
                machine_specific.append({"module": mod_name, "key": key})
            plain_values[key] = plain
            kind = _container_type(value)
            if kind:
                types.setdefault(mod_name, {})[key] = kind
            if is_changed:
                changed.setdefault(mod_name, {})[key] = plain
                try:
                    defaults.setdefault(mod_name, {})[key] = _plain(mod._config[key].default)
                except (_Unrepresentable, KeyError, AttributeError):
                    defaults.setdefault(mod_name, {})[key] = _short_repr(
                        getattr(mod._config.get(key), "default", None)
                    )
        modules[mod_name] = plain_values

    return {
        "modules": modules,
        "changed": changed,
        "defaults": defaults,
        "unrepresentable": unrepresentable,
        "types": types,
        "machine_specific": machine_specific,
    }


# ---------------------------------------------------------------------------------------------
# Applying a recorded config
# ---------------------------------------------------------------------------------------------


class AppliedConfig:
    """What ``applied_config`` did, so the caller can warn about what it could not do."""

    def __init__(self) -> None:
        self.applied: list[str] = []  # "module.key"
        self.missing: list[str] = []  # recorded keys this torch does not have
        self.missing_modules: list[str] = []  # recorded modules that cannot be imported here
        self.unrepresentable: list[str] = []  # recorded as unrepresentable: left as they are here
        self.machine_specific: list[str] = []  # paths of the packing machine: left as they are
        self.forced_by_env: list[str] = []  # an env var here forces a value; recorded one ignored
        self.failed: list[dict[str, str]] = []  # setattr raised
        self.unsafe: list[str] = []  # values that could name a program, path or command: not applied

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    def __repr__(self) -> str:
        return (
            f"AppliedConfig(applied={len(self.applied)}, missing={self.missing}, "
            f"missing_modules={self.missing_modules}, unrepresentable={self.unrepresentable}, "
            f"forced_by_env={self.forced_by_env}, failed={self.failed})"
        )


# A replayed archive may come from anyone, so its config may only steer *how* torch compiles,
# never *what it runs*: inductor hands some string settings (cpp.cxx, flags) to subprocesses.
_SAFE_STRING = re.compile(r"^[A-Za-z0-9_.:+,-]{0,64}$")  # enum-like, and lists such as "ATEN,CPP"
_PROGRAM_KEY = re.compile(
    r"(^|[._])(cxx|cc|c_compiler|compiler|linker|ld|nvcc|ptxas|cmd|command|shell|exe|executable|binary|"
    r"flags|cflags|ldflags|args|path|paths|dir|dirs|root|file|files|url|library|libraries|libs)($|[._])"
)


def safe_to_apply(key: str, value: Any) -> bool:
    """Whether a recorded config value may be applied: data (bools, numbers, None, short
    enum-like strings and lists of these), under a key that does not name a program or path."""
    if _PROGRAM_KEY.search(key.lower()) and not isinstance(value, (bool, int, float, type(None))):
        return False
    if isinstance(value, (list, tuple)):
        return all(safe_to_apply(key, v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _SAFE_STRING.match(k) and safe_to_apply(key, v) for k, v in value.items())
    if isinstance(value, str):
        return bool(_SAFE_STRING.match(value))
    return isinstance(value, (bool, int, float, type(None)))


def _config_module_named(name: str) -> Any:
    """A torch config module by name: one of ours, or one already imported. Never an import
    of an arbitrary name from an archive (importing runs the module's code)."""
    if name in CONFIG_MODULES:
        try:
            return importlib.import_module(name)
        except ImportError:
            return None
    mod = sys.modules.get(name)
    try:
        from torch.utils._config_module import ConfigModule
    except ImportError:  # pragma: no cover
        return None
    return mod if isinstance(mod, ConfigModule) else None


def _restore_type(value: Any, kind: str | None) -> Any:
    if kind == "tuple" and isinstance(value, list):
        return tuple(value)
    if kind == "set" and isinstance(value, list):
        return set(value)
    return value


_UNSET = object()
try:
    from torch.utils._config_module import _UNSET_SENTINEL as _TORCH_UNSET
except ImportError:  # pragma: no cover - older torch: nothing is ever forced by env
    _TORCH_UNSET = _UNSET


@contextlib.contextmanager
def applied_config(config_record: Mapping[str, Any] | None, *, only_changed: bool = False) -> Iterator[AppliedConfig]:
    """Apply a recorded config snapshot to the live torch config modules for the ``with`` body.

    Every recorded value is applied (or, with ``only_changed``, only those that differed from
    the defaults on the packing machine), so a default that moved between torch versions does
    not change a replay. Never applied: keys this torch does not have (listed in ``missing``),
    values recorded as unrepresentable (a custom pass cannot come back from data) and
    machine-specific paths. On exit every touched setting is restored to exactly its previous
    state, "not set by the user" included, so ``_is_default`` and the inductor cache key see no
    trace of the replay. Like ``ConfigModule.patch`` this is per-thread (context-local).
    """
    result = AppliedConfig()
    if not config_record:
        yield result
        return
    modules = config_record.get("modules") or {}
    changed = config_record.get("changed") or {}
    types = config_record.get("types") or {}
    skip = {(u.get("module"), u.get("key")) for u in config_record.get("unrepresentable") or []}
    machine = {(u.get("module"), u.get("key")) for u in config_record.get("machine_specific") or []}

    changed_keys = {(m, k) for m, vals in changed.items() for k in vals}
    undo: list[tuple[Any, str, Any, Any]] = []
    try:
        for mod_name, values in modules.items():
            mod = _config_module_named(mod_name)
            if mod is None:
                result.missing_modules.append(mod_name)
                continue
            config = getattr(mod, "_config", None)
            if not isinstance(config, dict):
                result.missing_modules.append(mod_name)
                continue
            wanted = changed.get(mod_name, {}) if only_changed else values
            for key, value in wanted.items():
                full = f"{mod_name}.{key}"
                if (mod_name, key) in skip:
                    result.unrepresentable.append(full)
                    continue
                if (mod_name, key) in machine:
                    result.machine_specific.append(full)
                    continue
                if not safe_to_apply(key, value):
                    if (mod_name, key) in changed_keys:  # a default left as it is needs no warning
                        result.unsafe.append(full)
                    continue
                entry = config.get(key)
                if entry is None:
                    result.missing.append(full)
                    continue
                if getattr(entry, "alias", None) is not None:
                    continue
                if getattr(entry, "deprecated", False) and (mod_name, key) not in changed_keys:
                    continue  # "does nothing"; setting it would only print a FutureWarning
                value = _restore_type(copy.deepcopy(value), types.get(mod_name, {}).get(key))
                prior_override = entry.user_override.get()
                prior_hide = getattr(entry, "hide", False)
                try:
                    setattr(mod, key, value)
                except Exception as exc:
                    result.failed.append({"key": full, "error": f"{type(exc).__name__}: {exc}"})
                    continue
                undo.append((mod, key, prior_override, prior_hide))
                result.applied.append(full)
                forced = getattr(entry, "env_value_force", _TORCH_UNSET)
                if forced is not _TORCH_UNSET and forced != value:
                    result.forced_by_env.append(full)
        for u in config_record.get("unrepresentable") or []:
            full = f"{u.get('module')}.{u.get('key')}"
            if u.get("changed") and full not in result.unrepresentable:
                result.unrepresentable.append(full)
        yield result
    finally:
        for mod, key, prior_override, prior_hide in reversed(undo):
            entry = mod._config[key]
            entry.user_override.set(prior_override)
            entry.hide = prior_hide
            dirty = getattr(mod, "_hash_dirty_var", None)
            if dirty is not None:
                dirty.set(True)
            mark = getattr(mod, "_mark_get_dict_dirty", None)
            if mark is not None:
                mark(key)


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
# ---------------------------------------------------------------------------------------------

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
    from importlib import metadata

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
            from . import __version__

            versions["reproarchive"] = __version__
        except ImportError:  # pragma: no cover
            pass
    # Only the packages that are present are interesting, plus the ones people ask about first.
    always = {"torch", "triton", "numpy", "sympy", "filelock", "networkx", "jinja2", "setuptools",
              "zstandard", "reproarchive"}
    return {k: v for k, v in versions.items() if v is not None or k in always}


def _cuda_info(torch: Any, tools: Mapping[str, Any]) -> dict[str, Any]:
    info: dict[str, Any] = {"available": False, "version": torch.version.cuda}
    cudnn = None
    try:
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:
        cudnn = None
    info["cudnn"] = cudnn
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        info["reason"] = f"this torch build has no CUDA/ROCm support ({torch.__version__})"
        info["driver_version"] = tools.get("driver")
        return info
    try:
        available = torch.cuda.is_available()
    except Exception as exc:
        available = False
        info["reason"] = f"torch.cuda.is_available() raised {type(exc).__name__}: {exc}"
    if not available:
        info.setdefault(
            "reason",
            "no usable GPU (no device, no driver, or CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')!s})",
        )
        info["driver_version"] = tools.get("driver")
        return info
    devices = []
    for index in range(torch.cuda.device_count()):
        try:
            props = torch.cuda.get_device_properties(index)
        except Exception as exc:
            devices.append({"index": index, "error": f"{type(exc).__name__}: {exc}"})
            continue
        devices.append(
            {
                "index": index,
                "name": props.name,
                "capability": f"{props.major}.{props.minor}",
                "total_memory": int(props.total_memory),
                "multi_processor_count": int(props.multi_processor_count),
                "arch": getattr(props, "gcnArchName", None),
            }
        )
    info.update(
        available=True,
        device_count=len(devices),
        devices=devices,
        driver_version=tools.get("driver"),
        arch_list=list(torch.cuda.get_arch_list()) if hasattr(torch.cuda, "get_arch_list") else None,
    )
    return info


@functools.lru_cache(maxsize=1)
def _system_snapshot_cached() -> dict[str, Any]:
    import torch

    tools = _tool_versions()
    try:
        cpu_capability = torch.backends.cpu.get_cpu_capability()
    except Exception:
        cpu_capability = None
    cpu = _cpu_info()
    cpu["capability"] = cpu_capability
    libc = platform.libc_ver()
    return {
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
        "cuda": _cuda_info(torch, tools),
        "hip": {"version": getattr(torch.version, "hip", None)},
        "nvcc": tools.get("nvcc"),
        "cxx": {"command": tools.get("cxx_command"), "version": tools.get("cxx")},
        "packages": _package_versions(),
    }


def system_snapshot() -> dict[str, Any]:
    """Versions and hardware that take part in compiling and running a graph.

    Includes torch version and git hash, CUDA/cuDNN/HIP versions, Python, OS, CPU model, vector
    flags and the ISA torch dispatches to, GPUs (name, compute capability, memory), the driver
    (``nvidia-smi``), ``nvcc`` (its "release" line, the one that names the version), the C++
    compiler inductor's CPU backend calls, and the versions of the packages in ``PACKAGES``
    (missing ones as None). Without a usable GPU, ``"cuda"`` is ``{"available": False,
    "reason": ...}``. Computed once per process (well under a second; tool queries run
    concurrently with a 2 s cap) and returned as a fresh copy.
    """
    return copy.deepcopy(_system_snapshot_cached())


# ---------------------------------------------------------------------------------------------
# Diffs
# ---------------------------------------------------------------------------------------------


def config_diff(recorded: Mapping[str, Any] | None, current: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Settings whose recorded value differs from the current one.

    Each entry is ``{module, key, recorded, current, status}`` with status ``"differs"``,
    ``"missing_here"`` (this torch has no such setting), ``"new_here"`` (a setting the recording
    torch did not have, listed only when it is not at its default here) or ``"unrepresentable"``
    (a callable or object on either side: compared by redacted ``repr``). Machine-specific
    paths are not compared.
    """
    recorded = recorded or {}
    current = current or {}
    rec_mods = recorded.get("modules") or {}
    cur_mods = current.get("modules") or {}
    machine = {(m.get("module"), m.get("key")) for side in (recorded, current)
               for m in side.get("machine_specific") or []}
    rec_un = {(u["module"], u["key"]): u.get("repr") for u in recorded.get("unrepresentable") or []}
    cur_un = {(u["module"], u["key"]): u.get("repr") for u in current.get("unrepresentable") or []}
    cur_changed = current.get("changed") or {}
    out: list[dict[str, Any]] = []
    for mod in sorted(set(rec_mods) | set(cur_mods)):
        if mod not in rec_mods:
            continue  # a config module only imported here says nothing about the recording
        rec_vals = rec_mods.get(mod) or {}
        cur_vals = cur_mods.get(mod)
        keys = set(rec_vals) | {k for (m, k) in rec_un if m == mod}
        if cur_vals is not None:
            keys |= set(cur_vals) | {k for (m, k) in cur_un if m == mod}
        for key in sorted(keys):
            if (mod, key) in machine:
                continue
            r_un, c_un = (mod, key) in rec_un, (mod, key) in cur_un
            rv = rec_un.get((mod, key)) if r_un else rec_vals.get(key, _UNSET)
            if cur_vals is None:
                cv = _UNSET
            else:
                cv = cur_un.get((mod, key)) if c_un else cur_vals.get(key, _UNSET)
            if rv is _UNSET and cv is _UNSET:
                continue
            if rv is _UNSET:
                if key not in cur_changed.get(mod, {}):
                    continue
                out.append({"module": mod, "key": key, "recorded": None, "current": cv, "status": "new_here"})
            elif cv is _UNSET:
                out.append({"module": mod, "key": key, "recorded": rv, "current": None, "status": "missing_here"})
            elif rv != cv or r_un != c_un:
                status = "unrepresentable" if (r_un or c_un) else "differs"
                out.append({"module": mod, "key": key, "recorded": rv, "current": cv, "status": status})
    return out


def nested_get(d: Any, *path: str) -> Any:
    """``d[path[0]][path[1]]...``, or None where a level is missing or not a mapping."""
    for p in path:
        if not isinstance(d, Mapping):
            return None
        d = d.get(p)
    return d


def _gpu_summary(system: Any) -> Any:
    devices = nested_get(system, "cuda", "devices")
    if not nested_get(system, "cuda", "available") or not devices:
        return "none"
    return [f"{d.get('name')} (sm {d.get('capability')})" for d in devices]


#: (label, getter, important). Important differences are the likely reason a replay differs.
_SYSTEM_FIELDS: tuple[tuple[str, Any, bool], ...] = (
    ("torch version", lambda s: nested_get(s, "torch", "version"), True),
    ("torch git hash", lambda s: nested_get(s, "torch", "git_version"), True),
    ("GPUs", _gpu_summary, True),
    ("CUDA version", lambda s: nested_get(s, "torch", "cuda"), True),
    ("HIP version", lambda s: nested_get(s, "torch", "hip"), True),
    ("cuDNN version", lambda s: nested_get(s, "cuda", "cudnn"), True),
    ("GPU driver", lambda s: nested_get(s, "cuda", "driver_version"), False),
    ("triton version", lambda s: nested_get(s, "packages", "triton") or nested_get(s, "packages", "pytorch-triton"), True),
    ("CPU ISA", lambda s: nested_get(s, "cpu", "capability"), True),
    ("CPU model", lambda s: nested_get(s, "cpu", "model"), False),
    ("C++ compiler", lambda s: nested_get(s, "cxx", "version"), False),
    ("nvcc", lambda s: nested_get(s, "nvcc"), False),
    ("Python version", lambda s: nested_get(s, "python", "version"), False),
    ("OS", lambda s: nested_get(s, "os", "platform"), False),
)


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
        for label, getter, important in _SYSTEM_FIELDS:
            rv, cv = getter(recorded_system), getter(current_system)
            if rv != cv:
                out.append({"what": label, "recorded": rv, "current": cv, "important": important})
        rec_pk = nested_get(recorded_system, "packages") or {}
        cur_pk = nested_get(current_system, "packages") or {}
        for name in sorted(set(rec_pk) | set(cur_pk)):
            if name in ("torch", "triton", "pytorch-triton"):
                continue  # reported above
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


__all__ = [
    "CONFIG_MODULES",
    "AppliedConfig",
    "applied_config",
    "config_diff",
    "config_snapshot",
    "environment_diff",
    "environment_snapshot",
    "redact_paths",
    "system_snapshot",
]
