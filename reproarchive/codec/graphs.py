"""FX GraphModules <-> code-free graph records (spec §7).

PyTorch's repro scripts are Python that must be exec'd to get the graph back; torch.export's
serializer only takes ATen-level graphs. We store each FX node as data (op, name, target as a
qualified name, typed args) and rebuild the graph by creating nodes directly, resolving every
target through ``targets``' allowlist. The generated Python code is kept next to it for people
to read; it is never executed.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import torch
import torch.fx as fx

from reproarchive.codec import targets
from reproarchive.errors import IndexSchemaError, PackError
from reproarchive.codec.tensors import StorageTable, dtype_from_name, dtype_name, encode_value, validate_value

OPS = ("placeholder", "get_attr", "call_function", "call_method", "call_module", "output")
MAX_GRAPH_DEPTH = 8

_MEMORY_FORMATS = {
    "contiguous_format": torch.contiguous_format,
    "channels_last": torch.channels_last,
    "channels_last_3d": torch.channels_last_3d,
    "preserve_format": torch.preserve_format,
}
_LAYOUTS = {"strided": torch.strided, "sparse_coo": torch.sparse_coo, "sparse_csr": torch.sparse_csr, "jagged": torch.jagged}

# nn.Module internals that are rebuilt by Module.__init__ or registered separately.
_MODULE_INTERNALS = {
    "training", "_parameters", "_buffers", "_modules", "_non_persistent_buffers_set", "_backward_pre_hooks",
    "_backward_hooks", "_is_full_backward_hook", "_forward_hooks", "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called", "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_state_dict_hooks",
    "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks", "_compiled_call_impl",
}
_FILE_COMMENT = re.compile(r"^\s*# (?:File: .*|No stacktrace found for following nodes)$\n?", re.MULTILINE)


# --------------------------------------------------------------------------------------------
# Encoding


def encode_arg(value: Any) -> Any:
    """An FX argument as msgpack-safe data; every non-primitive is a map tagged with "k"."""
    if isinstance(value, fx.Node):
        return {"k": "node", "v": value.name}
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        if not -(1 << 63) <= value < (1 << 63):
            raise PackError(f"graph constant {value} does not fit in 64 bits")
        return value
    if isinstance(value, float):
        return value
    if isinstance(value, complex):
        return {"k": "complex", "v": [value.real, value.imag]}
    if isinstance(value, torch.dtype):
        return {"k": "dtype", "v": dtype_name(value)}
    if isinstance(value, torch.device):
        return {"k": "device", "v": str(value)}
    if isinstance(value, torch.memory_format):
        return {"k": "memory_format", "v": str(value).removeprefix("torch.")}
    if isinstance(value, torch.layout):
        return {"k": "layout", "v": str(value).removeprefix("torch.")}
    if isinstance(value, slice):
        return {"k": "slice", "v": [encode_arg(value.start), encode_arg(value.stop), encode_arg(value.step)]}
    if value is Ellipsis:
        return {"k": "ellipsis"}
    if isinstance(value, list):  # includes fx immutable_list
        return [encode_arg(v) for v in value]
    if isinstance(value, tuple):  # includes torch.Size
        return {"k": "tuple", "v": [encode_arg(v) for v in value]}
    if isinstance(value, dict):
        return {"k": "dict", "v": [[encode_arg(k), encode_arg(v)] for k, v in value.items()]}
    raise PackError(
        f"graph argument of type {type(value).__module__}.{type(value).__qualname__} cannot be stored",
        "report this graph; only tensors-free constants (numbers, dtypes, devices, slices ...) can be graph arguments",
    )


def _summary(value: Any) -> Any:
    """Shape/dtype/device of a node's example value, for humans and for dynamic dims."""
    if isinstance(value, torch.Tensor):
        return {
            "shape": [s if isinstance(s, int) else str(s) for s in value.shape],
            "dtype": dtype_name(value.dtype),
            "device": str(value.device),
        }
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return {"sym": str(value)}
    if isinstance(value, (tuple, list)):
        return [_summary(v) for v in value]
    if isinstance(value, (int, float, bool)) or value is None:
        return {"value": value}
    return None


def node_value(node: fx.Node) -> Any:
    for key in ("val", "example_value"):
        if key in node.meta:
            return node.meta[key]
    tm = node.meta.get("tensor_meta")
    if tm is not None and hasattr(tm, "shape"):
        return torch.empty(0).new_empty_strided(tuple(tm.shape), tuple(tm.stride), dtype=tm.dtype, device="meta")
    return None


