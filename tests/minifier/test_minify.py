"""The minifier library: each move on small graphs, the safety rules, interruption, the memo."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx as fx

from reproarchive.minifier import NotFailingError, minify, minify_with_stats, op_count
from reproarchive.minifier.candidate import Recording, concrete_scalar, snapshot_tensor

aten = torch.ops.aten


def targets(gm: fx.GraphModule) -> list:
    return [n.target for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]


def contains(*wanted):
    def fails(gm, inputs):
        present = targets(gm)
        return all(w in present for w in wanted)
    return fails


def graph(build, n_inputs: int = 1) -> fx.GraphModule:
    g = fx.Graph()
    xs = [g.placeholder(f"x{i}") for i in range(n_inputs)]
    out = build(g, *xs)
    g.output(out if isinstance(out, tuple) else (out,))
    return fx.GraphModule(torch.nn.Module(), g)


def chain(g, x, ops):
    for op in ops:
        x = g.call_function(op, (x,))
    return x


def run_ok(gm, inputs):
    gm.graph.lint()
    return gm(*inputs)


# -- recorded values and cut inputs ----------------------------------------------------------


def test_snapshot_keeps_strides_offset_and_grad_but_not_storage_or_history():
    base = torch.randn(6, 8, requires_grad=True)
    view = (base * 2)[1:, ::2].t()
    snap = snapshot_tensor(view)
    assert snap.stride() == view.stride() and snap.storage_offset() == view.storage_offset()
    assert torch.equal(snap, view.detach())
    assert snap.is_leaf and snap.requires_grad
    assert snap.untyped_storage().data_ptr() != view.untyped_storage().data_ptr()
    # an oracle's copy of a graph input: a non-leaf stays one (as `run` hands it to the
    # compiler), with a history of its own
    kept = snapshot_tensor(view, keep_leafness=True)
    assert not kept.is_leaf and kept.requires_grad and kept.stride() == view.stride()
    kept.sum().backward()
    assert base.grad is None
    assert snapshot_tensor(base, keep_leafness=True).is_leaf
    expanded = torch.randn(1, 4).expand(3, 4)
    assert snapshot_tensor(expanded).stride() == expanded.stride()


def test_symint_is_concretised_to_its_hint():
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    sym = env.create_symintnode(env.create_symbol(5, ConstantSource("s")), hint=5)
    assert isinstance(sym, torch.SymInt)
    value = concrete_scalar(sym)
    assert value == 5 and type(value) is int


def test_cut_turns_an_intermediate_tensor_into_an_input_with_its_eager_value_and_strides():
    gm = graph(lambda g, x: chain(g, g.call_function(aten.permute.default, (chain(g, x, [aten.sin.default]), [1, 0])),
                                  [aten.cos.default, aten.atan.default]))
    x = torch.randn(3, 5)
    out, inputs = minify(gm, [x], contains(aten.atan.default))
    assert targets(out) == [aten.atan.default]
    (cut,) = inputs
    expected = x.sin().permute(1, 0).cos()
    assert torch.equal(cut, expected) and cut.stride() == expected.stride()
    assert torch.equal(run_ok(out, inputs)[0], expected.atan())


def test_cut_turns_an_int_node_into_an_int_input():
    def build(g, x):
        s = g.call_function(aten.sym_size.int, (x, 0))
        q = g.call_function(operator.floordiv, (s, 2))
        return g.call_function(aten.view.default, (x, [q, -1]))

    gm = graph(build)
    out, inputs = minify(gm, [torch.randn(4, 3)], contains(aten.view.default))
    assert targets(out) == [aten.view.default]
    assert sorted(type(v).__name__ for v in inputs) == ["Tensor", "int"]
    assert [v for v in inputs if type(v) is int] == [2]
    assert run_ok(out, inputs)[0].shape == (2, 6)


# -- truncate, outputs, bypass, dead code ----------------------------------------------------


def test_truncate_and_hoist_outputs_upstream():
    gm = graph(lambda g, x: chain(g, x, [aten.sin.default, aten.atan.default, aten.cos.default, aten.tanh.default]))
    out, inputs = minify(gm, [torch.randn(4)], contains(aten.atan.default))
    assert targets(out) == [aten.atan.default]
    assert [n.args[0][0].target for n in out.graph.nodes if n.op == "output"] == [aten.atan.default]


class MiscompiledSin(fx.Interpreter):
    def call_function(self, target, args, kwargs):
        out = super().call_function(target, args, kwargs)
        return out + 1 if target is aten.sin.default else out


def test_any_node_can_become_an_output_when_downstream_hides_the_bug():
    # accuracy bug in sin; x*0 hides it on one path, tanh shows it on the other
    def build(g, x):
        s = g.call_function(aten.sin.default, (x,))
        hidden = g.call_function(aten.add.Tensor, (g.call_function(aten.mul.Tensor, (s, 0.0)), x))
        shown = g.call_function(aten.tanh.default, (s,))
        return g.call_function(aten.add.Tensor, (hidden, shown))

    def fails(gm, inputs):
        expected, got = gm(*inputs), MiscompiledSin(gm).run(*inputs)
        return any(not torch.allclose(e, o) for e, o in zip(expected, got))

    gm = graph(build)
    out, inputs = minify(gm, [torch.randn(4)], fails)
    assert targets(out) == [aten.sin.default]
    assert fails(out, inputs)


def test_bypass_removes_the_middle_of_a_chain_between_two_culprits():
    def fails(gm, inputs):
        for n in gm.graph.nodes:
            if n.target is aten.erf.default:
                stack, seen = list(n.all_input_nodes), set()
                while stack:
                    m = stack.pop()
                    if m.target is aten.atan.default:
                        return True
                    if m not in seen:
                        seen.add(m)
                        stack.extend(m.all_input_nodes)
        return False

    gm = graph(lambda g, x: chain(g, x, [aten.sin.default, aten.atan.default, aten.cos.default, aten.tanh.default,
                                         aten.neg.default, aten.erf.default, aten.abs.default]))
    result = minify_with_stats(gm, [torch.randn(4)], fails)
    assert targets(result.gm) == [aten.atan.default, aten.erf.default]
    erf = next(n for n in result.gm.graph.nodes if n.target is aten.erf.default)
    assert erf.args[0].target is aten.atan.default
    assert result.stats.passes["bypass"].successes >= 1
    assert result.input_origins == ["node:sin_default"]
    run_ok(result.gm, result.inputs)


def test_dead_code_and_unused_inputs_are_dropped():
    def build(g, x, unused):
        g.call_function(aten.cos.default, (x,))  # dead
        return g.call_function(aten.atan.default, (g.call_function(aten.sin.default, (x,)),))

    gm = graph(build, n_inputs=2)
    out, inputs = minify(gm, [torch.randn(3), torch.randn(3)], contains(aten.atan.default))
    assert targets(out) == [aten.atan.default] and len(inputs) == 1


def test_tuple_producing_nodes_are_never_cut_and_output_through_getitem():
    def build(g, x):
        pair = g.call_function(aten.max.dim, (chain(g, x, [aten.sin.default]), 0))
        values = g.call_function(operator.getitem, (pair, 0))
        idx = g.call_function(operator.getitem, (pair, 1))
        return chain(g, values, [aten.cos.default]), idx

    gm = graph(build)
    out, inputs = minify(gm, [torch.randn(3, 4)], contains(aten.max.dim))
    assert aten.max.dim in targets(out) and operator.getitem in targets(out)
    assert all(isinstance(v, torch.Tensor) for v in inputs)
    run_ok(out, inputs)
    # cutting below the tuple: the getitem becomes a tensor input, the tuple node goes
    out, inputs = minify(gm, [torch.randn(3, 4)], contains(aten.cos.default))
    assert targets(out) == [aten.cos.default] and inputs[0].shape == (4,)


def test_an_inplace_update_stays_while_a_kept_later_reader_depends_on_it():
    def build(g, x):
        y = g.call_function(aten.sin.default, (x,))
        g.call_method("add_", (y, 1.0))
        return g.call_function(aten.mul.Tensor, (y, 2.0))

    gm = graph(build)
    x = torch.randn(5)
    expected = (x.sin() + 1) * 2

    def fails(gm, inputs):  # the bug is "mul gives this value": only true if add_ still ran
        return aten.mul.Tensor in targets(gm) and torch.allclose(gm(*inputs)[0], expected)

    out, inputs = minify(gm, [x], fails)
    assert aten.sin.default not in targets(out)
    assert "add_" in targets(out)
    assert torch.allclose(run_ok(out, inputs)[0], expected)


def test_every_call_gets_private_inputs():
    gm = graph(lambda g, x: chain(g, x, [aten.sin.default, aten.cos.default, aten.atan.default, aten.tanh.default]))
    seen: dict[str, float] = {}

    def fails(gm, inputs):
        names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        for name, t in zip(names, inputs):
            total = float(t.sum())
            assert seen.setdefault(name, total) == total
            t.mul_(0).add_(7)  # a hostile predicate / compiler writing into its inputs
        return aten.atan.default in targets(gm)

    out, inputs = minify(gm, [torch.randn(4)], fails)
    assert targets(out) == [aten.atan.default]
    assert not torch.all(inputs[0] == 7)


def test_intermediate_inputs_are_detached_leaves_that_keep_requires_grad():
    gm = graph(lambda g, x: chain(g, x, [aten.sin.default, aten.atan.default]))
    x = torch.randn(4, requires_grad=True)
    out, inputs = minify(gm, [x], contains(aten.atan.default))
    assert targets(out) == [aten.atan.default]
    assert inputs[0].is_leaf and inputs[0].requires_grad
    run_ok(out, inputs)[0].sum().backward()
    assert x.grad is None  # the candidate's autograd graph is not connected to the caller's


# -- the search, the memo, interruption ------------------------------------------------------


def long_chain(n: int = 40) -> fx.GraphModule:
    ops = [aten.sin.default, aten.cos.default, aten.tanh.default]
    seq = [ops[i % 3] for i in range(n)]
    seq[n // 3] = aten.atan.default
    seq[2 * n // 3] = aten.erf.default
    return graph(lambda g, x: chain(g, x, seq))


def test_two_culprits_and_the_memo_never_judges_a_graph_twice():
    keys = []

    def fails(gm, inputs):
        keys.append((gm.code, tuple((tuple(t.shape), t.dtype) for t in inputs)))
        return contains(aten.atan.default, aten.erf.default)(gm, inputs)

    result = minify_with_stats(long_chain(), [torch.randn(4)], fails)
    assert sorted(map(str, targets(result.gm))) == ["aten.atan.default", "aten.erf.default"]
    assert len(keys) == len(set(keys)) == result.stats.calls
    assert result.stats.cache_hits > 0
    assert sum(p.calls for p in result.stats.passes.values()) == result.stats.calls
    assert result.stats.final_ops == 2 and result.stats.stop_reason == "fixpoint"
    import msgpack
    assert msgpack.unpackb(msgpack.packb(result.stats.as_dict()))["passes"]["bisect_inputs"]["calls"] > 0


def test_fails_raising_counts_as_not_failing():
    def fails(gm, inputs):
        if aten.cos.default not in targets(gm):
            raise RuntimeError("predicate crashed")
        return True

    result = minify_with_stats(long_chain(12), [torch.randn(4)], fails)
    assert result.stats.oracle_errors > 0
    assert targets(result.gm) == [aten.cos.default]


def test_the_input_must_fail():
    with pytest.raises(NotFailingError):
        minify(long_chain(6), [torch.randn(4)], lambda gm, inputs: False)


def test_max_time_returns_the_best_so_far():
    result = minify_with_stats(long_chain(), [torch.randn(4)], contains(aten.atan.default), max_time=0)
    assert result.stats.stop_reason == "max_time"
    assert result.stats.calls == 1  # only the check of the input graph
    assert result.gm.graph is not None and contains(aten.atan.default)(result.gm, result.inputs)


def test_keyboard_interrupt_inside_fails_keeps_the_best_and_last_checkpoint():
    calls = {"n": 0}
    checkpoints = []
    inner = contains(aten.atan.default, aten.erf.default)

    def fails(gm, inputs):
        calls["n"] += 1
        if calls["n"] == 6:
            raise KeyboardInterrupt
        return inner(gm, inputs)

    original = long_chain()
    result = minify_with_stats(original, [torch.randn(4)], fails,
                               on_accept=lambda gm, inputs, stats: checkpoints.append(gm.code))
    assert result.stats.stop_reason == "interrupted"
    assert checkpoints and checkpoints[-1] == result.gm.code
    assert op_count(result.gm) < op_count(original)
    assert inner(result.gm, result.inputs)
    run_ok(result.gm, result.inputs)


def test_progress_reports_every_judged_candidate():
    events = []
    result = minify_with_stats(long_chain(), [torch.randn(4)], contains(aten.atan.default), progress=events.append)
    assert len(events) == result.stats.calls - 1 + result.stats.cache_hits
    assert events[-1].best_ops == 1


def test_recording_rejects_mismatched_inputs():
    with pytest.raises(ValueError):
        Recording(long_chain(4), [])


def test_a_graph_that_cannot_run_eagerly_is_a_clear_error():
    from reproarchive.minifier import EagerRunError

    gm = graph(lambda g, x: g.call_function(aten.mm.default, (x, x)))
    with pytest.raises(EagerRunError, match="does not run eagerly"):
        minify(gm, [torch.randn(2, 3)], lambda gm, inputs: True)


def mixed_graph() -> fx.GraphModule:
    """Tuples, getitem, ints from sizes, an in-place update, a strided view and a dead node."""
    def build(g, x, y):
        s = g.call_function(aten.sin.default, (x,))
        pair = g.call_function(aten.max.dim, (s, 1, True))
        values = g.call_function(operator.getitem, (pair, 0))
        idx = g.call_function(operator.getitem, (pair, 1))
        n = g.call_function(aten.sym_size.int, (s, 0))
        half = g.call_function(operator.floordiv, (n, 2))
        v = g.call_function(aten.view.default, (s, [half, -1]))
        t = g.call_function(aten.permute.default, (y, [1, 0]))
        c = g.call_function(aten.cos.default, (t,))
        g.call_method("mul_", (c, 2.0))
        u = g.call_function(aten.add.Tensor, (c, values))
        g.call_function(aten.tanh.default, (u,))  # dead
        return g.call_function(aten.atan.default, (u,)), v, idx

    return graph(build, n_inputs=2)


def test_every_kept_set_builds_a_valid_runnable_graph():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    rec = Recording(mixed_graph(), [torch.randn(4, 6), torch.randn(6, 4)])

    @settings(max_examples=80, deadline=None, database=None)
    @given(st.sets(st.sampled_from(rec.ops)), st.booleans())
    def check(keep, bypass_first):
        subst = {}
        if bypass_first:  # bypass cos with its argument (same shape and dtype)
            cos = next(i for i in rec.ops if rec.nodes[i].target is aten.cos.default)
            subst = {cos: rec.args[cos][0]}
        cand = rec.normalise(keep, subst)
        gm, inputs = rec.build(cand)
        gm.graph.lint()
        assert len(inputs) == len([n for n in gm.graph.nodes if n.op == "placeholder"])
        assert all(type(v) is int or isinstance(v, torch.Tensor) for v in inputs)
        gm(*[snapshot_tensor(v) if isinstance(v, torch.Tensor) else v for v in inputs])
        # the in-place update is only dropped when no kept node reads its target afterwards
        if aten.add.Tensor in targets(gm):
            assert "mul_" in targets(gm)

    check()


def test_reproarchive_minify_is_callable_however_it_was_imported():
    import reproarchive
    import reproarchive.minifier  # noqa: F401 - a module import must not shadow the function

    gm, inputs = reproarchive.minify(long_chain(8), [torch.randn(4)], contains(aten.atan.default), max_time=None)
    assert targets(gm) == [aten.atan.default]
