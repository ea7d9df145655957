"""The effect rule of spec §7.3, checked over everything torch registers.

Every operator the dispatcher knows and every function of torch's overridable tensor API goes
through the allowlist. Each accepted one is checked here against the rule written out again
from its schema text (not through the allowlist's own helpers): tensors, plain values and enum
selectors in and out, no namespace whose effects leave the process. Known effectful callables
that look like tensor functions must be refused, and the ops real models need accepted.
"""

from __future__ import annotations

import re

import pytest
import torch

from reproarchive.codec import effects

# Type words a schema may show for an accepted operator: tensors and plain values.
_PLAIN = re.compile(r"^(Tensor|SymInt|int|float|SymFloat|bool|SymBool|complex|Scalar|ScalarType|Layout|"
                    r"MemoryFormat|Device|number|NoneType|Generator)(\(\w+!?\))?(\[\d*\])?\??$")
_LEAVES_PROCESS = ("c10d", "_dtensor", "profiler", "debugprims")


def _dispatcher_overloads():
    for qualified in torch._C._dispatch_get_all_op_names():
        ns, _, rest = qualified.partition("::")
        name, _, overload = rest.partition(".")
        try:
            yield qualified, getattr(getattr(getattr(torch.ops, ns), name), overload or "default")
        except (AttributeError, RuntimeError):
            continue


def _argument_types(schema) -> list[tuple[str, str]]:
    return [(a.name, str(a.type)) for a in schema.arguments] + [("<result>", str(r.type)) for r in schema.returns]


def test_every_accepted_operator_is_a_tensor_computation():
    accepted, problems = 0, []
    for qualified, op in _dispatcher_overloads():
        if effects.overload_problem(op) is not None:
            continue
        accepted += 1
        if qualified.split("::")[0] in _LEAVES_PROCESS:
            problems.append(f"{qualified}: its namespace acts outside the process")
        collective = effects.is_collective(op._schema)  # declared effect: a named group's ranks (§8 job)
        for name, typ in _argument_types(op._schema):
            if collective and name in effects.COLLECTIVE_ARGUMENTS:
                continue
            base = typ.replace("Optional[", "").rstrip("]") if typ.startswith("Optional[") else typ
            if base.startswith("List[") or base.startswith("Tuple["):
                inner = [w for w in re.findall(r"[A-Za-z]+", base) if w not in ("List", "Tuple", "Optional")]
                ok = all(_PLAIN.match(t) for t in inner)
            elif base == "str":
                ok = name in effects.SELECTOR_ARGUMENTS
            else:
                ok = bool(_PLAIN.match(base))
            if not ok:
                problems.append(f"{qualified}: {name}: {typ}")
        if not op._schema.returns and not any(a.alias_info is not None and a.alias_info.is_write
                                              for a in op._schema.arguments) \
                and op._schema.name not in effects.CHECK_OPERATORS \
                and any("Tensor" in str(a.type) for a in op._schema.arguments) is False:
            problems.append(f"{qualified}: returns nothing and writes no tensor")
    assert accepted > 2000, accepted  # torch 2.13 CPU: about 3,300 of 3,600
    assert not problems, "\n".join(problems[:40])


KNOWN_EFFECTFUL = [
    torch.save, torch.load, torch.from_file, torch.manual_seed, torch.seed, torch.set_default_dtype,
    torch.set_num_threads, torch.set_default_device, torch.compile, torch.jit.script,
    torch.use_deterministic_algorithms,
    torch.Tensor.register_hook, torch.Tensor.numpy, torch.Tensor.share_memory_, torch.Tensor.untyped_storage,
    torch.ops.aten.from_file.default, torch.ops.profiler._record_function_enter_new.default,
]


@pytest.mark.parametrize("fn", KNOWN_EFFECTFUL, ids=lambda f: getattr(f, "__qualname__", str(f)))
def test_effectful_callables_are_refused(fn):
    if isinstance(fn, torch._ops.OpOverload):
        assert effects.overload_problem(fn) is not None
    else:
        assert effects.callable_problem(fn) is not None


