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
from reproarchive.codec.devices import check_recorded_device
from reproarchive.codec.stacks import NO_STACK_COMMENT, SOURCE_FRAME, StackTable, file_as_kept, format_stack
from reproarchive.codec.tensors import StorageTable, dtype_from_name, dtype_name, encode_value
from reproarchive.compat import fx_meta
from reproarchive.compat.dispatch import OpOverload
from reproarchive.errors import IndexSchemaError, NotReplayableHereError, PackError, Rule
from reproarchive.format.schema import (
    COMPUTE_OPS,
    MAX_GRAPH_DEPTH,
    ComplexArg,
    ConstantArg,
    DictArg,
    EllipsisArg,
    GraphRecord,
    ModuleEntry,
    NodeRecord,
    NodeRef,
    SliceArg,
    SubgraphEntry,
    TensorEntry,
    TensorValue,
    TupleArg,
)
from reproarchive.format.schema.rules.triton import LAUNCH_TARGETS

_MEMORY_FORMATS = {
    "contiguous_format": torch.contiguous_format,
    "channels_last": torch.channels_last,
    "channels_last_3d": torch.channels_last_3d,
    "preserve_format": torch.preserve_format,
}
_LAYOUTS = {"strided": torch.strided, "sparse_coo": torch.sparse_coo, "sparse_csr": torch.sparse_csr,
            "jagged": torch.jagged}

# nn.Module internals that are rebuilt by Module.__init__ or registered separately.
_MODULE_INTERNALS = {
    "training", "_parameters", "_buffers", "_modules", "_non_persistent_buffers_set", "_backward_pre_hooks",
    "_backward_hooks", "_is_full_backward_hook", "_forward_hooks", "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called", "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_state_dict_hooks",
    "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks", "_compiled_call_impl",
}
_FILE_COMMENT = re.compile(rf"^(?P<indent>[ \t]*)# File: (?:{SOURCE_FRAME}|.*)$\n?", re.MULTILINE)
_NO_STACK_COMMENT = re.compile(rf"^\s*{NO_STACK_COMMENT}$\n?", re.MULTILINE)


def _constant(arg: ConstantArg) -> Any:
    if arg.kind == "operator":
        return targets.resolve_operator_value(arg.name)
    if arg.kind == "dtype":
        return dtype_from_name(arg.name)
    if arg.kind == "device":
        check_recorded_device(arg.name)
        return torch.device(arg.name)
    return (_MEMORY_FORMATS if arg.kind == "memory_format" else _LAYOUTS)[arg.name]


def op_count(gm: fx.GraphModule) -> int:
    """Nodes that compute (the same count ``GraphRecord.op_count`` gives for a stored graph)."""
    return sum(1 for n in gm.graph.nodes if n.op in COMPUTE_OPS)


# --------------------------------------------------------------------------------------------
# Encoding


def encode_arg(value: Any) -> Any:
    """An FX argument as a record: plain scalars and lists stay, everything else is tagged."""
    if isinstance(value, fx.Node):
        return NodeRef(value.name)
    if value is None or isinstance(value, (bool, str, int, float)):
        return value
    if isinstance(value, complex):
        return ComplexArg(value.real, value.imag)
    if isinstance(value, torch.dtype):
        return ConstantArg("dtype", dtype_name(value))
    if isinstance(value, torch.device):
        return ConstantArg("device", str(value))
    if isinstance(value, torch.memory_format):
        return ConstantArg("memory_format", str(value).removeprefix("torch."))
    if isinstance(value, torch.layout):
        return ConstantArg("layout", str(value).removeprefix("torch."))
    if isinstance(value, OpOverload):  # what auto_functionalized and with_effects call
        return ConstantArg("operator", targets.qualified_name(value))
    if isinstance(value, slice):
        return SliceArg(encode_arg(value.start), encode_arg(value.stop), encode_arg(value.step))
    if value is Ellipsis:
        return EllipsisArg()
    if isinstance(value, list):  # includes fx immutable_list
        return [encode_arg(v) for v in value]
    if isinstance(value, tuple):  # includes torch.Size
        return TupleArg(tuple(encode_arg(v) for v in value))
    if isinstance(value, dict):
        return DictArg(tuple((encode_arg(k), encode_arg(v)) for k, v in value.items()))
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
    return fx_meta.value_of(node)


def dynamic_dims(node: fx.Node) -> list[tuple[int, str]]:
    value = node_value(node)
    if not isinstance(value, torch.Tensor):
        return []
    # A dimension Dynamo first made symbolic and later specialised prints as a plain number.
    return [(i, str(s)) for i, s in enumerate(value.shape)
            if not isinstance(s, int) and not str(s).lstrip("-").isdigit()]


_MODULE_ROOT = re.compile(r"""^[A-Za-z_]\w*\[(['"])[^'"]*\1\]""")  # L['self'], G['model']
_MODULE_INDEX = re.compile(r"""\[(['"]?)(\w+)\1\]""")  # [0], ['name']
_MODULE_PATH = re.compile(r"^\w+(\.\w+)*$")


