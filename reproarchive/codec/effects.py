"""What a call target can touch: the effect rule of spec §7.3.

An archive names the callables its graph calls, and a name says nothing about what a callable
does (``torch.from_file`` and ``torch.zeros`` look alike). So a target is allowed by what it can
touch: it must be a tensor computation whose effects stay on its tensor arguments and results.
No file, process, network, Python object other than tensors and plain values, and no global or
random-number state that outlives the replay (the replay restores the thread state that graphs
legitimately toggle and the RNG, ``replay.containment``).

Where the effects come from:

* an **operator** (``torch.ops.<ns>.<op>.<overload>``): its schema (``codec.operator_effects``).
  Every argument and result is a tensor or a plain value (numbers, bools, dtypes, devices,
  layouts, memory formats, and lists/optionals of these); a string argument is only an enum
  *selector* or an assertion *message* (``SELECTOR_ARGUMENTS``, values checked per node); an
  operator that returns nothing writes one of its tensor arguments, or checks a value
  (``CHECK_OPERATORS``). Schemas cannot show a few effects (process-group objects reaching the
  network, the profiler's global state): those namespaces and operators are listed in
  ``SCHEMA_BLIND`` with the reason. Functional collectives have a *declared* effect (tensors
  exchanged with the ranks of a named process group, ``COLLECTIVE_NAMESPACES``): allowed, and
  replayed only with the job's ranks launched (``codec.collectives``, spec §8 ``job``);
* a **Python binding** of operators (``torch.add``, ``torch._C._nn.linear``, ``Tensor.view``):
  the schema of every overload of the ATen operator of the same name; the few bindings no
  operator describes are ``SCHEMALESS_BINDINGS``, each with the effect it has;
* a **Python composite** (``torch.nn.functional.softmax``, ``Tensor.split``): it must be part of
  torch's tensor API (``_tensor_api``: the overridable functions of ``torch.overrides``, the
  public functions of the modules that define tensor functions, ``TENSOR_API_MODULES``, and the
  symbolic-shape helpers), its signature must type it as a tensor computation (no callable,
  object or file parameter, not a function that returns nothing), and its code, followed through
  the torch functions it calls by name, must not name a file, process, network, import,
  serialization, autograd-hook or global-setting facility (``FORBIDDEN_NAMES``);
* a **higher-order operator** has no schema; ``HIGHER_ORDER`` lists each one torch registers
  with its verdict (the ones that run subgraphs of the archive are allowed, the ones that run
  code from elsewhere are not);
* ``operator``, ``math`` and a few ``builtins``: ``operator`` functions that dispatch to a
  tensor dunder, every ``math`` function, and ``BUILTINS``;
* **state functions** Dynamo puts in graphs (``torch._C._set_grad_enabled``, autocast and
  functorch levels): ``STATE_FUNCTIONS`` (``codec.state_functions``); they change thread-local
  state that the replay puts back, so their effect does not outlive it.

Anything else is refused. Every verdict is ``None`` (allowed) or the reason it is refused.
"""

from __future__ import annotations

import builtins
import functools
import inspect
import math
import operator
import re
import types
import warnings
from typing import Any

import torch
import torch.overrides
from torch import return_types

# operators: by their schemas (``codec.operator_effects``); the names below are read from here
from reproarchive.codec.operator_effects import (  # noqa: F401 - re-exported
    CHECK_OPERATORS,
    COLLECTIVE_ARGUMENTS,
    COLLECTIVE_NAMESPACES,
    SCHEMA_BLIND,
    SELECTOR_ARGUMENTS,
    is_collective,
    overload_problem,
    packet_problem,
    schema_problem,
    string_argument_problem,
)
from reproarchive.codec.state_functions import STATE_FUNCTIONS, state_function
from reproarchive.compat.dispatch import HigherOrderOperator, OpOverload, OpOverloadPacket, overridable_function_names

# --------------------------------------------------------------------------------------------
# higher-order operators: no schema, one verdict each

