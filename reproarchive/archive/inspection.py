"""``inspect``: what an archive holds, read from its index alone (no blob is decompressed).

A teammate deciding whether an attachment is worth replaying wants the graph's size and ops,
which inputs are real, how big the data is, and what failed where; all of that is in the
index, so inspect costs two small reads however large the archive is. The result is plain
data (the CLI prints it as text or JSON); the full records are included under ``records``.
"""

from __future__ import annotations

import math
import os
from typing import Any

from reproarchive.format import layout
from reproarchive.format.plain import to_plain
from reproarchive.format.reader import ContainerReader
from reproarchive.format.schema import DTYPES, Index, SequenceValue, SymValue, SystemRecord, TensorValue


def input_rows(index: Index) -> list[dict]:
    """One row per graph input: what ``inspect`` lists and ``view`` tabulates."""
    rows = []
    derived = index.not_original_inputs()
    placeholders = index.graph.placeholders()  # one per input, in order (spec: checked at decode)
    for i, rec in enumerate(index.inputs):
        # a tensor records its placeholder's name; a SymInt, a scalar or a list has only the placeholder
        name = getattr(rec, "name", None) or (placeholders[i].name if i < len(placeholders) else None)
        row: dict[str, Any] = {"index": i, "name": name, "kind": _kind(rec)}
        if isinstance(rec, TensorValue):
            st = index.storages[rec.storage]
            row.update(
                shape=list(rec.shape), dtype=rec.dtype, stride=list(rec.stride), offset=rec.offset, device=st.device,
                bytes=math.prod(rec.shape) * DTYPES[rec.dtype][0],
                fidelity=(st.fidelity if st.fill is None else "real (zeros)") if i not in derived
                else f"not original: {derived[i]}",
                requires_grad=rec.requires_grad, dynamic=[d for d, _ in rec.dynamic], storage=rec.storage,
            )
        elif isinstance(rec, SymValue):
            row.update(value=rec.hint, expr=rec.expr, fidelity="value")
        elif isinstance(rec, SequenceValue):
            row.update(items=len(rec.items), fidelity="value")
        else:
            row.update(value=rec.value, fidelity="value")
        rows.append(row)
    return rows


def _kind(rec) -> str:
    return "tensor" if isinstance(rec, TensorValue) else rec.kind


def _storage_stats(reader: ContainerReader, index: Index) -> dict:
    storages = index.storages
    unique = {s.digest: s.size for s in storages if s.digest}
    compressed = sum(m.compressed for name, m in reader.members.items() if layout.is_blob_name(name))
    return {
        "storages": len(storages),
        "absent": sum(1 for s in storages if s.fidelity == "absent"),
        "zero_filled": sum(1 for s in storages if s.fill == 0),
        "blobs": len(unique),
        "bytes_logical": sum(s.size for s in storages if s.is_real),
        "bytes_after_dedup": sum(unique.values()),
        "bytes_compressed": compressed,
        "file_bytes": reader.file_size,
    }


def system_summary(system: SystemRecord) -> dict:
    """The few machine facts that most often explain "fails there, passes here"."""
    cuda = system.cuda
    if cuda is not None and cuda.available:
        cuda_text = cuda.version or "available"
    else:
        cuda_text = f"no ({(cuda.reason if cuda else None) or 'not available'})"
    return {
        "torch": system.torch.version if system.torch else None,
        "torch_git": system.torch.git_version if system.torch else None,
        "python": system.python.version if system.python else None,
        "os": system.os.platform if system.os else None,
        "cpu": system.cpu.model if system.cpu else None,
        "cuda": cuda_text,
        "gpus": [g.name for g in (cuda.devices or ())] or None if cuda else None,
        "triton": (system.packages or {}).get("triton"),
    }


def _summaries(index: Index) -> dict:
    failure, config, environment = index.records.failure, index.records.config, index.records.environment
    return {
        "failure": ({"stage": failure.stage, "exception_type": failure.exception_type, "message": failure.message,
                     "signature": failure.signature, "backend": failure.backend} if failure else None),
        "system": system_summary(index.records.system) if index.records.system else None,
        "config_changed": (config.changed or None) if config else None,
        "config_unrepresentable": [to_plain(u) for u in config.unrepresentable] or None if config else None,
        "environment": (environment.variables or None) if environment else None,
    }


def inspect(path: str | os.PathLike, *, limits: layout.Limits = layout.DEFAULT_LIMITS) -> dict:
    """A JSON-ready summary of an archive (the CLI prints it as text or with --json).

    It refuses what load would refuse from the index alone (including call targets outside
    the allowlist), so "inspect shows it" never means "load would run something unsafe"."""
    from reproarchive.codec.checks import check_readable_here  # imports torch: only here, not for view

    with ContainerReader(path, limits=limits) as reader:
        index = reader.index
        missing = check_readable_here(index, replaying=False)
        graph = index.graph
        return {
            "path": str(path),
            "format": index.version,
            "digest": reader.index_digest,
            "digest_algorithm": index.digest_algorithm,
            "created_by": to_plain(index.records.created_by) if index.records.created_by else None,
            "backend": index.records.backend,
            "accuracy": index.records.accuracy,
            "parent": index.records.parent,
            "source": to_plain(index.records.source) if index.records.source else None,
            "minify": to_plain(index.records.minify) if index.records.minify else None,
            "graph": {
                "nodes": len(graph.nodes),
                "ops": graph.op_count(),
                "placeholders": len(graph.placeholders()),
                "op_histogram": graph.op_histogram(),
                "submodules": len(graph.module_state),
            },
            "inputs": input_rows(index),
            "not_replayable_here": missing,
            "storage": _storage_stats(reader, index),
            **_summaries(index),
            # the full records, for --json readers and tools; the summaries above are for people
            "records": {key: to_plain(getattr(index.records, key)) if getattr(index.records, key) is not None else None
                        for key in ("failure", "config", "environment", "system")},
        }
