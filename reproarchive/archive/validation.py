"""The model-level checks of an index (spec §6-§7), shared by every reader.
"""

from __future__ import annotations



from reproarchive.format import digests, layout
from reproarchive.format.reader import ContainerReader
from reproarchive.codec import graphs as graph_codec, tensors as tensor_codec
from reproarchive.errors import (
    CorruptArchiveError,
    IndexSchemaError,
    LimitExceededError,
)


RECORD_SECTIONS = ("config", "environment", "system", "failure", "source", "minify", "metadata")


# --------------------------------------------------------------------------------------------
# validation of the model-level index


def validate_index(reader: ContainerReader) -> dict:
    """Check the records (spec §6–§7) against each other and against the container."""
    index = reader.index
    algorithm = index.get("digest_algorithm")
    if algorithm not in digests.ALGORITHMS:
        raise IndexSchemaError(f"unknown digest algorithm {str(algorithm)[:20]!r}", "upgrade reproarchive")
    storages = index.get("storages")
    inputs = index.get("inputs")
    graph = index.get("graph")
    if not isinstance(storages, list) or not isinstance(inputs, list) or not isinstance(graph, dict):
        raise IndexSchemaError("index lacks its storages, inputs or graph section")
    if len(storages) > reader.limits.max_members or len(inputs) > reader.limits.max_members:
        raise IndexSchemaError("index declares more storages or inputs than the member limit")
    declared = 0
    for i, rec in enumerate(storages):
        tensor_codec.validate_storage(rec, i)
        declared += rec["size"]
        if declared > reader.limits.max_total_bytes:
            raise LimitExceededError(
                f"storages declare more than {reader.limits.max_total_bytes} bytes in total",
                "the archive is hostile or damaged",
            )
        if rec["digest"] is not None:
            name = digests.blob_member_name(rec["digest"])
            member = reader.members.get(name)
            if member is None:
                raise IndexSchemaError(f"storage {i} refers to blob {name}, which the archive does not hold")
            if member.size != rec["size"]:
                raise CorruptArchiveError(f"storage {i} declares {rec['size']} bytes but blob {name} has {member.size}")
    for i, rec in enumerate(inputs):
        tensor_codec.validate_value(rec, storages, f"inputs[{i}]")
    graph_codec.validate_graph_tensors(graph, storages)
    placeholders = sum(1 for n in graph.get("nodes", []) if isinstance(n, dict) and n.get("op") == "placeholder")
    if placeholders != len(inputs):
        raise IndexSchemaError(f"graph has {placeholders} placeholders but the index stores {len(inputs)} inputs")
    for key in RECORD_SECTIONS:
        if index.get(key) is not None and not isinstance(index[key], dict):
            raise IndexSchemaError(f"index section {key!r} must be a map or nil")
    for name in reader.members:
        # Members a newer minor version adds are allowed and ignored; blobs must be named right.
        if name.startswith("blobs/") and not layout.is_blob_name(name):
            raise IndexSchemaError(f"member {name!r} is under blobs/ but is not named <algorithm>/<hex digest>")
    return index


def check_targets(record: dict, depth: int = 0) -> None:
    """Allowlist check of every call target and every name FX would paste into generated code
    (for verify, inspect and unpack: no graph is built). A function name that resolves in this
    process must also resolve to an allowed function; a missing one is left to load."""
    from reproarchive.codec import targets

    if not isinstance(record, dict) or not isinstance(record.get("nodes", []), list):
        raise IndexSchemaError("graph record has no node list")
    for i, node in enumerate(record.get("nodes", [])):
        if not isinstance(node, dict):
            raise IndexSchemaError(f"graph node {i} is not a map")
        op, target = node.get("op"), node.get("target")
        if op == "call_function":
            targets.check_function_target(target)
            args = node.get("args")
            if target == "builtins.getattr" and not (
                isinstance(args, list) and len(args) >= 2 and isinstance(args[1], str) and not args[1].startswith("_")
            ):
                targets.check_getattr_args(())
        elif op == "call_method":
            targets.check_method_name(target)
        elif op in ("get_attr", "call_module"):
            targets.check_attribute_path(target)
        elif op == "placeholder":
            targets.check_placeholder_target(target)
        kwargs = node.get("kwargs", {})
        if not isinstance(kwargs, dict):
            raise IndexSchemaError(f"graph node {i} has malformed kwargs")
        for key in kwargs:
            targets.check_kwarg_name(key)
    state = record.get("module_state", [])
    if not isinstance(state, list):
        raise IndexSchemaError("module_state must be a list")
    for entry in state:
        if isinstance(entry, dict):
            targets.check_attribute_path(entry.get("path"))
            if entry.get("kind") == "module":
                targets.resolve_module_class(entry.get("class"))
            if entry.get("kind") == "graph" and depth < graph_codec.MAX_GRAPH_DEPTH:
                check_targets(entry.get("graph") or {}, depth + 1)