_SUBGRAPHS = None  # allowed: runs subgraphs of the archive (allowlisted themselves) on tensors
HIGHER_ORDER: dict[str, str | None] = {
    "associative_scan": _SUBGRAPHS, "cond": _SUBGRAPHS, "map_impl": _SUBGRAPHS, "scan": _SUBGRAPHS,
    "while_loop": _SUBGRAPHS, "while_loop_stack_output": _SUBGRAPHS, "wrap": _SUBGRAPHS,
    "wrap_with_autocast": _SUBGRAPHS, "wrap_with_set_grad_enabled": _SUBGRAPHS,
    "tag_activation_checkpoint": _SUBGRAPHS, "wrap_activation_checkpoint": _SUBGRAPHS,
    "invoke_subgraph": _SUBGRAPHS, "flex_attention": _SUBGRAPHS, "flex_attention_backward": _SUBGRAPHS,
    "hints_wrapper": _SUBGRAPHS, "autograd_function_apply": _SUBGRAPHS, "strict_mode": _SUBGRAPHS,
    "foreach_map": _SUBGRAPHS, "invoke_quant": _SUBGRAPHS, "invoke_quant_packed": _SUBGRAPHS,
    "run_and_save_rng_state": _SUBGRAPHS, "run_with_rng_state": _SUBGRAPHS,
    "graphsafe_run_with_rng_state": _SUBGRAPHS, "out_dtype": _SUBGRAPHS,
    "aoti_call_delegate": "runs a compiled shared library",
    # calls the operator it is passed (an ``operator`` argument, spec §7.2), which is judged like
    # any call target: the verdict is that operator's (``targets.check_graph_targets``)
    "auto_functionalized": _SUBGRAPHS, "auto_functionalized_v2": _SUBGRAPHS, "with_effects": _SUBGRAPHS,
    "call_torchbind": "calls a method of a TorchScript object",
    "custom_function_call": "calls a Python autograd.Function class",
    "dynamo_bypassing_wrapper": "calls an arbitrary Python callable",
    "executorch_call_delegate": "calls an ExecuTorch delegate",
    "flat_apply": "calls an arbitrary Python function named by a spec",
    "inductor_compiled_code": "runs code an earlier compile produced",
    "inline_asm_elementwise": "compiles inline assembly",
    "invoke_leaf_function": "calls an arbitrary Python function",
    "print": "prints to the process's stdout",
    "run_const_graph": "runs a constant-folded graph of another module",
    "run_dtensor_rng_op": "distributed RNG (network)",
    "local_map_hop": "distributed tensors (network)",
    "_export_tracepoint": "export tracing marker",
    # (1.4) a launch names a kernel the archive records (R8-7); ``load`` binds it to a stand-in
    # (a table of recorded tensors) or to the user's own kernel of the same source digest, never
    # to this process's side table (``codec.triton_kernels``); no other builder accepts it
    "triton_kernel_wrapper_mutation": _SUBGRAPHS, "triton_kernel_wrapper_functional": _SUBGRAPHS,
}


#: Higher-order operators that take an operator as a value and call it; no other callable may.
OPERATOR_TAKERS = frozenset({"auto_functionalized", "auto_functionalized_v2", "with_effects"})


def higher_order_problem(op: HigherOrderOperator) -> str | None:
    name = op.name()
    if name not in HIGHER_ORDER:
        return "a higher-order operator reproarchive has not classified"
    return HIGHER_ORDER[name]


# --------------------------------------------------------------------------------------------
# Python-level functions

#: C bindings that no ATen operator of their name describes, with what they do.
SCHEMALESS_BINDINGS: dict[str, str | None] = {
    # conversions and device moves of a tensor (they call aten::to / aten::_to_copy)
    **{name: None for name in (
        "float", "double", "half", "bfloat16", "int", "long", "short", "char", "byte", "bool", "cfloat",
        "cdouble", "cuda", "cpu", "xpu", "mtia", "type", "element_size", "nelement", "tolist", "new_tensor",
        "tensor", "as_tensor", "asarray", "is_shared", "get_device", "dim", "ndimension",
    )},
    "numpy": "returns a NumPy array (a Python object)",
    "untyped_storage": "returns a storage object",
    "apply_": "calls a Python callable for every element",
    "map_": "calls a Python callable for every element",
    "map2_": "calls a Python callable for every element",
    "data_ptr": "exposes a memory address",
    "from_numpy": "reads a NumPy array (a Python object)",
    "frombuffer": "reads a Python buffer object",
    "from_file": "maps a file",
}

