"""The calls of a program's custom ops, recorded for PyTorch's dump of a failing graph (``capture --``).

PyTorch's dump names a graph's custom ops but cannot define them: they live in the program,
often in its own script, which no pack can import. So where a graph that calls custom ops fails
(its compile, or any later call), the crash guard records the ops' real outputs on the failing
call's inputs in an archive of its own (``CUSTOM_OPS_DIR``), and ``pack_dump`` installs the ops
from there (as stand-ins, or the user's ``--import``) and keeps those calls.
"""

from __future__ import annotations

# Imports inside functions: the crash guard imports this module in every Python process
# `capture --` starts; what recording the calls needs is imported when a graph fails.
import itertools
import logging
import os
from pathlib import Path
from typing import Any

from reproarchive.sources.capture.first_call import CRASH_DIR_ENV

log = logging.getLogger("reproarchive.capture")

CUSTOM_OPS_DIR = "custom_ops"  # beside the crash folder: a failing graph's custom-op calls
_counter = itertools.count(1)  # custom-op records of this process, in order


def op_graph(gm: Any) -> Any:
    """A structural copy of ``gm`` when it calls custom ops (backends may rewrite it in place)."""
    try:
        from reproarchive.codec.custom_ops import custom_ops_of
        from reproarchive.sources.capture.capture_backend import copy_graph_structure

        return copy_graph_structure(gm) if custom_ops_of(gm) else None
    except Exception:  # noqa: BLE001 - never in place of the program's own run
        return None


def write_op_calls(gm: Any, inputs: list[Any], exc: Exception, backend: str, stage: str = "compile") -> None:
    """For a graph that calls custom ops and failed: an archive whose ``custom_ops`` record
    holds their real outputs (``CUSTOM_OPS_DIR``). PyTorch's dump of this failure names the ops
    but cannot define them, so ``pack_dump`` installs them from here (as stand-ins, or the
    user's ``--import``) and keeps these recorded calls. A record where an op has no call (it
    failed itself on these inputs) is not kept: a stand-in without a call would replay nothing,
    and the dump's own replay says what to bring instead."""
    try:
        from reproarchive.context.config import config_snapshot
        from reproarchive.context.failure import record_from_exception
        from reproarchive.format.reader import ContainerReader
        from reproarchive.sources.capture.capture_backend import write_archive

        folder = Path(os.environ[CRASH_DIR_ENV]).parent / CUSTOM_OPS_DIR
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"{os.getpid()}-{next(_counter)}.tar.zst"
        write_archive(gm, inputs, target, config=config_snapshot(),
                      failure=record_from_exception(exc, stage, backend=backend), backend=backend,
                      accuracy=False, capture_settings={"check_runtime": True})
        with ContainerReader(target) as reader:
            uncalled = not all(op.calls for op in reader.index.custom_ops)
        if uncalled:
            target.unlink()
    except Exception as err:  # noqa: BLE001 - never in place of the program's own run
        log.warning("reproarchive capture: could not record the custom ops of a failing graph: %s: %s",
                    type(err).__name__, err)


def op_call_archives(dump_dir: Path, pid: int) -> list[Path]:
    """The custom-op records process ``pid`` left (``write_op_calls``), oldest first."""
    folder = dump_dir / CUSTOM_OPS_DIR
    return sorted(folder.glob(f"{pid}-*.tar.zst"), key=lambda p: int(p.name.split("-")[1].split(".")[0]))


def later_call(compiled: Any, args: tuple, kwargs: dict, graph: Any, backend: str) -> Any:
    """A later call of ``graph`` (one that calls custom ops, as Dynamo handed it): where it
    fails, PyTorch's dump of the call names the ops but cannot define them (they live in the
    program), so their calls on the call's inputs are recorded as a failing compile's are
    (``write_op_calls``), and the dump packs with them (stand-ins, or the user's ``--import``)."""

    from reproarchive.sources.capture.call_guard import is_control_flow

    try:
        return compiled(*args, **kwargs)
    except Exception as exc:
        if not is_control_flow(exc):
            write_op_calls(graph, list(args), exc, backend, stage="forward")
        raise
