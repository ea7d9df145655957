"""``reproarchive.pack``: a GraphModule and its inputs into an archive, as a user calls it.

The format layer's ``archive.packing.pack`` stores exactly the records it is given, which is
what re-packing code (the minifier, the importers) needs. A user who packs a graph by hand
wants what every capture path records: the torch config, environment and system of this
process, redacted like every capture (``context.redaction``), and a failure given as the
exception itself. ``snapshot=False`` records only what is passed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from reproarchive.context.redaction import redacted_records


def pack(gm: Any, example_inputs: Sequence[Any], path: str | os.PathLike, *, snapshot: bool = True,
         failure: Any = None, failure_stage: str = "compile", **kwargs: Any) -> Path:
    """Write ``gm`` and one example input per placeholder to ``path`` (atomically).

    ``failure``: a ``FailureRecord``, a mapping of one, or an exception (recorded as a failure
    of ``failure_stage``: compile, forward, backward, accuracy or crash). With ``snapshot``
    (the default) the config, environment and system records not given are this process's.
    Every other keyword is ``archive.packing.pack``'s (``backend``, ``accuracy``, ``source``,
    ``digest``, ``level``, ``progress``, metadata ...).
    """
    from reproarchive.archive.packing import pack as pack_records

    taken: dict[str, Any] = {}
    if isinstance(failure, BaseException):
        from reproarchive.context.failure import record_from_exception

        taken["failure"] = record_from_exception(failure, failure_stage, backend=kwargs.get("backend"))
        failure = None
    if snapshot:
        from reproarchive.context.config import config_snapshot
        from reproarchive.context.environment import environment_snapshot
        from reproarchive.context.system import system_snapshot

        for name, take in (("config", config_snapshot), ("environment", environment_snapshot),
                           ("system", system_snapshot)):
            if kwargs.get(name) is None:
                taken[name] = take()
    if taken:
        kwargs.update(redacted_records(taken, {os.getcwd(): "."}))
    if failure is not None:
        kwargs["failure"] = failure
    return pack_records(gm, example_inputs, path, **kwargs)
