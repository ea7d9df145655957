"""``pack_dump``: turn a PyTorch repro dump into one archive, without touching the caller.

PyTorch's dumps are Python scripts that set environment variables and torch config when
imported and read their inputs from an absolute ``save_dir``. Importing one in the caller's
process would change its torch for good, so the work happens in a child process
(``reproarchive.sources.dump.pack_child``) that writes the archive itself; this side only finds the dump,
starts the child with a clean copy of the environment, relays progress and turns the child's
report (a ``PackReport``) back. The caller's environment, torch config and cwd are never changed.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable

from reproarchive import errors
from reproarchive.child import run_child
from reproarchive.context.environment import OWN_VARIABLES_ENV
from reproarchive.errors import SourceError
from reproarchive.sources.dump.scripts import Discovery, discover
from reproarchive.sources.pack_report import PackReport

DEFAULT_ARCHIVE_NAME = "repro.tar.zst"
# The same filter PyTorch uses when it writes env lines into a dump
# (torch._dynamo.debug_utils.generate_env_vars_string): every such variable of the failing
# process is in the script, so the packing process's own values are removed from the child.
_DUMP_ENV_MARKERS = ("TORCH", "DYNAMO", "INDUCTOR", "TRITON")


_MACHINE_TOOLCHAIN = ("TRITON_LIBDEVICE_PATH", "TRITON_PTXAS_PATH", "TRITON_LIBCUDA_PATH")


def child_env() -> dict[str, str]:
    """The environment of a child that runs the user's own dump or log payload."""
    # PyTorch's own rule: the dump sets the TORCH/DYNAMO/INDUCTOR/TRITON variables it recorded,
    # except the toolchain paths it deliberately never records (they belong to this machine).
    env = {k: v for k, v in os.environ.items()
           if k in _MACHINE_TOOLCHAIN or not any(m in k for m in _DUMP_ENV_MARKERS)}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def pack_dump(
    source: str | os.PathLike | None = None,
    out: str | os.PathLike | None = None,
    *,
    replay: bool = True,
    cwd: str | os.PathLike | None = None,
    progress: Callable[[str], None] | None = None,
    keep_log: str | os.PathLike | None = None,
    imports: tuple[str, ...] = (),
    libraries: tuple[str, ...] = (),
    custom_ops_from: list[Path] | tuple = (),
    own_variables: Sequence[str] = (),
    execution_from: Path | None = None,
) -> PackReport:
    """Pack the PyTorch repro dump ``source`` (a script, a folder, or None: search ``cwd``).

    ``out`` defaults to ``repro.tar.zst`` in ``cwd``. ``replay=False`` skips the one replay that
    records the failure (the record then says "unknown"). ``progress`` receives one short line
    per stage. ``keep_log`` copies the child's output there (for --debug). ``imports`` and
    ``libraries`` bring the real implementation of custom ops the dump calls (the user's
    ``--import`` / ``--load-library``); ``custom_ops_from``: archives whose recorded custom-op
    calls stand in for ops still missing (``capture --`` records them). ``own_variables``:
    variables the dump sets that reproarchive set for the dumping run (``capture --``), left
    out of the environment record. ``execution_from``: the thread states the dumping process
    noted at its compiles (``capture --``'s guard); the failing compile's is recorded and
    replayed under. Raises SourceError
    (exit 4) when there is no usable dump, PackError when the dump cannot be packed.
    """
    cwd = Path(cwd) if cwd is not None else Path.cwd()
    found: Discovery = discover(source, cwd)
    script = found.chosen
    out_path = _out_path(out, cwd)

    # Prefixes the child scrubs from everything it stores: where the dump lives (a run_* folder
    # or the folder holding repro.py) and where the user ran us from.
    dump_root = _dump_root(script)
    try:
        label = str(script.relative_to(cwd.resolve()))
    except ValueError:
        label = str(script.relative_to(dump_root.parent))

    request = {"script": str(script), "script_label": label, "out": str(out_path), "no_replay": not replay,
               "dump_prefix": [str(dump_root), str(script.parent)], "cwd_prefix": [str(cwd.resolve())],
               "imports": list(imports), "libraries": [str(p) for p in libraries],
               "custom_ops_from": [str(p) for p in custom_ops_from],
               "execution_from": str(execution_from) if execution_from is not None else None}
    env = {**child_env(), OWN_VARIABLES_ENV: ",".join(own_variables)} if own_variables else child_env()
    report = _packed_in_child(request, env, progress, keep_log)
    return dataclasses.replace(PackReport.from_plain(report), script=script, discovery_reason=found.reason,
                               candidates=tuple(found.candidates))


def _out_path(out: str | os.PathLike | None, cwd: Path) -> Path:
    """The archive's absolute path: ``out`` relative to ``cwd``, a folder holding the default name."""
    out_path = Path(out) if out is not None else cwd / DEFAULT_ARCHIVE_NAME
    if not out_path.is_absolute():
        out_path = cwd / out_path
    if out_path.is_dir():
        out_path = out_path / DEFAULT_ARCHIVE_NAME
    if not out_path.parent.is_dir():
        raise SourceError(f"output folder {out_path.parent} does not exist", "create it or choose another -o")
    return out_path.resolve()


def _packed_in_child(request: dict, env: dict[str, str], progress: Callable[[str], None] | None,
                     keep_log: str | os.PathLike | None) -> Any:
    """The child's report; a replay that kills its process is packed again with the crash as
    the failure, since that crash is what the dump reproduces."""
    report, died = run_child("reproarchive.sources.dump.pack_child", request, env=env, on_event=progress,
                             keep_log=keep_log)
    if died is not None and (died.started or {}).get("stage") == "replay":
        # The graph crashed the process that replayed it: that is the failure to record.
        if progress is not None:
            progress(f"the replay {died.reason}: packing the dump with the crash as its failure")
        report, died = run_child("reproarchive.sources.dump.pack_child", {**request, "crash": died.crash_facts()},
                                 env=env,
                                 on_event=progress)
    if died is not None:
        last = next((ln.strip() for ln in reversed(died.log_tail.splitlines()) if ln.strip()), "no output")
        raise errors.PackError(
            f"the process importing the dump {died.reason} while loading it: {last[:300]}",
            "the dump's own code crashed; `reproarchive --debug pack ...` keeps its log",
        )
    return report


def _dump_root(script: Path) -> Path:
    """The folder that belongs to this dump: ``run_*`` for a launcher, else the script's folder."""
    parts = script.parents
    if script.parent.name == "minifier" and len(parts) > 1 and parts[1].name.startswith("run_"):
        return parts[1]
    return script.parent
