"""What a schema-valid archive still needs from the torch reading it.

The schema checks everything that is a property of the bytes. Whether *this* torch can build
the archive is a separate question with a different answer on every install: does it know
every dtype and device type the records name, and is every call target one it allows.
``verify``, ``inspect`` and ``unpack`` ask it here without building anything; ``load`` asks
the same questions while it builds.
"""

from __future__ import annotations

from reproarchive.codec.collectives import check_groups_joined
from reproarchive.codec.custom_ops import target_name
from reproarchive.codec.devices import check_recorded_device, is_device_name
from reproarchive.codec.targets import check_graph_targets
from reproarchive.codec.tensors import dtype_from_name
from reproarchive.format.schema import ConstantArg, GraphRecord, Index, SubgraphEntry
from reproarchive.format.schema.rules.graph import iter_arg_values
from reproarchive.format.schema.rules.names import DEVICE_RE


def check_readable_here(index: Index, *, replaying: bool = True) -> list[str]:
    """Raise the error ``load`` would raise for a dtype, device type or call target.

    ``replaying=False`` (``verify``, ``inspect``, ``unpack``: they run nothing) returns what this
    process lacks to replay it (``NotReplayableHereError`` messages: a custom op not loaded, a
    newer torch's function) instead of raising; what the rule refuses still raises. A custom op
    the archive records is not lacking: ``load`` stands in for it (``codec.stand_ins``)."""
    for storage in index.storages:
        check_recorded_device(storage.device)
    for tensor in (*index.tensor_records(), *index.job_tensor_records()):
        dtype_from_name(tensor.dtype)
    missing: list | None = None if replaying else []
    for graph in (index.graph, *(index.job.graphs if index.job is not None else ())):
        _check_graph_constants(graph)
        check_graph_targets(graph, missing)
    if replaying:  # collectives run only where their process groups exist (all ranks launched)
        check_groups_joined(index)
    stood_in = _stand_in_targets(index)
    return list(dict.fromkeys(err.what for err in missing or () if getattr(err, "target", None) not in stood_in))


def _stand_in_targets(index: Index) -> set[str]:
    """The graph targets of the custom ops the archive records (``torch.ops.ns.op.overload``, and
    the packet ``torch.ops.ns.op`` a Dynamo graph calls for a ``default`` overload)."""

    targets = set()
    for record in index.custom_ops or ():
        name = target_name(record.name)
        targets.update((name, name.removesuffix(".default")) if name.endswith(".default") else (name,))
    return targets


def _check_graph_constants(graph: GraphRecord) -> None:
    for value in _graph_constants(graph):
        if value.kind == "dtype":
            dtype_from_name(value.name)
        elif value.kind == "device":
            check_recorded_device(value.name)


def _graph_nodes(graph: GraphRecord):
    yield from graph.nodes
    for entry in graph.module_state:
        if isinstance(entry, SubgraphEntry):
            yield from _graph_nodes(entry.graph)


def _graph_constants(graph: GraphRecord):
    for node in _graph_nodes(graph):
        for value in iter_arg_values((node.args, tuple(node.kwargs.values()))):
            if isinstance(value, ConstantArg):
                yield value


def recorded_devices(index: Index) -> list[str]:
    """Every device the archive names, in first-seen order: the storages' devices (not those of
    generator states: host bytes whatever the generator's device), the graph's
    device constants, and the device names a graph passes as text (``device="cuda"``,
    ``x.to("cuda:1")``, ``x.cuda()``), which ``load`` remaps the same way."""
    states = {g.storage for g in index.records.rng.generators} if index.records.rng is not None else set()
    found = [storage.device for i, storage in enumerate(index.storages) if i not in states]
    found += [value.name for value in _graph_constants(index.graph) if value.kind == "device"]
    for node in _graph_nodes(index.graph):
        text = [node.kwargs.get("device")]
        if node.op == "call_method" and node.target == "cuda" and len(node.args) == 1 and not node.kwargs:
            text.append("cuda")
        if node.op == "call_method" and node.target == "to":
            text += node.args
        found += [t for t in text if isinstance(t, str) and DEVICE_RE.match(t) and is_device_name(t)]
    return list(dict.fromkeys(found))