def module_path(stack: Any) -> str | None:
    """The dotted path of the innermost module a node was traced in (``layers.0.attn``), from
    Dynamo's ``nn_module_stack``; what ``view`` groups a graph by. None at the root, or when
    the path is not plain attribute names and indices."""
    if not isinstance(stack, dict) or not stack:
        return None
    last = list(stack.values())[-1]
    path = last[0] if isinstance(last, tuple) and last else last
    if not isinstance(path, str):
        return None
    path = _MODULE_INDEX.sub(lambda m: "." + m.group(2), _MODULE_ROOT.sub("", path.strip()))
    path = path.replace("._modules.", ".").strip(".")
    return path if path and len(path) <= 300 and _MODULE_PATH.match(path) else None


def readable_code(gm: fx.GraphModule, paths: Callable[[str], str] = str) -> str:
    """The graph as annotated Python for people, FX's source comments (``# File: ./model.py:12 in
    forward, code: ...``) naming each op's model line with their file and code passed through
    ``paths``, as the node stacks are (the writer's redaction: a live graph's stacks carry
    absolute paths of this machine; a graph rebuilt from an archive has its redacted ones)."""
    try:
        code = gm.print_readable(print_output=False, include_stride=True, include_device=True)
    except Exception:  # printing must never block packing
        code = gm.code

    def kept(m: re.Match) -> str:
        if m["file"] is None:  # a form this reader does not know: its path cannot be redacted
            return ""
        return (f"{m['indent']}# File: {file_as_kept(m['file'], paths)}:{m['line']} in {m['name']}, "
                f"code: {paths(m['code'])}\n")

    return _FILE_COMMENT.sub(kept, _NO_STACK_COMMENT.sub("", code))


def encode_graph(gm: fx.GraphModule, table: StorageTable, depth: int = 0,
                 paths: Callable[[str], str] = str) -> GraphRecord:
    """``gm`` as a graph record; ``paths`` rewrites the file names and code lines of its nodes'
    stacks (the writer's redaction, ``context.redaction.text_redactor``)."""
    if depth > MAX_GRAPH_DEPTH:
        raise PackError(f"subgraphs nest deeper than {MAX_GRAPH_DEPTH}")
    nodes = []
    state: dict[str, Any] = {}
    stacks = StackTable(paths)
    for node in gm.graph.nodes:
        target = targets.qualified_name(node.target) if node.op == "call_function" else str(node.target)
        summary = _summary(node_value(node))
        meta = {} if summary is None else {"val": summary}
        module = module_path(fx_meta.module_stack_of(node))
        if module:
            meta["module"] = module
        nodes.append(NodeRecord(
            op=node.op, name=node.name, target=target, args=tuple(encode_arg(a) for a in node.args),
            kwargs={str(k): encode_arg(v) for k, v in node.kwargs.items()},
            meta=meta or None, stack=stacks.index_of(fx_meta.stack_trace_of(node)),
        ))
        if node.op == "get_attr":
            _encode_attribute(gm, node.target, table, state, depth, paths)
        elif node.op == "call_module":
            _encode_module_tree(gm, node.target, table, state, depth, paths)
    return GraphRecord(nodes=tuple(nodes), module_state=tuple(state[p] for p in sorted(state)),
                       stacks=tuple(stacks.stacks) or None)


def _encode_attribute(gm, path: str, table, state, depth, paths) -> None:
    if path in state:
        return
    owner_path, _, leaf = path.rpartition(".")
    owner = gm.get_submodule(owner_path) if owner_path else gm
    value = getattr(owner, leaf)
    if isinstance(value, fx.GraphModule):
        state[path] = SubgraphEntry(path, encode_graph(value, table, depth + 1, paths))
    elif isinstance(value, torch.nn.Parameter):
        state[path] = TensorEntry("parameter", path, encode_value(value, table))
    elif isinstance(value, torch.Tensor):
        if leaf in owner._buffers:
            state[path] = TensorEntry("buffer", path, encode_value(value, table),
                                      persistent=leaf not in owner._non_persistent_buffers_set)
        else:
            state[path] = TensorEntry("constant", path, encode_value(value, table))
    elif isinstance(value, torch.nn.Module):
        _encode_module_tree(gm, path, table, state, depth, paths)
    else:
        raise PackError(f"graph attribute {path} of type {type(value).__name__} cannot be stored")


def _encode_module_tree(gm, path: str, table, state, depth, paths) -> None:
    if path in state:
        return
    module = gm.get_submodule(path)
    if isinstance(module, fx.GraphModule):
        state[path] = SubgraphEntry(path, encode_graph(module, table, depth + 1, paths))
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
    state[path] = ModuleEntry(path, class_name=cls, training=module.training, attributes=attributes)
    for name in module._parameters:
        if module._parameters[name] is not None:
            _encode_attribute(gm, f"{path}.{name}", table, state, depth, paths)
    for name in module._buffers:
        if module._buffers[name] is not None:
            _encode_attribute(gm, f"{path}.{name}", table, state, depth, paths)
    for name in module._modules:
        _encode_module_tree(gm, f"{path}.{name}", table, state, depth, paths)


