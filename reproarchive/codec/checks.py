"""What a schema-valid archive still needs from the torch reading it.

The schema checks everything that is a property of the bytes. Whether *this* torch can build
the archive is a separate question with a different answer on every install: does it know
every dtype and device type the records name, and is every call target one it allows.
``verify``, ``inspect`` and ``unpack`` ask it here without building anything; ``load`` asks
the same questions while it builds.
"""

from __future__ import annotations

from reproarchive.codec.devices import check_recorded_device
from reproarchive.codec.targets import check_graph_targets
from reproarchive.codec.tensors import dtype_from_name
from reproarchive.format.index_rules import iter_arg_values
from reproarchive.format.schema import ConstantArg, GraphRecord, Index, SubgraphEntry


def check_readable_here(index: Index) -> None:
    """Raise the error ``load`` would raise for a dtype, device type or call target."""
    for storage in index.storages:
        check_recorded_device(storage.device)
    for tensor in index.tensor_records():
        dtype_from_name(tensor.dtype)
    _check_graph_constants(index.graph)
    check_graph_targets(index.graph)


def _check_graph_constants(graph: GraphRecord) -> None:
    for node in graph.nodes:
        for value in iter_arg_values((node.args, tuple(node.kwargs.values()))):
            if isinstance(value, ConstantArg) and value.kind == "dtype":
                dtype_from_name(value.name)
            elif isinstance(value, ConstantArg) and value.kind == "device":
                check_recorded_device(value.name)
    for entry in graph.module_state:
        if isinstance(entry, SubgraphEntry):
            _check_graph_constants(entry.graph)