NEEDED = [
    torch.ops.aten.add.Tensor, torch.ops.aten.mm.default, torch.ops.aten.convolution.default,
    torch.ops.aten.relu.default, torch.ops.aten._softmax.default, torch.ops.aten.native_layer_norm.default,
    torch.ops.aten.sum.dim_IntList, torch.ops.aten.view.default, torch.ops.aten.expand.default,
    torch.ops.aten.copy_.default, torch.ops.aten.index.Tensor, torch.ops.aten.embedding.default,
    torch.ops.aten.addmm.default, torch.ops.aten.bmm.default, torch.ops.aten.mean.dim,
    torch.ops.aten.native_dropout.default, torch.ops.aten.gelu.default, torch.ops.aten.div.Tensor_mode,
    torch.ops.aten.scaled_dot_product_attention.default, torch.ops.prims.convert_element_type.default,
]


@pytest.mark.parametrize("op", NEEDED, ids=str)
def test_operators_real_models_need_are_accepted(op):
    assert effects.overload_problem(op) is None


def test_torch_api_functions_accepted_are_not_effectful_by_name():
    """Over torch's overridable tensor API, what the allowlist accepts contains no function
    whose name says it saves, loads, seeds, hooks, compiles or sets global state."""
    effectful = re.compile(r"(^|[._])(save|load|from_file|manual_seed|seed|set_default|set_num|compile|script|"
                           r"register_\w*hook|share_memory|record_stream|untyped_storage|numpy)($|[._])")
    accepted, named = 0, []
    for functions in torch.overrides.get_overridable_functions().values():
        for fn in functions:
            if effects.callable_problem(fn) is None:
                accepted += 1
                name = getattr(fn, "__qualname__", "") or getattr(fn, "__name__", "")
                if effectful.search(name) and name != "Tensor.module_load":  # copies a tensor into a tensor
                    named.append(name)
    assert accepted > 1000, accepted
    assert not named, named


def test_graphs_of_real_model_idioms_pass_the_allowlist(tmp_path):
    """What torch.compile hands a backend from a transformer block, a conv net, indexing idioms
    and a cond, at the Dynamo level and after AOTAutograd (forward and backward), packs and
    loads: the effect rule refuses none of what real models need."""
    import reproarchive
    from support.real_graphs import captured_graphs

    graphs = captured_graphs()
    assert len(graphs) >= 6
    for i, (label, gm, inputs) in enumerate(graphs):
        path = reproarchive.pack(gm, inputs, tmp_path / f"g{i}.tar.zst", backend="eager")
        repro = reproarchive.load(path)
        assert len(repro.args) == len(inputs), label


def test_a_named_tensor_overload_is_a_tensor_computation_on_torches_that_still_have_them():
    """torch 2.11 (seen on a GPU machine) has ``sum.dim_DimnameList``, whose ``Dimname[1] dim``
    it types and prints as ``str[1] dim``: refusing it refused ``torch.sum`` itself. A dimension
    name of an aten overload named for them is allowed; a string that is not one, or a custom
    op's string, is still refused."""
    from reproarchive.codec.operator_effects import schema_problem

    as_211 = torch._C.parse_schema(  # the text torch 2.11 gives: no Dimname left anywhere
        "aten::sum.dim_DimnameList(Tensor self, str[1] dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor")
    assert schema_problem(as_211) is None
    flatten = torch._C.parse_schema(
        "aten::flatten.named_out_dim(Tensor(a) self, int start_dim, int end_dim, str out_dim) -> Tensor(a)")
    assert schema_problem(flatten) is None
    not_a_name = torch._C.parse_schema("aten::sum.dim_DimnameList(Tensor self, str[1] path) -> Tensor")
    assert "takes or returns a str" in schema_problem(not_a_name)
    not_named_for_them = torch._C.parse_schema("aten::sum.dim_IntList(Tensor self, str[1] dim) -> Tensor")
    assert "takes or returns a str" in schema_problem(not_named_for_them)
    custom = torch._C.parse_schema("mylib::load.DimnameList(Tensor self, str dim) -> Tensor")
    assert "not an enum selector" in schema_problem(custom)