# --------------------------------------------------------------------------------------------
# Decoding


class GraphDecoder:
    """Rebuilds GraphModules from (validated) graph records; ``tensor`` builds a tensor from
    its value record. Every call target and module class is resolved through the allowlist
    here; device constants come back as recorded (``devices.remap_graph_devices`` moves them)."""

    def __init__(self, tensor: Callable[[TensorValue], torch.Tensor], launches: Any = None):
        self._tensor = tensor
        self._launches = launches  # a ``triton_kernels.LaunchBinder``: what a Triton kernel launch runs

    def decode_arg(self, value: Any, env: dict[str, fx.Node]) -> Any:
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, list):
            return [self.decode_arg(v, env) for v in value]
        if isinstance(value, NodeRef):
            return env[value.name]
        if isinstance(value, TupleArg):
            return tuple(self.decode_arg(x, env) for x in value.items)
        if isinstance(value, DictArg):
            out = {}
            for k, x in value.items:
                key = self.decode_arg(k, env)
                try:
                    hash(key)
                except TypeError:
                    raise IndexSchemaError(
                        f"graph dict argument has an unhashable key of type {type(key).__name__}") from None
                out[key] = self.decode_arg(x, env)
            return out
        if isinstance(value, SliceArg):
            return slice(*(self.decode_arg(x, env) for x in (value.start, value.stop, value.step)))
        if isinstance(value, ConstantArg):
            return _constant(value)
        if isinstance(value, EllipsisArg):
            return Ellipsis
        if isinstance(value, ComplexArg):
            return complex(value.real, value.imag)
        raise IndexSchemaError(f"unknown graph argument {type(value).__name__}")

    def decode(self, record: GraphRecord) -> fx.GraphModule:
        root = torch.nn.Module()
        # parents before children: a module entry's own attributes first, then its contents
        for entry in sorted(record.module_state, key=lambda e: e.path.count(".")):
            self._install(root, entry)
        graph = fx.Graph()
        env: dict[str, fx.Node] = {}
        for rec in record.nodes:
            args = tuple(self.decode_arg(a, env) for a in rec.args)
            kwargs = {k: self.decode_arg(v, env) for k, v in rec.kwargs.items()}
            target: Any = rec.target
            if rec.op == "call_function" and rec.target in LAUNCH_TARGETS:
                if self._launches is None:  # never this process's side table at the recorded index
                    raise NotReplayableHereError(
                        f"node {rec.name} launches a Triton kernel, which only `load` of a single-process archive "
                        "binds (to a stand-in or to the user's kernel)", "replay it with `reproarchive run`",
                        rule=Rule.CALL_TARGET)
                target, args, kwargs = self._launches.bind(rec.target, args, kwargs)
            elif rec.op == "call_function":
                target = targets.resolve_function(rec.target)
            elif rec.op == "call_method":
                targets.check_method_name(rec.target)
            env[rec.name] = graph.create_node(rec.op, target, args, kwargs, name=rec.name)
            if rec.stack is not None:  # validated: an index into the graph's stacks (R7.1-9)
                fx_meta.set_stack_trace(env[rec.name], format_stack(record.stacks[rec.stack]))
        try:
            graph.lint()
            return fx.GraphModule(root, graph, class_name="Repro")
        except Exception as exc:
            raise IndexSchemaError(f"stored graph is not a valid FX graph: {str(exc)[:200]}") from exc

    def _install(self, root: torch.nn.Module, entry: Any) -> None:
        owner_path, _, leaf = entry.path.rpartition(".")
        owner = _ensure_module(root, owner_path)
        if isinstance(entry, SubgraphEntry):
            owner._modules[leaf] = self.decode(entry.graph)
        elif isinstance(entry, TensorEntry):
            tensor = self._tensor(entry.tensor)
            if entry.kind == "parameter":
                owner.register_parameter(leaf, torch.nn.Parameter(tensor, requires_grad=tensor.requires_grad))
            elif entry.kind == "buffer":
                owner.register_buffer(leaf, tensor, persistent=entry.persistent is not False)
            else:
                setattr(owner, leaf, tensor)
        else:
            owner._modules[leaf] = self._module(entry, owner._modules.get(leaf))

    def _module(self, entry: ModuleEntry, existing: torch.nn.Module | None) -> torch.nn.Module:
        """A torch.nn module rebuilt without running its constructor (spec §7.4)."""
        cls = targets.resolve_module_class(entry.class_name)
        value = cls.__new__(cls)
        torch.nn.Module.__init__(value)
        for key, raw in entry.attributes.items():
            if key in _MODULE_INTERNALS:
                raise IndexSchemaError(f"module {entry.path!r} has a forbidden attribute {key[:40]!r}")
            object.__setattr__(value, key, self.decode_arg(raw, {}))
        value.train(entry.training)
        if existing is not None:  # children installed before their parent: keep them
            value._modules.update(existing._modules)
            value._parameters.update(existing._parameters)
            value._buffers.update(existing._buffers)
        return value


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