#: Functions of torch's tensor API that are not overridable yet are tensor computations on
#: symbolic values: the shape checks Dynamo and AOTAutograd put in graphs.
SYMBOLIC_HELPERS = (
    "torch._check", "torch._check_is_size", "torch._check_with", "torch._assert", "torch._assert_async",
    "torch.sym_int", "torch.sym_float", "torch.sym_max", "torch.sym_min", "torch.sym_not", "torch.sym_ite",
    "torch.sym_sum", "torch._sym_sqrt",
)

#: Names whose appearance in a composite's code means an effect outside tensors, by kind.
FORBIDDEN_NAMES: dict[str, str] = {
    **{n: "files" for n in (
        "open", "save", "load", "from_file", "to_folder", "tofile", "mkdir", "makedirs", "unlink", "rmdir",
        "rmtree", "chdir", "remove", "rename", "NamedTemporaryFile", "mkdtemp", "TemporaryDirectory", "Path")},
    **{n: "processes" for n in ("system", "popen", "Popen", "subprocess", "spawn", "fork", "execv", "execvp")},
    **{n: "network" for n in ("socket", "urlopen", "urllib", "request", "distributed", "rpc")},
    **{n: "code" for n in ("exec", "eval", "compile", "__import__", "import_module", "importlib", "globals",
                           "setattr", "delattr", "__builtins__")},
    **{n: "Python objects" for n in (
        "numpy", "to_dlpack", "_typed_storage", "untyped_storage", "TypedStorage", "UntypedStorage", "storage",
        "_share_memory_", "share_memory_", "_new_shared", "deepcopy", "_reduce_ex_internal", "pickle",
        "copyreg", "_rebuild_from_type_v2", "__setstate__")},
    **{n: "the autograd engine and hooks" for n in (
        "backward", "_backward_hooks", "RemovableHandle", "register_hook", "_post_accumulate_grad_hooks",
        "retain_grad", "_execution_engine", "run_backward")},
    **{n: "global state" for n in (
        "manual_seed", "seed", "set_rng_state", "set_default_dtype", "set_default_device",
        "set_default_tensor_type", "set_num_threads", "set_flush_denormal", "use_deterministic_algorithms",
        "environ", "putenv", "set_printoptions", "set_grad_enabled", "_set_grad_enabled")},
}


#: Names the scan would flag in torch's own composites where the use is reviewed and harmless.
REVIEWED_USES: dict[tuple[str, str], str] = {
    ("torch.nn.functional.pad", "import_module"): "imports torch._decomp.decompositions by a constant name",
    ("torch.nn.functional.pad", "importlib"): "imports torch._decomp.decompositions by a constant name",
    ("torch.nn.functional.interpolate", "import_module"): "imports torch._decomp.decompositions by a constant name",
    ("torch.nn.functional.interpolate", "importlib"): "imports torch._decomp.decompositions by a constant name",
    ("torch.nn.functional.max_pool3d_with_indices", "import_module"): "imports torch._decomp by a constant name",
    ("torch.nn.functional.max_pool3d_with_indices", "importlib"): "imports torch._decomp by a constant name",
    ("torch.__all_and_float_types", "numpy"): "isinstance checks against NumPy scalar types",
}


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _unwrap(fn: Any) -> Any:
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn


_MAX_COMPOSITE_FUNCTIONS = 400
#: The ``__torch_function__`` protocol: it only runs code of tensor subclasses, and a graph's
#: values are plain tensors (inputs are rebuilt as ``torch.Tensor``, parameters as ``Parameter``).
_DISPATCH_PLUMBING = {"torch.overrides", "torch._C"}


