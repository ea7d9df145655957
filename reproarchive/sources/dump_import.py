"""``pack_dump``: turn a PyTorch repro dump into one archive, without touching the caller.

PyTorch's dumps are Python scripts that set environment variables and torch config when
imported and read their inputs from an absolute ``save_dir``. Importing one in the caller's
process would change its torch for good, so the work happens in a child process
(``reproarchive.sources.dump_child``) that writes the archive itself; this side only finds the dump,
starts the child with a clean copy of the environment, relays progress and turns the child's
report into a ``PackResult``. The caller's environment, torch config and cwd are never changed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from reproarchive import errors
from reproarchive.sources.dump_script import Discovery, discover
from reproarchive.errors import SourceError
from reproarchive.progress import human_size

DEFAULT_ARCHIVE_NAME = "repro.tar.zst"
# The same filter PyTorch uses when it writes env lines into a dump
# (torch._dynamo.debug_utils.generate_env_vars_string): every such variable of the failing
# process is in the script, so the packing process's own values are removed from the child.
_DUMP_ENV_MARKERS = ("TORCH", "DYNAMO", "INDUCTOR", "TRITON")
_LOG_TAIL_LINES = 40


@dataclass
class PackResult:
    """What ``pack_dump`` did, for printing and for ``--json``."""

    archive: Path
    size: int
    script: Path
    discovery_reason: str
    candidates: list[Path]
    kind: str
    backend: str | None
    accuracy: str
    graph: dict[str, Any]
    inputs: dict[str, Any]
    failure: dict[str, Any]
    missing_storages: list[str] = field(default_factory=list)
    lifted_module_state: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    replay: dict[str, Any] = field(default_factory=dict)

    def summary_lines(self) -> list[str]:
        """The three lines ``reproarchive pack`` prints under the archive's path."""
        g = self.graph
        graph = f"graph:   {g.get('nodes', 0)} nodes, {g.get('compute_nodes', 0)} ops of {g.get('op_kinds', 0)} kinds ({self.kind})"
        i = self.inputs
        inputs = (f"inputs:  {i.get('real', 0)} real / {i.get('absent', 0)} absent"
                  + (f" / {i['values']} values" if i.get("values") else "")
                  + f", {human_size(i.get('real_bytes', 0))} of data")
        f = self.failure
        message = (f.get("message") or "").strip().splitlines()
        first = message[0][:160] if message else ""
        kind = f.get("exception_type") or ""
        failure = f"failure: {f.get('stage')}" + (f" {kind}" if kind else "") + (f": {first}" if first else "")
        return [graph, inputs, failure]

    def to_json(self) -> dict[str, Any]:
        return {
            "archive": str(self.archive),
            "size": self.size,
            "script": str(self.script),
            "discovery": {"reason": self.discovery_reason, "candidates": [str(c) for c in self.candidates]},
            "kind": self.kind,
            "backend": self.backend,
            "accuracy": self.accuracy,
            "graph": self.graph,
            "inputs": self.inputs,
            "failure": self.failure,
            "missing_storages": self.missing_storages,
            "lifted_module_state": self.lifted_module_state,
            "replay": self.replay,
            "warnings": self.warnings,
        }


_MACHINE_TOOLCHAIN = ("TRITON_LIBDEVICE_PATH", "TRITON_PTXAS_PATH", "TRITON_LIBCUDA_PATH")


