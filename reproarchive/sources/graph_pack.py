"""``reproarchive.pack``: a GraphModule and its inputs into an archive, as a user calls it.

``archive.packing.pack`` stores exactly the records it is given, which is what re-packing code
(the minifier) needs. A user who packs a graph by hand wants what every capture source records:
the torch config, environment and system of this process, redacted like every capture
(``context.redaction``), and a failure given as the exception itself. Records the caller gives
are stored as given. ``snapshot=False`` records only what is passed. A graph that calls custom
ops is run once on copies of its inputs, to record their real outputs (spec §8 ``custom_ops``),
unless its failure is a crash (the op may be what crashes).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from reproarchive.compat.dispatch import disable_current_modes
from reproarchive.compat.dynamo import in_dynamo_trace
from reproarchive.context.config import config_snapshot
from reproarchive.context.environment import environment_snapshot
from reproarchive.context.execution import execution_snapshot
from reproarchive.context.failure import record_from_exception
from reproarchive.context.redaction import redacted_records, working_folder
from reproarchive.context.system import system_snapshot
from reproarchive.format.schema import Records


def pack(gm: Any, example_inputs: Sequence[Any], path: str | os.PathLike, *,
         records: Records | Mapping[str, Any] | None = None, snapshot: bool = True, failure: Any = None,
         failure_stage: str = "compile", **kwargs: Any) -> Path:
    """Write ``gm`` and one example input per placeholder to ``path`` (atomically).

    The records come as one ``records`` value (a ``Records``, or a mapping of section name ->
    record or plain data), or section by section as keywords (``backend="eager"``,
    ``source={...}``, ``config=...``: any field of ``Records``), which win over ``records``.
    ``failure`` may also be an exception, recorded as a failure of ``failure_stage`` (compile,
    forward, backward, accuracy or crash). With ``snapshot`` (the default) the config,
    environment and system not given are this process's. Keywords of
    ``archive.packing.pack`` (``digest``, ``level``, ``frame_size``, ``min_saving``,
    ``progress``) are passed on; any other keyword is user metadata (added to ``records``').
    """
    from reproarchive.archive.packing import as_records
    from reproarchive.archive.packing import pack as pack_records

    base = as_records(records)
    options = {k: kwargs.pop(k) for k in list(kwargs) if k in inspect.signature(pack_records).parameters}
    sections = {k: kwargs.pop(k) for k in list(kwargs) if k in {f.name for f in dataclasses.fields(Records)}}
    if kwargs:  # user metadata, added to what ``records`` holds
        sections["metadata"] = {**(base.metadata or {}), **(sections.get("metadata") or {}), **kwargs}
    taken: dict[str, Any] = {}
    if isinstance(failure, BaseException):
        taken["failure"] = record_from_exception(failure, failure_stage, backend=sections.get("backend"))
    elif failure is not None:
        sections["failure"] = failure
    named = as_records(sections)
    given = dataclasses.replace(base, **{k: getattr(named, k) for k in sections})
    if snapshot:
        for name, take in (("config", config_snapshot), ("environment", environment_snapshot),
                           ("system", system_snapshot)):
            if getattr(given, name) is None:
                taken[name] = take()
        traced = _from_the_trace(gm, list(example_inputs), given, taken.get("config") or given.config,
                                 "rng_states" in options)
        taken.update({k: v for k, v in traced.items() if k != "rng_states"})
        if "rng_states" in traced:
            options["rng_states"] = traced["rng_states"]
    # what this process records of itself is redacted like every capture's; what is given, as given
    given = dataclasses.replace(given, **redacted_records(taken, working_folder()))
    crashed = given.failure is not None and given.failure.stage == "crash"
    if "custom_ops" not in options and not crashed:  # a graph with custom ops runs once: their real outputs
        from reproarchive.codec.recorded_calls import record_calls

        options["custom_ops"] = record_calls(gm, list(example_inputs))
    return pack_records(gm, example_inputs, path, records=given, **options)


def _from_the_trace(gm: Any, inputs: list[Any], given: Records, config: Any, rng_given: bool) -> dict[str, Any]:
    """What a capture backend records and the caller did not give, read as the capture reads it:
    the shape policy from the fake values Dynamo left on ``gm``'s placeholders (none on a graph
    that did not come from Dynamo); and, when ``pack`` is called by a backend while Dynamo
    traces, the execution state (grad mode, autocast: what Dynamo guarded the graph on) and the
    generator states the graph's first call starts from (Dynamo draws nothing while it traces).
    Outside a trace the calling thread's state says nothing of the graph, so neither is taken."""
    from reproarchive.codec.shapes import policy_of

    out: dict[str, Any] = {}
    if given.shapes is None:
        shapes = policy_of(gm, inputs, config)
        if shapes is not None:
            out["shapes"] = shapes
    if not in_dynamo_trace():
        return out
    from reproarchive.codec.rng import rng_snapshot

    if given.execution is None:
        out["execution"] = execution_snapshot(inputs)
    if not rng_given:
        with disable_current_modes():
            out["rng_states"] = rng_snapshot(inputs)
    return out