def composite_problem(fn: types.FunctionType) -> str | None:
    """The code of a composite and of the torch Python functions it reaches by name."""
    seen: set[int] = set()
    todo = [_unwrap(fn)]
    while todo:
        f = todo.pop()
        if id(f) in seen or not isinstance(f, types.FunctionType):
            continue
        seen.add(id(f))
        if len(seen) > _MAX_COMPOSITE_FUNCTIONS:
            return "its code reaches too many Python functions to check"
        names = _code_names(f.__code__)
        where = f"{f.__module__}.{f.__qualname__}"
        for name in sorted(names):
            if name in FORBIDDEN_NAMES and (where, name) not in REVIEWED_USES:
                return f"its code ({where}) names {name!r} ({FORBIDDEN_NAMES[name]})"
        scope = dict(f.__globals__)
        for cell, var in zip(f.__closure__ or (), f.__code__.co_freevars):
            try:
                scope[var] = cell.cell_contents
            except ValueError:
                pass
        for name in names | set(f.__code__.co_freevars):
            target = _unwrap(scope.get(name))
            if isinstance(target, types.FunctionType) and str(target.__module__).startswith("torch") \
                    and target.__module__ not in _DISPATCH_PLUMBING:
                todo.append(target)
    return None


#: Annotation words that type a parameter as something other than a tensor or a plain value.
_OBJECT_PARAMETER = re.compile(r"\b(Callable|Module|Any|object|IO|PathLike|BinaryIO|FILE_LIKE|Storage)\b")