def _child_env() -> dict[str, str]:
    # PyTorch's own rule: the dump sets the TORCH/DYNAMO/INDUCTOR/TRITON variables it recorded,
    # except the toolchain paths it deliberately never records (they belong to this machine).
    env = {k: v for k, v in os.environ.items()
           if k in _MACHINE_TOOLCHAIN or not any(m in k for m in _DUMP_ENV_MARKERS)}
    # The child must import this very reproarchive, whether installed or run from a checkout.
    package_parent = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([package_parent, *filter(None, [os.environ.get("PYTHONPATH")])])
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
) -> PackResult:
    """Pack the PyTorch repro dump ``source`` (a script, a folder, or None: search ``cwd``).

    ``out`` defaults to ``repro.tar.zst`` in ``cwd``. ``replay=False`` skips the one replay that
    records the failure (the record then says "unknown"). ``progress`` receives one short line
    per stage. ``keep_log`` copies the child's output there (for --debug). Raises SourceError
    (exit 4) when there is no usable dump, PackError when the dump cannot be packed.
    """
    cwd = Path(cwd) if cwd is not None else Path.cwd()
    found: Discovery = discover(source, cwd)
    script = found.chosen
    out_path = Path(out) if out is not None else cwd / DEFAULT_ARCHIVE_NAME
    if not out_path.is_absolute():
        out_path = cwd / out_path
    if out_path.is_dir():
        out_path = out_path / DEFAULT_ARCHIVE_NAME
    if not out_path.parent.is_dir():
        raise SourceError(f"output folder {out_path.parent} does not exist", "create it or choose another -o")
    out_path = out_path.resolve()

    # Prefixes the child scrubs from everything it stores: where the dump lives (a run_* folder
    # or the folder holding repro.py) and where the user ran us from.
    dump_root = _dump_root(script)
    try:
        label = str(script.relative_to(cwd.resolve()))
    except ValueError:
        label = str(script.relative_to(dump_root.parent))

    args = ["--script", str(script), "--script-label", label,
            "--out", str(out_path),
            "--dump-prefix", str(dump_root), "--dump-prefix", str(script.parent),
            "--cwd-prefix", str(cwd.resolve())]
    if not replay:
        args.append("--no-replay")
    report = run_child("reproarchive.sources.dump_child", args, progress=progress, keep_log=keep_log,
                       what="the process importing the dump")
    raise_child_error(report, "packing the dump failed")
    archive = Path(report["archive"])
    return PackResult(
        archive=archive,
        size=archive.stat().st_size,
        script=script,
        discovery_reason=found.reason,
        candidates=found.candidates,
        kind=report["kind"],
        backend=report.get("backend"),
        accuracy=report.get("accuracy", ""),
        graph=report.get("graph", {}),
        inputs=report.get("inputs", {}),
        failure=report.get("failure", {}),
        missing_storages=report.get("missing_storages", []),
        lifted_module_state=report.get("lifted_module_state", []),
        warnings=report.get("warnings", []),
        replay=report.get("replay", {}),
    )


def run_child(module: str, args: list[str], *, progress: Callable[[str], None] | None,
              keep_log: str | os.PathLike | None, what: str) -> dict[str, Any]:
    """Run ``python -m module args --result FILE`` in a scratch cwd with ``_child_env()``; relay
    its progress events; return its JSON report (``{"error": ...}`` when it failed cleanly).

    Raises PackError when the child died without a report (a crash in the user's own code).
    ``keep_log`` copies the child's stderr there (for --debug).
    """
    from reproarchive.sources.dump_child import EVENT_PREFIX

    work = Path(tempfile.mkdtemp(prefix="reproarchive-child-"))
    try:
        result_file = work / "result.json"
        log_file = work / "child.log"
        child_cwd = work / "cwd"
        child_cwd.mkdir()
        cmd = [sys.executable, "-m", module, *args, "--result", str(result_file)]
        with open(log_file, "wb") as log:
            proc = subprocess.Popen(cmd, cwd=child_cwd, env=_child_env(), stdout=subprocess.PIPE,
                                    stderr=log, stdin=subprocess.DEVNULL, text=True)
            try:
                assert proc.stdout is not None
                for line in proc.stdout:
                    if line.startswith(EVENT_PREFIX) and progress is not None:
                        progress(line[len(EVENT_PREFIX):].strip())
                code = proc.wait()
            except BaseException:
                proc.kill()
                proc.wait()
                raise
        if keep_log is not None:
            with open(keep_log, "ab") as dst, open(log_file, "rb") as src:
                shutil.copyfileobj(src, dst)
        return _read_report(result_file, log_file, code, what)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def raise_child_error(report: dict[str, Any], default_what: str) -> None:
    """Re-raise the error a child reported, as the same ReproArchiveError class."""
    if "error" not in report:
        return
    err = report["error"]
    name = err.get("class", "PackError")
    cls = getattr(errors, name, errors.PackError)
    if not (isinstance(cls, type) and issubclass(cls, errors.ReproArchiveError)):
        cls = errors.PackError
    raise cls(err.get("what", default_what), err.get("hint"))


def _dump_root(script: Path) -> Path:
    """The folder that belongs to this dump: ``run_*`` for a launcher, else the script's folder."""
    parts = script.parents
    if script.parent.name == "minifier" and len(parts) > 1 and parts[1].name.startswith("run_"):
        return parts[1]
    return script.parent


def _read_report(result_file: Path, log_file: Path, code: int, what: str) -> dict[str, Any]:
    if result_file.is_file():
        try:
            return json.loads(result_file.read_text())
        except ValueError:
            pass
    tail = log_file.read_text(errors="replace").strip().splitlines()[-_LOG_TAIL_LINES:] if log_file.is_file() else []
    last = next((ln.strip() for ln in reversed(tail) if ln.strip()), "no output")
    signal_note = f" (killed by signal {-code})" if code < 0 else f" (exit {code})"
    raise errors.PackError(
        f"{what} died{signal_note}: {last[:300]}",
        "its own code crashed while loading; rerun with --debug to keep its log",
    )
