"""``PackReport``: what every capture source says about one archive it wrote.

A dump (``pack``), a TORCH_TRACE compile (``pack LOG``), a graph ``capture --`` caught in
process and a graph a program crashed in are all reported the same way: where the archive is,
what graph and inputs it holds, the failure it records and how the one replay that recorded it
went. The fields only one source knows (a dump's discovery, a trace compile's id and frame) are
None elsewhere. A child process that packed the archive sends its report as plain data
(``to_plain``) and the parent reads it back typed (``from_plain``), adding what only it knows.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reproarchive.context.redaction import redacted
from reproarchive.format.plain import PlainData, decoder_for
from reproarchive.format.reader import ContainerReader
from reproarchive.format.schema import Records, TensorValue


@dataclass(frozen=True)
class PackReport:
    """One archive a capture source wrote; ``to_json`` is what ``--json`` prints for it."""

    archive: Path
    size: int
    kind: str  # after_dynamo, after_aot, capture, capture (crash), or the graph a trace held
    backend: str | None = None
    accuracy: str = ""
    graph: dict[str, PlainData] = field(default_factory=dict)  # nodes, compute_nodes, op_kinds
    inputs: dict[str, PlainData] = field(default_factory=dict)  # total, real, absent, values, real_bytes
    failure: dict[str, PlainData] | None = None  # stage, exception_type, message, signature
    replay: dict[str, PlainData] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    missing_storages: tuple[str, ...] = ()
    lifted_module_state: tuple[str, ...] = ()
    # a dump: the script packed, and why it was the one chosen
    script: Path | None = None
    discovery_reason: str | None = None
    candidates: tuple[Path, ...] = ()
    # a trace compile
    compile_id: str | None = None
    rank: int | None = None
    frame: dict[str, PlainData] | None = None
    graph_from: str | None = None

    @property
    def label(self) -> str:
        return f"[{self.compile_id}]" + ("" if self.rank is None else f" rank {self.rank}")

    def to_plain(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_plain(cls, raw: dict[str, Any]) -> PackReport:
        hints = typing.get_type_hints(cls)
        return cls(**{name: _typed(hints[name], value) for name, value in raw.items() if name in hints})

    def to_json(self) -> dict[str, Any]:
        out = {k: _plain(getattr(self, k)) for k in (
            "archive", "size", "kind", "backend", "accuracy", "graph", "inputs", "failure", "missing_storages",
            "lifted_module_state", "replay", "warnings")}
        if self.script is not None:
            out["script"] = str(self.script)
            out["discovery"] = {"reason": self.discovery_reason, "candidates": [str(c) for c in self.candidates]}
        if self.compile_id is not None:
            out.update(compile_id=self.compile_id, rank=self.rank, frame=self.frame, graph_from=self.graph_from)
        return out


def archive_report(archive: Path, *, kind: str, replay: dict[str, Any] | None = None) -> PackReport:
    """The report of an archive this source did not pack from a dump (the in-process capture
    backend's, or a crashed graph's), read back from its index."""

    with ContainerReader(archive) as reader:
        index = reader.index
    fidelity = [index.storages[v.storage].fidelity if isinstance(v, TensorValue) else "value" for v in index.inputs]
    records = index.records
    return PackReport(
        archive=archive, size=archive.stat().st_size, kind=kind, backend=records.backend,
        accuracy="accuracy" if records.accuracy else "",
        graph={"nodes": len(index.graph.nodes), "compute_nodes": index.graph.op_count(),
               "op_kinds": len(index.graph.op_histogram())},
        inputs={"total": len(fidelity), "real": fidelity.count("real"), "absent": fidelity.count("absent"),
                "values": fidelity.count("value"), "real_bytes": sum(s.size for s in index.storages if s.is_real)},
        failure=failure_summary(records.failure), replay=replay or {})


def failure_summary(failure: Any, prefixes: dict[str, str] | None = None) -> dict[str, Any] | None:
    """A failure record as reports print it (a summary of the record, not the record); with
    ``prefixes``, redacted as ``write_capture`` stores it."""
    if failure is None:
        return None
    if prefixes is not None:
        failure = redacted(Records(failure=failure), prefixes).failure
    return {k: getattr(failure, k) for k in ("stage", "exception_type", "message", "signature")}


def _plain(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _typed(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    if tp in (Path, Path | None):
        return Path(value)
    if tp == tuple[Path, ...]:
        return tuple(Path(v) for v in value)
    return decoder_for(tp)(value)
