"""``inspect``: what an archive holds, read from its index alone (no blob is decompressed).

A teammate deciding whether an attachment is worth replaying wants the graph's size and ops,
which inputs are real, how big the data is, and what failed where; all of that is in the
index, so inspect costs two small reads however large the archive is.
"""

from __future__ import annotations

import os
from typing import Any

from reproarchive.format import layout
from reproarchive.codec import graphs as graph_codec
from reproarchive.archive.validation import check_targets, validate_index
from reproarchive.format.reader import ContainerReader
from reproarchive.context.system import nested_get


def _input_rows(index: dict) -> list[dict]:
    storages = index["storages"]
    rows = []
    for i, rec in enumerate(index["inputs"]):
        row: dict[str, Any] = {"index": i, "name": rec.get("name"), "kind": rec["kind"]}
        if rec["kind"] == "tensor":
            st = storages[rec["storage"]]
            row.update(
                shape=rec["shape"], dtype=rec["dtype"], stride=rec["stride"], device=st["device"],
                fidelity=st["fidelity"] if st["fill"] is None else "real (zeros)",
                requires_grad=rec["requires_grad"], dynamic=[d for d, _ in rec.get("dynamic", [])],
                storage=rec["storage"],
            )
        elif rec["kind"] in ("symint", "symfloat", "symbool"):
            row.update(value=rec["hint"], expr=rec["expr"], fidelity="value")
        elif rec["kind"] in ("tuple", "list"):
            row.update(items=len(rec["items"]), fidelity="value")
        else:
            row.update(value=rec.get("value"), fidelity="value")
        rows.append(row)
    return rows


def _storage_stats(reader: ContainerReader, index: dict) -> dict:
    storages = index["storages"]
    logical = sum(s["size"] for s in storages if s["fidelity"] == "real")
    unique = {}
    for s in storages:
        if s["digest"]:
            unique[s["digest"]] = s["size"]
    stored = sum(unique.values())
    compressed = sum(m.compressed for name, m in reader.members.items() if layout.is_blob_name(name))
    return {
        "storages": len(storages),
        "absent": sum(1 for s in storages if s["fidelity"] == "absent"),
        "zero_filled": sum(1 for s in storages if s["fill"] == 0),
        "blobs": len(unique),
        "bytes_logical": logical,
        "bytes_after_dedup": stored,
        "bytes_compressed": compressed,
        "file_bytes": reader.file_size,
    }


def _system_summary(system: dict) -> dict:
    """The few machine facts that most often explain "fails there, passes here"."""
    cuda = system.get("cuda") if isinstance(system.get("cuda"), dict) else {}
    gpus = cuda.get("devices") or []
    return {
        "torch": nested_get(system, "torch", "version"),
        "torch_git": nested_get(system, "torch", "git_version"),
        "python": nested_get(system, "python", "version"),
        "os": nested_get(system, "os", "platform"),
        "cpu": nested_get(system, "cpu", "model"),
        "cuda": (cuda.get("version") or "available") if cuda.get("available") else f"no ({cuda.get('reason', 'not available')})",
        "gpus": [g.get("name") if isinstance(g, dict) else g for g in gpus] or None,
        "triton": nested_get(system, "packages", "triton"),
    }


def _summaries(index: dict) -> dict:
    system = index.get("system") or {}
    failure = index.get("failure") or {}
    config = index.get("config") or {}
    environment = index.get("environment") or {}
    changed = config.get("changed") or {}
    return {
        "failure": {k: failure.get(k) for k in ("stage", "exception_type", "message", "signature", "backend")} if failure else None,
        "system": _system_summary(system) if system else None,
        "config_changed": changed or None,
        "config_unrepresentable": config.get("unrepresentable") or None,
        "environment": (environment.get("variables") if isinstance(environment.get("variables"), dict) else environment) or None,
    }


def inspect(path: str | os.PathLike, *, limits: layout.Limits = layout.DEFAULT_LIMITS) -> dict:
    """A JSON-ready summary of an archive (the CLI prints it as text or with --json).

    It refuses what load would refuse from the index alone (including call targets outside
    the allowlist), so "inspect shows it" never means "load would run something unsafe"."""
    with ContainerReader(path, limits=limits) as reader:
        index = validate_index(reader)
        check_targets(index["graph"])
        graph = index["graph"]
        nodes = graph["nodes"]
        return {
            "path": str(path),
            "format": index["version"],
            "digest": reader.index_digest,
            "digest_algorithm": index["digest_algorithm"],
            "created_by": index.get("created_by"),
            "backend": index.get("backend"),
            "accuracy": index.get("accuracy"),
            "parent": index.get("parent"),
            "source": index.get("source"),
            "minify": index.get("minify"),
            "graph": {
                "nodes": len(nodes),
                "ops": sum(1 for n in nodes if n.get("op") in ("call_function", "call_method", "call_module")),
                "placeholders": sum(1 for n in nodes if n.get("op") == "placeholder"),
                "op_histogram": dict(sorted(graph_codec.count_nodes(graph).items(), key=lambda kv: (-kv[1], kv[0]))),
                "submodules": len(graph.get("module_state", [])),
            },
            "inputs": _input_rows(index),
            "storage": _storage_stats(reader, index),
            **_summaries(index),
            # the full records, for --json readers and tools; the summaries above are for people
            "records": {key: index.get(key) for key in ("failure", "config", "environment", "system")},
        }
