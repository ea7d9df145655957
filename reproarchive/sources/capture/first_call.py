"""A guarded graph's first call and the spool entry a crash in it would leave (``capture --``).

It lives apart from ``crash_guard`` (the door every torch.compile backend goes through) because
that door and PyTorch's after_dynamo hook as the guard runs it (``after_dynamo_hook``) both
work on the same entry: the door spools it and discards it after the first call, the hook sets
it aside and restores it around a compiled backward. Both import it from here, so neither
imports the other. Like ``crash_guard`` it loads in every process before torch: the spool is
imported when it is first used.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

CRASH_DIR_ENV = "REPROARCHIVE_CRASH_DIR"


@dataclasses.dataclass
class FirstCall:
    """What the crash guard's wrapper of a compiled graph (``crash_guard._discard_after_first_call``)
    and PyTorch's hook inside it (``after_dynamo_hook``) share about the graph's first call: the
    spool entry a crash in it would leave (``pending``); whether that entry is finished before
    the call (``finished_first(args)``: a backward the backend compiled follows, compiled in the
    program's own ``backward()``, through which a forked writer would live); whether the hook
    took the entry over for that backward (``watched``: it goes when the backward ends); and
    ``keep(exc, stage)``, which the crash guard sets to complete the entry into the archive of
    the call's failure, or its backward's (its inputs and generator states from before the call;
    ``stage`` None: the exception's)."""

    pending: str | None
    finished_first: Callable[[list[Any]], bool] = lambda args: False
    watched: bool = False
    keep: Callable[[BaseException, str | None], None] = lambda exc, stage: None


def spool() -> Any:
    """This process's spool (imported here: this module loads in every process before torch)."""
    from reproarchive.sources.capture.process_spool import spool_in

    return spool_in(os.environ[CRASH_DIR_ENV])


def discard(pending: str | None) -> None:
    if pending is not None:
        spool().discard(pending)


def set_aside(pending: str | None) -> None:
    if pending is not None:
        spool().set_aside(pending)


def restore(pending: str | None) -> None:
    if pending is not None:
        spool().restore(pending)
