"""Rebuilding a compile's Dynamo graph from a TORCH_TRACE log (``rebuild_child``'s other half).

The log's ``dynamo_output_graph`` is the graph as ``GraphModule.print_readable`` wrote it: the
text is executed as a class definition (the user's own code, so only ever in ``rebuild_child``'s
throwaway process) and traced. Its inputs are built from the placeholders' annotations
("f32[s77, 6][6, 1]cpu") and Dynamo's ``describe_tensor`` records (requires_grad, parameters,
offsets), with symbols from ``create_symbol``; all of them are absent (a log holds no tensor
data). Constants the graph reads from ``self`` are lifted to inputs, absent as well.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import inspect
import re
from typing import Any

from reproarchive.compat.pytree import graph_code_modules
from reproarchive.context.redaction import redact_paths
from reproarchive.errors import PackError, SourceError
from reproarchive.sources import import_replay, repro_module
from reproarchive.sources.dump.foreign_runnable import Guarded
from reproarchive.sources.printed_stacks import NOT_MATCHED, give_stacks

_ANNOTATION = re.compile(r"^(?P<dtype>[a-z][a-z0-9]*)\[(?P<shape>[^\]]*)\](?:\[(?P<stride>[^\]]*)\])?"
                         r"(?P<device>[a-z]+(?::\d+)?)?$")
_SYM = re.compile(r"^Sym\((?P<expr>.+)\)$")
_ATTR_LINE = re.compile(r"^\s+\w+(?:\s*:\s*\"(?P<ann>[^\"]*)\")?\s*=\s*self\.(?P<attr>\w+)\s*(?:;.*)?$")


@dataclasses.dataclass
class Rebuilt:
    """A compile's graph as this process rebuilt it from the log, with what the archive's
    records say about how: the graph PyTorch had (``kind``), each input as the log described it
    (``input_records``) and counted (``inputs_summary``), module state lifted to inputs, and
    where the environment and data came from."""

    gm: Any
    inputs: list[Any]
    kind: str  # after_dynamo (dynamo_output_graph) or after_aot (fx_graph_runnable)
    input_records: list[dict[str, Any]]
    inputs_summary: dict[str, Any]
    warnings: list[str]
    lifted: list[dict[str, Any]]
    environment: Any = None
    storages: dict[str, Any] | None = None
    content_store: str | None = None
    custom_ops: list = dataclasses.field(default_factory=list)  # ops of the job's libraries, stood in for
    unapplied: list = dataclasses.field(default_factory=list)  # settings this torch does not have


def _eval_dim(expr: Any, hints: dict[str, int]) -> int | None:
    """An int, or a sympy-printed size expression ("s77", "2*s77 + 1") evaluated at the hints."""
    if isinstance(expr, int):
        return expr
    try:
        tree = ast.parse(str(expr).strip(), mode="eval")
    except SyntaxError:
        return None

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and node.id in hints:
            return hints[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.BinOp):
            left, right = ev(node.left), ev(node.right)
            ops = {ast.Add: lambda: left + right, ast.Sub: lambda: left - right, ast.Mult: lambda: left * right,
                   ast.FloorDiv: lambda: left // right, ast.Mod: lambda: left % right}
            if type(node.op) in ops:
                return ops[type(node.op)]()
        raise ValueError(ast.dump(node))

    try:
        value = ev(tree)
    except (ValueError, ZeroDivisionError, TypeError):
        return None
    return value if isinstance(value, int) else None


def _at_hints(code: str, hints: dict[str, int]) -> str:
    """``code`` with each annotation's sizes and strides evaluated at the hints ("f32[s77][1]cpu"
    becomes "f32[4][1]cpu"): the output shapes a stand-in for a custom op the log's graph calls
    gives, as the inputs built from the log have them (a size that does not evaluate stays)."""
    def evaluated(text: str) -> str:
        return ", ".join(str(v) if (v := _eval_dim(d, hints)) is not None else d for d in _dims(text))

    return re.sub(r'"(\w+)\[([^\]]*)\]\[([^\]]*)\]',
                  lambda m: f'"{m.group(1)}[{evaluated(m.group(2))}][{evaluated(m.group(3))}]', code)


def _dims(text: str | None) -> list[str]:
    return [d.strip() for d in text.split(",") if d.strip()] if text else []


def _parse_annotation(ann: Any) -> dict[str, Any] | None:
    if not isinstance(ann, str):
        return None
    ann = ann.strip()
    m = _SYM.match(ann)
    if m:
        return {"kind": "sym", "expr": m["expr"].strip()}
    m = _ANNOTATION.match(ann)
    if not m:
        return None
    return {"kind": "tensor", "dtype": m["dtype"], "shape": _dims(m["shape"]),
            "stride": _dims(m["stride"]) if m["stride"] is not None else None, "device": m["device"]}


def _instantiate(cls):
    """An instance of a printed GraphModule class, with its nested subgraph classes as submodules
    (the class is the log's, made for this one rebuild: its nested classes are taken off it)."""
    import torch

    mod = cls()
    for name, value in list(vars(cls).items()):
        if isinstance(value, type) and issubclass(value, torch.nn.Module):
            delattr(cls, name)  # else ``self.name`` finds the class before the submodule
            setattr(mod, name, _instantiate(value))
    return mod


def _hints(params: dict[str, dict | None], described: dict[str, dict], syms: dict[str, dict]) -> dict[str, int]:
    hints = {name: s["hint"] for name, s in syms.items() if isinstance(s.get("hint"), int)}
    for name, ann in params.items():
        desc = described.get(name)
        if not ann or ann["kind"] != "tensor" or not desc or not isinstance(desc.get("shape"), list):
            continue
        for dim, real in zip(ann["shape"], desc["shape"]):
            if re.fullmatch(r"[A-Za-z_]\w*", dim) and isinstance(real, int):
                hints.setdefault(dim, real)
    return hints


def from_dynamo_graph(job: dict[str, Any], events) -> Rebuilt:
    """The compile's graph rebuilt from the log's ``dynamo_output_graph`` (``job["graph"]``),
    every input absent and described as the log describes it (module docstring)."""
    from torch.fx.graph import dtype_abbrs

    from reproarchive.codec.tensors import AbsentTensor

    code = job["graph"]["code"]
    described: dict[str, dict] = job.get("describe") or {}
    syms: dict[str, dict] = job.get("symbols") or {}
    events("rebuilding the Dynamo graph")
    cls = _graph_class(code)
    mod = _instantiate(cls)
    sig = inspect.signature(cls.forward)
    params = {name: _parse_annotation(p.annotation) for name, p in sig.parameters.items() if name != "self"}
    hints = _hints(params, described, syms)
    abbr_to_dtype = {v: k for k, v in dtype_abbrs.items()}
    origin, const_devices = _constants_as_buffers(code, mod, hints, abbr_to_dtype)
    inputs, records, notes = _inputs(params, described, syms, hints, abbr_to_dtype)
    if "_set_grad_enabled" in code:
        notes.append("the graph switches grad mode inside (torch._C._set_grad_enabled); the rebuilt graph "
                     "keeps no such switch")

    from reproarchive.sources.dump import pack_child  # imports torch at its top

    missing = pack_child.stand_ins_for_missing_ops(code, _at_hints(code, hints), Guarded())
    if missing:
        events(f"standing in for {len(missing)} operator(s) not registered here")
        notes.append(f"the graph calls {', '.join(op.record.name for op in missing)}, not registered here: stood in "
                     "with the schema and output shapes the log gives (pack with --import MODULE or "
                     "--load-library PATH for the real one)")
    events("tracing the graph")
    gm, trace_notes = _traced(mod, len(inputs))
    scrub = job.get("scrub") or {}
    if not give_stacks(gm, [code], paths=lambda text: redact_paths(text, scrub)) and "# File: " in code:
        notes.append(NOT_MATCHED)
    gm, inputs, lifted = repro_module.lift_state(gm, origin, inputs)
    for i, item in enumerate(lifted):
        inputs[i] = dataclasses.replace(inputs[i], device=const_devices.get(item["attribute"], "cpu"))
        item["origin"] = "a constant of the graph; the log holds no value for it"
    if lifted:
        notes.append(f"{len(lifted)} constant(s) of the graph ({', '.join(x['attribute'] for x in lifted)}) are not in "
                     "the log: lifted to inputs marked absent")
    absent = sum(1 for a in inputs if isinstance(a, AbsentTensor))
    summary = {"total": len(inputs), "real": 0, "absent": absent, "values": len(inputs) - absent, "real_bytes": 0}
    notes.insert(0, "the log holds no tensor data: every input is absent (generated at load time)")
    return Rebuilt(gm=gm, inputs=inputs, input_records=records, inputs_summary=summary,
                   warnings=notes + trace_notes, kind="after_dynamo", lifted=lifted, custom_ops=missing)


def _graph_class(code: str):
    """The ``GraphModule`` class the logged text defines, executed with the names
    ``print_readable`` output assumes; a text that does not run, or defines no such class, is a
    SourceError (a payload from a torch version this one cannot read)."""
    import torch


    namespace: dict[str, Any] = {
        "__name__": "__reproarchive_trace_graph__", "__builtins__": builtins, "torch": torch,
        "math": __import__("math"), "operator": __import__("operator"), "inf": float("inf"),
        "nan": float("nan"), "device": torch.device, **graph_code_modules(),
    }
    try:
        exec(compile(code, "<dynamo_output_graph>", "exec", dont_inherit=True), namespace)  # noqa: S102 - the user's own log, in a throwaway process
    except Exception as err:
        raise SourceError(f"the logged Dynamo graph does not run as Python: {type(err).__name__}: "
                          f"{import_replay.first_line(err)}",
                          "the payload may be from an unsupported torch version") from err
    cls = namespace.get("GraphModule")
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise SourceError("the logged Dynamo graph defines no GraphModule class",
                          "the payload may be from an unsupported torch version")
    return cls


def _constants_as_buffers(code: str, mod, hints: dict[str, int], abbr_to_dtype: dict[str, Any]
                          ) -> tuple[dict[str, str], dict[str, str]]:
    """Constants the graph reads from ``self`` are not in the log: each becomes a meta buffer of
    ``mod`` from its annotation, for ``lift_state`` to lift to an input marked absent. Returns
    (attribute -> origin, attribute -> device)."""
    import torch

    origin: dict[str, str] = {}
    const_devices: dict[str, str] = {}
    for line in code.split("class ", 2)[1].splitlines() if "class " in code else []:
        m = _ATTR_LINE.match(line)
        if not m or hasattr(mod, m["attr"]):
            continue
        ann = _parse_annotation(m["ann"])
        if not ann or ann["kind"] != "tensor" or ann["dtype"] not in abbr_to_dtype:
            raise PackError(f"the Dynamo graph reads self.{m['attr']}, which the log does not describe",
                            "graphs with such constants cannot be packed from a log")
        shape = [_eval_dim(d, hints) for d in ann["shape"]]
        if any(s is None for s in shape):
            raise PackError(f"the size of self.{m['attr']} ({ann['shape']}) is unknown")
        mod.register_buffer(m["attr"], torch.empty(shape, dtype=abbr_to_dtype[ann["dtype"]], device="meta"))
        origin[m["attr"]] = "not_logged"
        const_devices[m["attr"]] = ann["device"] or "cpu"
    return origin, const_devices


def _inputs(params: dict[str, dict | None], described: dict[str, dict], syms: dict[str, dict],
            hints: dict[str, int], abbr_to_dtype: dict[str, Any]) -> tuple[list[Any], list[dict[str, Any]], list[str]]:
    """(the graph's inputs, their records, notes): a symbol's hint or an absent tensor for each
    placeholder; the notes say what absent inputs cannot reproduce (views of one storage in the
    job each get their own storage here)."""
    inputs: list[Any] = []
    records: list[dict[str, Any]] = []
    notes: list[str] = []
    shared: dict[Any, list[str]] = {}
    for name, ann in params.items():
        desc = described.get(name) or {}
        if ann is None and not desc:
            raise PackError(f"input {name} of the Dynamo graph has no annotation and no describe_tensor record",
                            "the log is from a torch version whose graphs reproarchive cannot read")
        if ann is not None and ann["kind"] == "sym":
            hint = _eval_dim(ann["expr"], hints)
            if hint is None:
                raise PackError(f"input {name} is the symbol {ann['expr']} and the log holds no value for it",
                                "pack another compile of this frame (e.g. the static one)")
            inputs.append(hint)
            records.append({"placeholder": name, "kind": "symint", "hint": hint, "expr": ann["expr"],
                            "source": (syms.get(ann["expr"]) or {}).get("source")})
            continue
        value, rec = _tensor_input(name, ann, desc, hints, abbr_to_dtype)
        inputs.append(value)
        if desc.get("storage") is not None:
            shared.setdefault(desc["storage"], []).append(name)
        records.append(rec)
    for names in shared.values():
        if len(names) > 1:
            notes.append(f"inputs {', '.join(names)} were views of one storage in the job; here each has its own "
                         "absent storage, so effects of that aliasing are not reproduced")
    return inputs, records, notes


def _tensor_input(name: str, ann: dict | None, desc: dict, hints: dict[str, int], abbr_to_dtype: dict[str, Any]
                  ) -> tuple[Any, dict[str, Any]]:
    """One tensor input, absent, and its record: Dynamo's ``describe_tensor`` record (``desc``)
    where the log has one, else the placeholder's annotation with its sizes evaluated at the
    hints. A dtype or size neither says is a PackError."""
    import torch

    from reproarchive.codec.tensors import AbsentTensor

    dtype_name = desc.get("dtype")
    dtype = getattr(torch, dtype_name, None) if dtype_name else None
    if not isinstance(dtype, torch.dtype):
        dtype = abbr_to_dtype.get((ann or {}).get("dtype"))
    if dtype is None:
        raise PackError(f"the dtype of input {name} is not in the log")
    ann_shape = (ann or {}).get("shape")
    shape = desc.get("shape") if isinstance(desc.get("shape"), list) else \
        [_eval_dim(d, hints) for d in (ann_shape or [])]
    if shape is None or any(not isinstance(s, int) for s in shape):
        raise PackError(f"the size of input {name} ({ann_shape}) cannot be worked out from the log")
    stride = desc.get("stride") if isinstance(desc.get("stride"), list) else None
    if stride is None and ann and ann.get("stride") is not None:
        stride = [_eval_dim(d, hints) for d in ann["stride"]]
        stride = stride if all(isinstance(s, int) for s in stride) else None
    device = desc.get("device") or (ann or {}).get("device") or "cpu"
    offset = desc.get("storage_offset") if isinstance(desc.get("storage_offset"), int) else 0
    requires_grad = bool(desc.get("requires_grad")) and (dtype.is_floating_point or dtype.is_complex)
    value = AbsentTensor(tuple(shape), dtype, stride=tuple(stride) if stride else None,
                         storage_offset=offset, device=device, requires_grad=requires_grad)
    rec = {"placeholder": name, "kind": "tensor", "data": "absent", "dtype": str(dtype).replace("torch.", ""),
           "shape": list(shape), "stride": stride, "storage_offset": offset, "device": device,
           "requires_grad": requires_grad, "metadata_from": "describe_tensor" if desc else "graph annotation"}
    for key in ("source", "is_parameter", "is_leaf", "is_view", "storage", "view_base_shape"):
        if desc.get(key) not in (None, False):
            rec[key] = desc[key]
    if ann_shape and any(not re.fullmatch(r"-?\d+", d) for d in ann_shape):
        rec["symbolic_shape"] = [int(d) if re.fullmatch(r"-?\d+", d) else d for d in ann_shape]
    return value, rec


def _traced(mod, expected_inputs: int):
    """(the traced graph, the tracer's notes): ``mod`` traced as the dump import traces a
    dump's module, with grad on; a graph that cannot be traced or whose placeholders are not its
    forward's parameters is a PackError."""
    import torch

    try:
        with torch.enable_grad():
            gm, trace_notes = repro_module.trace_repro(mod)
    except Exception as err:
        raise PackError(f"the logged Dynamo graph cannot be rebuilt: {type(err).__name__}: "
                        f"{import_replay.first_line(err)}",
                        "an operator this process does not have needs --import MODULE or --load-library PATH; "
                        "--debug shows the whole error") from err
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != expected_inputs:
        raise PackError(f"the rebuilt graph takes {len(placeholders)} inputs but its forward declares "
                        f"{expected_inputs}")
    return gm, trace_notes
