"""Archives written at a compiler's door by ``capture --``, where PyTorch's own dump cannot hold
the failure: Inductor's door after AOTAutograd (``after_aot_hook``: its dump holds only fake
tensors) and Dynamo's door (``after_dynamo_hook``: a dump PyTorch failed to write, such as a
graph whose subgraphs are modules). Both write the graph the compiler was handed with the
program's real inputs and its own exception, through the writer every capture uses, in a
folder the capturing process names, under a name that says the door and the writing process:
``program_capture`` collects them from there and drops what they supersede.

Nothing here may break the program: a failure to write costs the archive, never the run.
"""

from __future__ import annotations

# Imports inside functions: imported with the crash guard by every Python process `capture
# --` starts; what recording a failure needs is imported when a graph fails.
import itertools
import logging
import os
from pathlib import Path
from typing import Any

#: ``capture --after aot``: where Inductor's door writes, named with ``AOT_PREFIX``.
AOT_DIR_ENV = "REPROARCHIVE_AOT_DIR"
AOT_PREFIX = "aot-"
#: ``capture --after dynamo``: where a failure PyTorch's dump failed to write is archived
#: instead, named with ``DYNAMO_PREFIX``.
DYNAMO_DOOR_DIR_ENV = "REPROARCHIVE_DOOR_DIR"  # no DYNAMO in the name: never recorded
DYNAMO_PREFIX = "dynamo-"
DOOR_PREFIXES = (AOT_PREFIX, DYNAMO_PREFIX)
#: Set on a program's exception that a door archived with its real inputs: nothing else keeps it.
ARCHIVED_ATTR = "reproarchive_archived_at_door"

log = logging.getLogger("reproarchive.capture")
_counter = itertools.count(1)


def write_at_door(gm: Any, inputs: list[Any], exc: BaseException, compiler_name: str, *, folder: Path, prefix: str,
                  door: dict[str, Any], capture_settings: dict[str, Any], stage: str,
                  rng_states: dict | None = None) -> Path | None:
    """The failure ``exc`` of ``gm`` on ``inputs`` at ``stage``, archived in ``folder`` under a name
    that says the door (``prefix``) and the writing process, with the program's own exception
    as the failure; None (and a warning) where it cannot be written: never in place of the
    program's own failure. ``rng_states``: the generator states the failing call started from,
    where it read them (None: read now, which is right only before anything drew)."""
    try:
        from reproarchive.context.config import config_snapshot
        from reproarchive.context.failure import record_from_exception
        from reproarchive.sources.capture.capture_backend import write_archive

        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{prefix}{os.getpid()}-{next(_counter)}.tar.zst"
        write_archive(gm, inputs, path, config=config_snapshot(),
                      failure=record_from_exception(exc, stage, backend=compiler_name),
                      backend=compiler_name, accuracy=False, capture_settings=capture_settings,
                      door={**door, "replay": {"performed": False, "failure_from": "program"}},
                      rng_states=rng_states)
    except Exception as err:  # noqa: BLE001 - never in place of the program's own failure
        log.warning("reproarchive capture: could not archive the graph %s failed on: %s: %s", compiler_name,
                    type(err).__name__, err)
        return None
    return path


def archives(folder: Path) -> list[Path]:
    """The archives the doors wrote (Inductor's, and Dynamo's where PyTorch's dump failed), oldest
    first."""
    found = [p for p in folder.glob("*.tar.zst") if p.is_file() and p.name.startswith(DOOR_PREFIXES)]
    return sorted(found, key=lambda p: (p.stat().st_mtime, p.name))


def writer_pid(archive: Path) -> int | None:
    """The process that wrote ``archive`` (its name says it)."""
    try:
        return int(archive.name.split("-")[1])
    except (IndexError, ValueError):
        return None
