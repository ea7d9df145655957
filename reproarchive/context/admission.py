"""The one filter for a recorded config and environment: what a replay may apply (spec §9).

``run``, ``run --isolate``, ``run --minify`` and ``export`` apply an archive's recorded context
only through ``setting_problem`` and ``variable_problem``, so they cannot drift apart. The
archive may come from anyone, so its context may only steer *how* torch compiles, never *what
it runs, loads or writes*:

* a value is applied only when it is **data**: a boolean, a number, None, a short enum-like
  string (``ATEN,TRITON``, ``compile_error``, ``+dynamo``), or a list of these, and of the
  setting's own kind here (a boolean setting takes a boolean). Strings that start with ``-``
  (a compiler flag), contain a path separator, whitespace, ``=``, quotes or shell characters,
  or a dot outside a version number (a module or file name) are not data;
* a setting or variable is never applied when its **name** says it is a program, a path, a
  flag list, a library or a module (``cpp.cxx``, ``cache_dir``, ``*_FLAGS``, ``LD_PRELOAD``),
  or that it makes torch **write** or send something (traces, logs, dumps, saved arguments,
  repro scripts, remote caches, uploads: ``trace.enabled``, ``TORCH_LOGS_OUT``,
  ``TORCH_COMPILE_DEBUG``). A variable that seeds a config setting is judged as that setting.

Anything refused is left as it is here and reported by name with the reason. ``run`` also runs
the compile in a private working folder with torch's debug folder inside it
(``replay.containment``), so a writer this filter does not know writes nothing that stays.
"""

from __future__ import annotations

import functools
import re
import sys
from typing import Any

from reproarchive.compat.config_modules import config_module_type

#: The config modules every snapshot records in full, and the only ones a replay or an exported
#: script ever imports by name. Other ``ConfigModule`` instances that are already imported when
#: a snapshot is taken (``torch.compiler.config``, a third-party backend's config ...) are
#: recorded too, but never imported just for that.
CONFIG_MODULES = (
    "torch._dynamo.config",
    "torch._inductor.config",
    "torch._functorch.config",
    "torch.fx.experimental._config",
)

#: torch's other config modules (a fixed list, never names read from an archive). Comparing a
#: record with this machine (``doctor``, ``run``'s differences) may import these, and
#: ``CONFIG_MODULES``, to read their values: a module that is merely not imported yet must not
#: look like settings this torch lacks. Nothing is ever applied to them; any other module a
#: record names is compared only when it is already imported here.
COMPARED_MODULES = CONFIG_MODULES + (
    "torch._export.config",
    "torch._inductor.config_comms",
    "torch.compiler.config",
    "torch.distributed.config",
    "torch.utils.serialization.config",
)

#: A string value that is data: enum-like tokens and comma lists of them, or a version number.
_DATA_STRING = re.compile(r"^(?:[A-Za-z0-9_+][A-Za-z0-9_+:,-]{0,63}|[0-9]{1,9}(?:\.[0-9]{1,9}){0,3})?$")

#: Words (between ``.`` and ``_``) of a name that hands its value to a program, the file system
#: or the import system.
_PROGRAM_WORDS = frozenset("""
    cxx cc c_compiler compiler linker ld nvcc ptxas hipcc cmd command shell exe executable binary bin
    flags cflags cxxflags ldflags args arg path paths dir dirs root file files filename url
    library libraries lib libs preload module modules plugin plugins import home
""".split())
#: Words of a name that makes torch write, log, profile or send something.
_OUTPUT_WORDS = frozenset("""
    trace traces log logs logging logpath tlparse dump dumps save temps record repro upload remote host
    port proton redis profile profiler cprofile
""".split())
#: Words of a name whose *string* value is where something is written.
_DESTINATION_WORDS = frozenset("output outputs out".split())
#: Variables that make torch write without an output word in their name.
_OUTPUT_VARIABLES = frozenset({"TORCH_COMPILE_DEBUG", "TORCHINDUCTOR_DEBUG", "TORCH_COMPILE_CPROFILE"})
#: Variable names that steer PyTorch and its libraries (the rest of the environment is the
#: user's, never the archive's).
_REPLAYABLE = re.compile(
    r"^(TORCH|PYTORCH|INDUCTOR|TRITON_|CUDA_|CUBLAS|CUDNN|NCCL_|OMP_NUM_THREADS$|MKL_|KMP_|DNNL_|ONEDNN_|HIP_|ROCM_)"
)