def _signature_problem(fn: Any) -> str | None:
    """What the signature says about effects: a composite calls what it is given (a callable or
    module parameter), reads what it is handed (an object, a file), and one annotated to return
    nothing can only have acted on something other than its result."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    for p in sig.parameters.values():
        text = str(p.annotation)
        if p.annotation is inspect.Parameter.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue  # a graph passes only values (``codec.targets``): the annotation is all it adds
        if "Generator" in text and "None" not in text and "Optional" not in text:
            return f"takes a generator parameter {p.name!r}"
        if _OBJECT_PARAMETER.search(text.replace("typing.", "")):
            return f"takes a callable or object parameter {p.name!r}"
    if sig.return_annotation in (None, "None"):
        return "returns nothing: its only effect is outside its results"
    return None


#: The modules that define torch's tensor functions in Python. ``torch.overrides``' overridable
#: list is the set its ``__torch_function__`` tests cover, not the tensor API: it leaves out
#: deprecated wrappers (``F.sigmoid``, ``F.upsample``), functions it has no test override for
#: (``F.hardswish``, ``F.hardsigmoid``) and new operators (``F.scaled_mm``, ``F.grouped_mm``), all
#: plain tensor functions. A public function these modules define is in the API too, and is then
#: judged like any composite, by its signature and its code.
TENSOR_API_MODULES = ("torch.nn.functional", "torch.functional", "torch._tensor")


@functools.lru_cache(maxsize=1)
def _tensor_api() -> frozenset[int]:
    """Ids of torch's tensor API: the overridable functions, the public functions defined in
    ``TENSOR_API_MODULES`` (as torch.overrides indexes its namespaces: torch, torch.functional,
    torch.nn.functional, torch.Tensor, ...), and the symbolic helpers."""

    ids = set()
    for functions in torch.overrides.get_overridable_functions().values():
        ids.update(id(_unwrap(f)) for f in functions)
    for fn, where in overridable_function_names().items():
        public = where.rsplit(".", 1)[-1]
        target = _unwrap(fn)
        if isinstance(target, types.FunctionType) and not public.startswith("_") \
                and target.__module__ in TENSOR_API_MODULES:
            ids.add(id(target))
    return frozenset(ids | _symbolic_helpers())


@functools.lru_cache(maxsize=1)
def _symbolic_helpers() -> frozenset[int]:
    """Ids of the ``SYMBOLIC_HELPERS`` this torch has."""
    ids = set()
    for name in SYMBOLIC_HELPERS:
        obj: Any = torch
        for part in name.split(".")[1:]:
            obj = getattr(obj, part, None)
        if obj is not None:
            ids.add(id(_unwrap(obj)))
    return frozenset(ids)


@functools.lru_cache(maxsize=1)
def tensor_namespaces() -> frozenset[str]:
    """Where an allowed callable can live: the namespaces ``torch.overrides`` indexes (``torch``,
    ``torch.nn.functional``, ``torch.Tensor``, ...), the modules of the state functions and
    symbolic helpers, and ``torch._C`` (the C bindings of operators). A name this torch cannot
    resolve under any other module (``torch.utils.cpp_extension.load`` while that module is not
    imported) would be refused whatever it is, so the rule can judge it without resolving it."""
    homes = {where.rsplit(".", 1)[0] for where in overridable_function_names().values()}
    homes |= {name.rsplit(".", 1)[0] for name in (*STATE_FUNCTIONS, *SYMBOLIC_HELPERS)}
    return frozenset(homes | {"torch._C"})


def unresolved_problem(found: str) -> str | None:
    """For a name whose longest resolvable prefix is ``found``: why it is refused
    without resolving it (None: it could be a tensor function a newer torch has)."""
    if found in tensor_namespaces() or found.startswith("torch._C."):
        return None
    return f"not part of torch's tensor API: {found} holds none of its functions"


def _aten_packet(name: str) -> OpOverloadPacket | None:
    if not name or name.startswith("__"):
        return None
    try:
        packet = getattr(torch.ops.aten, name)
    except (AttributeError, RuntimeError):
        return None
    return packet if isinstance(packet, OpOverloadPacket) else None


_OPERATOR_DUNDER = {"not_": None, "truth": "__bool__", "is_": None, "is_not": None, "concat": "__add__",
                    "iconcat": "__iadd__", "index": "__index__", "contains": "__contains__"}
#: builtins a graph may call: numeric and structural functions on values (``getattr`` only for
#: data attributes, checked per node).
BUILTINS = {"getattr", "len", "abs", "min", "max", "sum", "int", "float", "bool", "round", "pow", "divmod", "range",
            "tuple", "list", "all", "any", "isinstance", "slice"}


def operator_problem(name: str) -> str | None:
    """An ``operator`` function is allowed when it is the function form of a tensor dunder."""
    if name in _OPERATOR_DUNDER:
        dunder = _OPERATOR_DUNDER[name]
    else:
        dunder = f"__{name.rstrip('_')}__"
    if dunder is None or hasattr(torch.Tensor, dunder):
        fn = getattr(operator, name, None)
        if isinstance(fn, types.BuiltinFunctionType):
            return None
    return "not the function form of a tensor operator"


def _binding_problem(name: str) -> str | None:
    packet = _aten_packet(name)
    if packet is not None:
        return packet_problem(packet, dispatcher_only=True)
    if name in SCHEMALESS_BINDINGS:
        return SCHEMALESS_BINDINGS[name]
    return "a C function no operator schema describes"


#: The Python data model's numeric, comparison, item and conversion protocol.
PROTOCOL_DUNDERS = {
    "add", "sub", "mul", "truediv", "floordiv", "div", "mod", "pow", "matmul", "and", "or", "xor", "lshift",
    "rshift", "neg", "pos", "abs", "invert", "eq", "ne", "lt", "le", "gt", "ge", "getitem", "setitem", "len",
    "bool", "nonzero", "float", "int", "long", "index", "complex", "contains",
}


def dunder_problem(name: str) -> str | None:
    """Tensor dunders: the numeric, comparison and item protocol (also reflected ``__r*__`` and
    in-place ``__i*__``), and conversions to numbers."""
    core = name[2:-2]
    if core in PROTOCOL_DUNDERS or core[:1] in ("r", "i") and core[1:] in PROTOCOL_DUNDERS:
        return None
    return "a dunder method outside the numeric and item protocol"


def callable_problem(fn: Any) -> str | None:
    """Why a resolved Python-level callable is refused (None: allowed)."""
    if isinstance(fn, OpOverload):
        return overload_problem(fn)
    if isinstance(fn, OpOverloadPacket):
        return packet_problem(fn)
    if isinstance(fn, HigherOrderOperator):
        return higher_order_problem(fn)
    state = state_function(fn)
    if state is not None:
        return None
    module = getattr(fn, "__module__", None) or getattr(getattr(fn, "__objclass__", None), "__module__", None)
    name = getattr(fn, "__name__", "")
    if fn is getattr(builtins, name, None) and name in BUILTINS:
        return None
    if module == "math" and isinstance(fn, types.BuiltinFunctionType) and fn is getattr(math, name, None):
        return None
    if module in ("operator", "_operator") and fn is getattr(operator, name, None):
        return operator_problem(name)
    if isinstance(fn, type):
        return "a class (constructing objects)"
    if name.startswith("__") and name.endswith("__"):
        return dunder_problem(name) if _is_tensor_member(fn) else "a dunder method"
    if isinstance(fn, (types.BuiltinFunctionType, types.MethodDescriptorType, types.WrapperDescriptorType,
                       types.MethodWrapperType)):
        if not str(module or "torch").startswith("torch") and not _is_tensor_member(fn):
            return "a C function outside torch"
        return _binding_problem(name)
    target = _unwrap(fn)
    if target is not fn and isinstance(target, (types.BuiltinFunctionType, types.MethodDescriptorType)):
        return _binding_problem(getattr(target, "__name__", ""))
    if isinstance(target, types.FunctionType):
        if id(target) not in _tensor_api():
            return "a Python function outside torch's tensor API"
        if id(target) in _symbolic_helpers():  # torch 2.15 types their symbolic values ``a: object``
            return composite_problem(target)
        return _signature_problem(target) or composite_problem(target)
    return f"a {type(fn).__name__}, not a function"


def _is_tensor_member(fn: Any) -> bool:
    owner = getattr(fn, "__objclass__", None)
    return owner is not None and issubclass(torch.Tensor, owner) if isinstance(owner, type) else False


@functools.lru_cache(maxsize=None)
def method_problem(name: str) -> str | None:
    """A ``call_method`` target: a public method of ``torch.Tensor`` (or a protocol dunder),
    classified like the function it is."""
    fn = inspect.getattr_static(torch.Tensor, name, None)
    if fn is None or not callable(getattr(torch.Tensor, name, None)):
        return "not a Tensor method"
    if name.startswith("__"):
        return dunder_problem(name)
    if name.startswith("_"):
        return "a private method"
    if isinstance(fn, (staticmethod, classmethod)):
        return "a static or class method"
    return callable_problem(getattr(torch.Tensor, name))


# --------------------------------------------------------------------------------------------
# attributes a graph may read with getattr


@functools.lru_cache(maxsize=1)
def data_attributes() -> frozenset[str]:
    """Public attributes that hold data on tensors and on the values graphs compute: what
    ``getattr`` may read. Derived by reading every non-callable Tensor attribute on probe
    tensors and keeping those whose value is a tensor or a plain value on every probe where it
    exists (``grad_fn``, an autograd node, is not), plus the field names of ``torch.return_types``
    that are not also Tensor methods."""

    plain = (torch.Tensor, int, float, bool, complex, type(None), torch.dtype, torch.device, torch.layout,
             torch.Size, torch.memory_format)
    leaf = torch.ones(2, 2, requires_grad=True)
    probes = [leaf, leaf * 2, torch.ones(2, 2, dtype=torch.complex64), torch.ones(3, dtype=torch.int64)]
    names = set()
    for name in dir(torch.Tensor):
        if name.startswith("_"):
            continue
        static = inspect.getattr_static(torch.Tensor, name, None)
        if not isinstance(static, (types.GetSetDescriptorType, property, types.MemberDescriptorType)):
            continue
        values = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for p in probes:
                try:
                    values.append(getattr(p, name))
                except Exception:  # noqa: BLE001 - undefined on this probe (mT of a 1-d tensor)
                    pass
        if values and all(isinstance(v, plain) for v in values):
            names.add(name)

    for cls_name in dir(return_types):
        cls = getattr(return_types, cls_name)
        if isinstance(cls, type) and issubclass(cls, tuple):
            # a field that is also a Tensor method (``values``, ``max``) would read a bound
            # method off a tensor: left out (graphs index these tuples with getitem anyway)
            names.update(k for k, v in vars(cls).items() if isinstance(v, types.MemberDescriptorType)
                         and not k.startswith("_") and not callable(getattr(torch.Tensor, k, None)))
    return frozenset(names)