def dynamic_dims(node: fx.Node) -> list[tuple[int, str]]:
    value = node_value(node)
    if not isinstance(value, torch.Tensor):
        return []
    # A dimension Dynamo first made symbolic and later specialised prints as a plain number.
    return [(i, str(s)) for i, s in enumerate(value.shape) if not isinstance(s, int) and not str(s).lstrip("-").isdigit()]


def readable_code(gm: fx.GraphModule) -> str:
    """The graph as annotated Python for people; source-file comments are dropped because
    they carry absolute paths of the packing machine."""
    try:
        code = gm.print_readable(print_output=False, include_stride=True, include_device=True)
    except Exception:  # printing must never block packing
        code = gm.code
    return _FILE_COMMENT.sub("", code)


def encode_graph(gm: fx.GraphModule, table: StorageTable, depth: int = 0) -> dict:
    if depth > MAX_GRAPH_DEPTH:
        raise PackError(f"subgraphs nest deeper than {MAX_GRAPH_DEPTH}")
    nodes = []
    state: dict[str, dict] = {}
    for node in gm.graph.nodes:
        rec: dict[str, Any] = {"op": node.op, "name": node.name}
        if node.op == "call_function":
            rec["target"] = targets.qualified_name(node.target)
        else:
            rec["target"] = str(node.target)
        rec["args"] = encode_arg(tuple(node.args))["v"]
        rec["kwargs"] = {str(k): encode_arg(v) for k, v in node.kwargs.items()}
        summary = _summary(node_value(node))
        if summary is not None:
            rec["meta"] = {"val": summary}
        nodes.append(rec)
        if node.op == "get_attr":
            _encode_attribute(gm, node.target, table, state, depth)
        elif node.op == "call_module":
            _encode_module_tree(gm, node.target, table, state, depth)
    return {"nodes": nodes, "module_state": [state[p] for p in sorted(state)]}


def _encode_attribute(gm, path: str, table, state, depth) -> None:
    if path in state:
        return
    owner_path, _, leaf = path.rpartition(".")
    owner = gm.get_submodule(owner_path) if owner_path else gm
    value = getattr(owner, leaf)
    if isinstance(value, fx.GraphModule):
        state[path] = {"path": path, "kind": "graph", "graph": encode_graph(value, table, depth + 1)}
    elif isinstance(value, torch.nn.Parameter):
        state[path] = {"path": path, "kind": "parameter", "tensor": encode_value(value, table)}
    elif isinstance(value, torch.Tensor):
        kind = "buffer" if leaf in owner._buffers else "constant"
        rec = {"path": path, "kind": kind, "tensor": encode_value(value, table)}
        if kind == "buffer":
            rec["persistent"] = leaf not in owner._non_persistent_buffers_set
        state[path] = rec
    elif isinstance(value, torch.nn.Module):
        _encode_module_tree(gm, path, table, state, depth)
    else:
        raise PackError(f"graph attribute {path} of type {type(value).__name__} cannot be stored")


def _encode_module_tree(gm, path: str, table, state, depth) -> None:
    if path in state:
        return
    module = gm.get_submodule(path)
    if isinstance(module, fx.GraphModule):
        state[path] = {"path": path, "kind": "graph", "graph": encode_graph(module, table, depth + 1)}
        return
    cls = targets.module_class_name(module)
    try:
        targets.resolve_module_class(cls)
    except Exception:
        raise PackError(
            f"submodule {path} is a {cls}, which cannot be stored",
            "only torch.nn modules and GraphModules can be rebuilt without running their code",
        ) from None
    attributes = {}
    for key, value in vars(module).items():
        if key in _MODULE_INTERNALS:
            continue
        try:
            attributes[key] = encode_arg(value)
        except PackError:
            raise PackError(f"attribute {path}.{key} of type {type(value).__name__} cannot be stored") from None
    state[path] = {"path": path, "kind": "module", "class": cls, "training": module.training, "attributes": attributes}
    for name in module._parameters:
        if module._parameters[name] is not None:
            _encode_attribute(gm, f"{path}.{name}", table, state, depth)
    for name in module._buffers:
        if module._buffers[name] is not None:
            _encode_attribute(gm, f"{path}.{name}", table, state, depth)
    for name in module._modules:
        _encode_module_tree(gm, f"{path}.{name}", table, state, depth)


# --------------------------------------------------------------------------------------------
# Validation and decoding