def _words(name: str) -> set[str]:
    return set(re.split(r"[._]", name.lower()))


def name_problem(name: str, value: Any = None) -> str | None:
    """Why a setting or variable name may never be applied from an archive (None: it may)."""
    words = _words(name)
    if words & _PROGRAM_WORDS:
        return "names a program, path, flag list, library or module"
    if words & _OUTPUT_WORDS or isinstance(value, str) and words & _DESTINATION_WORDS:
        return "makes torch write, log or send something"
    return None


def data_value(value: Any, depth: int = 0) -> bool:
    """Booleans, numbers, None, data strings, and lists of these."""
    if value is None or isinstance(value, (bool, int, float)):
        return True
    if isinstance(value, str):
        return bool(_DATA_STRING.match(value))
    if isinstance(value, (list, tuple, set, frozenset)) and depth < 2:
        return len(value) <= 256 and all(data_value(v, depth + 1) for v in value)
    return False


def _same_kind(value: Any, default: Any) -> bool:
    """A recorded value fits the setting when it has the kind of this torch's default."""
    if default is None or value is None:
        return True
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, (int, float)):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(default, str):
        return isinstance(value, str)
    if isinstance(default, (list, tuple, set, frozenset)):
        return isinstance(value, (list, tuple, set, frozenset))
    # a dict configures things data cannot be checked against; an unset sentinel takes anything
    return not isinstance(default, dict)


_UNKNOWN = object()


def setting_problem(key: str, value: Any, default: Any = _UNKNOWN) -> str | None:
    """Why a recorded config setting is not applied (None: it is). ``default`` is this torch's
    default for the setting, when it has one."""
    why = name_problem(key, value)
    if why is not None:
        return why
    if not data_value(value):
        return "its value is not plain data (a flag, a path, a module or an object)"
    if default is not _UNKNOWN and not _same_kind(value, default):
        return f"its value is a {type(value).__name__}, the setting takes a {type(default).__name__}"
    return None


def variable_problem(name: str, value: str) -> str | None:
    """Why a recorded environment variable is not set for a replay (None: it is)."""
    if not _REPLAYABLE.match(name):
        return "does not steer torch"
    if name in _OUTPUT_VARIABLES:
        return "makes torch write, log or send something"
    why = name_problem(name, value)
    if why is not None:
        return why
    if not data_value(value):
        return "its value is not plain data (a flag, a path, a module or an object)"
    setting = config_seeded_by(name)
    if setting is not None:
        module, key = setting
        why = name_problem(key, value)
        if why is not None:
            return f"seeds {module}.{key}, which {why}"
    return None


def config_seeded_by(variable: str) -> tuple[str, str] | None:
    """The (config module, key) whose default an environment variable seeds, if any."""
    return _seeded().get(variable)


@functools.lru_cache(maxsize=1)
def _seeded() -> dict[str, tuple[str, str]]:
    found: dict[str, tuple[str, str]] = {}
    ConfigModule = config_module_type()
    if ConfigModule is None:  # pragma: no cover - very old torch
        return found
    for mod_name in CONFIG_MODULES:
        __import__(mod_name)
    for mod_name, mod in list(sys.modules.items()):
        if not isinstance(mod, ConfigModule):
            continue
        for key, entry in getattr(mod, "_config", {}).items():
            for attr in ("env_name_default", "env_name_force"):
                names = getattr(entry, attr, None)
                for env in [names] if isinstance(names, str) else list(names or ()):
                    found.setdefault(env, (mod_name, key))
    return found