class GraphDecoder:
    """Rebuilds GraphModules from records; ``tensor`` turns a tensor value record into a tensor.
    Device constants come back as recorded (``device_map.remap_graph_devices`` moves them)."""

    def __init__(self, tensor: Callable[[dict], torch.Tensor]):
        self._tensor = tensor

    def decode_arg(self, value: Any, env: dict[str, fx.Node]) -> Any:
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, list):
            return [self.decode_arg(v, env) for v in value]
        if not isinstance(value, dict):
            raise IndexSchemaError(f"graph argument of msgpack type {type(value).__name__} is not allowed")
        kind, v = value.get("k"), value.get("v")
        if kind == "node":
            if not isinstance(v, str) or v not in env:
                raise IndexSchemaError(f"graph argument refers to node {str(v)[:60]!r}, which is not defined before it")
            return env[v]
        if kind == "tuple" and isinstance(v, list):
            return tuple(self.decode_arg(x, env) for x in v)
        if kind == "dict" and isinstance(v, list) and all(isinstance(p, list) and len(p) == 2 for p in v):
            out = {}
            for k, x in v:
                key = self.decode_arg(k, env)
                try:
                    hash(key)
                except TypeError:
                    raise IndexSchemaError(f"graph dict argument has an unhashable key of type {type(key).__name__}") from None
                out[key] = self.decode_arg(x, env)
            return out
        if kind == "slice" and isinstance(v, list) and len(v) == 3:
            return slice(*(self.decode_arg(x, env) for x in v))
        if kind == "dtype":
            return dtype_from_name(v)
        if kind == "device" and isinstance(v, str):
            try:
                return torch.device(v)
            except RuntimeError:
                raise IndexSchemaError(f"invalid device {v[:40]!r} in graph") from None
        if kind == "memory_format" and v in _MEMORY_FORMATS:
            return _MEMORY_FORMATS[v]
        if kind == "layout" and v in _LAYOUTS:
            return _LAYOUTS[v]
        if kind == "ellipsis":
            return Ellipsis
        if kind == "complex" and isinstance(v, list) and len(v) == 2 and all(isinstance(x, (int, float)) for x in v):
            return complex(v[0], v[1])
        raise IndexSchemaError(f"unknown graph argument tag {str(kind)[:40]!r}")

    def decode(self, record: Any, depth: int = 0) -> fx.GraphModule:
        if depth > MAX_GRAPH_DEPTH:
            raise IndexSchemaError(f"subgraphs nest deeper than {MAX_GRAPH_DEPTH}")
        if not isinstance(record, dict) or not isinstance(record.get("nodes"), list):
            raise IndexSchemaError("graph record has no node list")
        root = torch.nn.Module()
        state = record.get("module_state", [])
        if not isinstance(state, list):
            raise IndexSchemaError("module_state must be a list")
        paths = set()
        for entry in sorted(state, key=lambda e: str(e.get("path", "")).count(".") if isinstance(e, dict) else 0):
            path = self._install(root, entry, depth)
            if path in paths:
                raise IndexSchemaError(f"module_state path {path!r} appears twice")
            paths.add(path)
        graph = fx.Graph()
        env: dict[str, fx.Node] = {}
        outputs = 0
        for i, rec in enumerate(record["nodes"]):
            if not isinstance(rec, dict):
                raise IndexSchemaError(f"graph node {i} is not a map")
            op, name, target = rec.get("op"), rec.get("name"), rec.get("target")
            if op not in OPS or not isinstance(name, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
                raise IndexSchemaError(f"graph node {i} has an invalid op or name")
            if name in env:
                raise IndexSchemaError(f"graph node name {name!r} appears twice")
            if not isinstance(rec.get("args", []), list) or not isinstance(rec.get("kwargs", {}), dict):
                raise IndexSchemaError(f"graph node {name!r} has malformed args")
            args = tuple(self.decode_arg(a, env) for a in rec.get("args", []))
            kwargs = {targets.check_kwarg_name(k): self.decode_arg(v, env) for k, v in rec.get("kwargs", {}).items()}
            if op == "call_function":
                fn = targets.resolve_function(target)
                if fn is getattr:
                    targets.check_getattr_args(args)
                target = fn
            elif op == "call_method":
                targets.check_method_name(target)
            elif op in ("get_attr", "call_module"):
                targets.check_attribute_path(target)
                if target not in paths and not _has_path(root, target):
                    raise IndexSchemaError(f"graph node {name!r} refers to attribute {target!r}, which module_state lacks")
            elif op == "output":
                outputs += 1
                target = "output"
            else:
                targets.check_placeholder_target(target)
            env[name] = graph.create_node(op, target, args, kwargs, name=name)
        if outputs != 1:
            raise IndexSchemaError(f"graph has {outputs} output nodes, expected exactly one")
        try:
            graph.lint()
            return fx.GraphModule(root, graph, class_name="Repro")
        except Exception as exc:
            raise IndexSchemaError(f"stored graph is not a valid FX graph: {str(exc)[:200]}") from exc

    def _install(self, root: torch.nn.Module, entry: Any, depth: int) -> str:
        if not isinstance(entry, dict):
            raise IndexSchemaError("module_state entry is not a map")
        path = targets.check_attribute_path(entry.get("path"))
        owner_path, _, leaf = path.rpartition(".")
        owner = _ensure_module(root, owner_path)
        kind = entry.get("kind")
        if kind == "graph":
            value = self.decode(entry.get("graph"), depth + 1)
        elif kind in ("parameter", "buffer", "constant"):
            tensor = self._tensor(entry.get("tensor"))
            if kind == "parameter":
                owner.register_parameter(leaf, torch.nn.Parameter(tensor, requires_grad=tensor.requires_grad))
                return path
            if kind == "buffer":
                owner.register_buffer(leaf, tensor, persistent=bool(entry.get("persistent", True)))
                return path
            value = tensor
        elif kind == "module":
            cls = targets.resolve_module_class(entry.get("class"))
            attributes = entry.get("attributes", {})
            if not isinstance(attributes, dict):
                raise IndexSchemaError(f"module {path!r} attributes must be a map")
            value = cls.__new__(cls)
            torch.nn.Module.__init__(value)
            for key, raw in attributes.items():
                if not isinstance(key, str) or key in _MODULE_INTERNALS or key.startswith("__"):
                    raise IndexSchemaError(f"module {path!r} has a forbidden attribute {str(key)[:40]!r}")
                object.__setattr__(value, key, self.decode_arg(raw, {}))
            value.train(bool(entry.get("training", False)))
            existing = owner._modules.get(leaf)
            if existing is not None:  # children installed before their parent: keep them
                for child_name, child in existing._modules.items():
                    value._modules[child_name] = child
                for pname, p in existing._parameters.items():
                    value._parameters[pname] = p
                for bname, b in existing._buffers.items():
                    value._buffers[bname] = b
        else:
            raise IndexSchemaError(f"module_state entry {path!r} has unknown kind {str(kind)[:20]!r}")
        if isinstance(value, torch.nn.Module):
            owner._modules[leaf] = value
        else:
            setattr(owner, leaf, value)
        return path


def _ensure_module(root: torch.nn.Module, path: str) -> torch.nn.Module:
    module = root
    if not path:
        return module
    for part in path.split("."):
        child = module._modules.get(part)
        if child is None:
            child = torch.nn.Module()
            module._modules[part] = child
        module = child
    return module


def _has_path(root: torch.nn.Module, path: str) -> bool:
    obj: Any = root
    for part in path.split("."):
        if isinstance(obj, torch.nn.Module) and part in obj._modules:
            obj = obj._modules[part]
        elif isinstance(obj, torch.nn.Module) and (part in obj._parameters or part in obj._buffers or part in vars(obj)):
            return True
        else:
            return False
    return True


def validate_graph_tensors(record: dict, storages: list[dict], depth: int = 0) -> None:
    """Check every tensor record inside a graph's module state before anything is built."""
    for entry in record.get("module_state", []) if isinstance(record, dict) else []:
        if isinstance(entry, dict) and entry.get("kind") in ("parameter", "buffer", "constant"):
            tensor = entry.get("tensor")
            validate_value(tensor, storages, f"module_state[{entry.get('path')!r}]")
            if not isinstance(tensor, dict) or tensor.get("kind") != "tensor":
                raise IndexSchemaError(f"module_state entry {entry.get('path')!r} must hold a tensor")
        elif isinstance(entry, dict) and entry.get("kind") == "graph" and depth < MAX_GRAPH_DEPTH:
            validate_graph_tensors(entry.get("graph"), storages, depth + 1)


def count_nodes(record: dict) -> dict[str, int]:
    """Op histogram of a graph record (call targets by qualified name), for inspect."""
    histogram: dict[str, int] = {}
    for rec in record.get("nodes", []):
        op = rec.get("op")
        if op in ("call_function", "call_method", "call_module"):
            key = str(rec.get("target"))
            if op == "call_method":
                key = f"Tensor.{key}"
            histogram[key] = histogram.get(key, 0) + 1
    return histogram
