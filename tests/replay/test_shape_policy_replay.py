"""A symbolic recording replays with its recorded shape policy, and says when it cannot.

The backends (tests/support/symbolic_backends.py) fail only on symbolic graphs: a replay with
static shapes would pass and send the user away. Each archive is also replayed with its
``shapes`` record removed from the index (everything else byte for byte as written): that is
the forced static replay, and it must not reproduce, which proves that the record is what
makes it reproduce.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import reproarchive
from reproarchive.codec.shapes import fakes_for, restricted
from reproarchive.replay.outcome import REPRODUCED
from support import hostile_corpus, symbolic_backends
from support.cli import invoke
from support.symbolic_backends import FREE_SYMBOLS, UNBACKED, nonzero_view, two_sums

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

NOT_RECORDED = "shape policy was not recorded"


def capture(path, fn, args, backend, **compile_options):
    compiled = torch.compile(fn, backend=reproarchive.capture(backend, path=path), **compile_options)
    with pytest.raises(Exception, match="symbol"):
        compiled(*args)
    torch._dynamo.reset()
    return path


def without_policy(path, target):
    """The archive with its ``shapes`` key removed from the index (what an older writer wrote)."""
    data = hostile_corpus.rebuild(hostile_corpus.parse(path.read_bytes()), lambda index: index.pop("shapes"))
    target.write_bytes(data)
    return target


def eager_passes_at_backend_entry(path, script_folder):
    """``--backend eager`` on an Inductor recording: judged on the guards Dynamo made, it passes
    as recorded, in ``run`` and in the exported script alike."""
    eager = reproarchive.run(path, backend="eager")
    assert (eager.status, eager.exit_code, eager.unfaithful) == ("passed", 0, []), eager.to_dict()
    assert eager.shapes["guards_compared_at"] == "backend entry" and eager.shapes["guards_match"] is True
    reproarchive.export(path, script_folder)
    done = subprocess.run([sys.executable, str(script_folder / "repro.py"), "--backend", "eager"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0 and "no failure" in done.stdout, done.stderr[-2000:]
    assert "guards" not in done.stderr


def test_mark_dynamic_with_a_range_round_trips_and_the_replay_guards_equal_the_recorded(tmp_path):
    x, y = torch.randn(8, 3), torch.randn(8, 3)
    torch._dynamo.mark_dynamic(x, 0, min=2, max=64)
    path = capture(tmp_path / "a.tar.zst", two_sums, (x, y), FREE_SYMBOLS)
    policy = reproarchive.load(path).records.shapes
    assert "2 <= L['x'].size()[0] and L['x'].size()[0] <= 64" in policy.guards

    outcome = reproarchive.run(path)
    assert outcome.status == REPRODUCED, outcome.to_dict()
    assert outcome.shapes["guards_match"] is True
    assert sorted(outcome.shapes["guards_replayed"]) == sorted(policy.guards)
    assert not any("shape" in w for w in outcome.warnings), outcome.warnings

    static = reproarchive.run(without_policy(path, tmp_path / "static.tar.zst"))
    # no failure, but a static replay of a symbolic recording: no evidence either way (a pass,
    # exit 0, told `git bisect` "good" before), and the verdict says why
    assert (static.status, static.exit_code) == ("inconclusive", 125), static.to_dict()
    assert any("recording was symbolic" in w for w in static.unfaithful)
    assert any("recording was symbolic" in w and NOT_RECORDED in w for w in static.warnings)
    assert static.shapes == {"policy": "not recorded", "symbolic": True}
    text = invoke("run", tmp_path / "static.tar.zst")
    assert text.exit_code == 125 and text.output.startswith("INCONCLUSIVE") and "not as recorded:" in text.output


def test_a_pass_under_other_shape_guards_than_the_recorded_is_inconclusive(tmp_path):
    """A compile under other guards is another specialization: its pass says nothing about the
    recorded one (exit 125, never 0). The same archive with its guards as recorded passes."""
    x, y = torch.randn(8, 3), torch.randn(8, 3)
    torch._dynamo.mark_dynamic(x, 0, min=2, max=64)
    path = capture(tmp_path / "a.tar.zst", two_sums, (x, y), FREE_SYMBOLS)
    faithful = reproarchive.run(path, backend="eager")
    assert (faithful.status, faithful.exit_code, faithful.unfaithful) == ("passed", 0, []), faithful.to_dict()

    def another_bound(index):  # Dynamo's guards (eager, another backend, is judged on those) and the compile's
        for guards in (index["shapes"]["guards"], index["shapes"]["entry"]["guards"]):
            guards.append("L['x'].size()[0] <= 4")

    other = tmp_path / "other.tar.zst"
    other.write_bytes(hostile_corpus.rebuild(hostile_corpus.parse(path.read_bytes()), another_bound))
    outcome = reproarchive.run(other, backend="eager")
    assert outcome.shapes["guards_missing"] == ["L['x'].size()[0] <= 4"]
    assert (outcome.status, outcome.exit_code) == ("inconclusive", 125), outcome.to_dict()
    assert any("shape guards differ" in w for w in outcome.unfaithful)

    # the exported script judges the same way: 0 as recorded, 125 under other guards
    for archive, code in ((path, 0), (other, 125)):
        folder = tmp_path / f"{archive.stem}-script"
        reproarchive.export(archive, folder)
        done = subprocess.run([sys.executable, str(folder / "repro.py"), "--backend", "eager"], capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == code and "no failure" in done.stdout, (archive.name, done.stderr[-2000:])
    assert "inconclusive: not as recorded: the shape guards at backend entry differ" in done.stderr


def test_equal_sizes_marked_dynamic_one_by_one_replay_as_independent_symbols(tmp_path):
    x, y = torch.randn(8, 3), torch.randn(8, 3)
    torch._dynamo.mark_dynamic(x, 0)
    torch._dynamo.mark_dynamic(y, 0)
    path = capture(tmp_path / "a.tar.zst", two_sums, (x, y), FREE_SYMBOLS)
    repro = reproarchive.load(path)
    shapes = fakes_for(repro.records.shapes, list(repro.args), [n.name for n in repro.gm.graph.nodes
                                                                  if n.op == "placeholder"])
    sizes = [f.shape[0] for f in shapes.fakes if isinstance(f, torch.Tensor)]
    assert len(sizes) == 2 and all(isinstance(s, torch.SymInt) for s in sizes)
    assert sizes[0].node.expr != sizes[1].node.expr  # independent, though both are 8

    outcome = reproarchive.run(path)
    assert outcome.status == REPRODUCED and outcome.shapes["guards_match"] is True, outcome.to_dict()
    assert len(outcome.shapes["symbolic_dims"]) == 2


def test_dynamic_true_replay_hands_the_backend_symbolic_inputs_and_reproduces(tmp_path):
    x, y = torch.randn(7, 3), torch.randn(7, 3)
    path = capture(tmp_path / "a.tar.zst", two_sums, (x, y), FREE_SYMBOLS, dynamic=True)
    outcome = reproarchive.run(path)
    assert outcome.status == REPRODUCED, outcome.to_dict()
    assert "free symbols" in outcome.observed.message  # the backend saw symbolic shapes
    assert outcome.shapes["guards_match"] is True
    # static, the symbolic-only bug does not show: inconclusive, never a pass
    assert reproarchive.run(without_policy(path, tmp_path / "static.tar.zst")).status == "inconclusive"


def test_a_failure_that_needs_an_unbacked_symbol_reproduces_with_or_without_the_policy(tmp_path):
    """``nonzero()`` makes its unbacked symbol in the ShapeEnv Dynamo gives every backend, static
    or not: the replay gives one on every path, so the failure reproduces without the recorded
    policy too (the op makes the symbol, not an input), and only the guard comparison is lost."""
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        path = capture(tmp_path / "a.tar.zst", nonzero_view, (torch.tensor([1.0, 0.0, 2.0, 3.0]),), UNBACKED,
                       fullgraph=True)
    outcome = reproarchive.run(path)
    assert outcome.status == REPRODUCED, outcome.to_dict()
    assert outcome.shapes["unbacked"] and outcome.shapes["guards_match"] is True

    static = reproarchive.run(without_policy(path, tmp_path / "static.tar.zst"))
    assert static.status == REPRODUCED, static.to_dict()
    assert "guards_match" not in static.shapes and any(NOT_RECORDED in w for w in static.warnings)


def test_an_archive_recorded_static_replays_static_without_a_shape_warning(tmp_path):
    def fails_always(gm, example_inputs):
        raise RuntimeError("symbol-free failure")

    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    if "fails_always_TESTING" not in _COMPILER_FNS:
        register_backend(fails_always, name="fails_always_TESTING")
    path = capture(tmp_path / "a.tar.zst", two_sums, (torch.randn(4, 3), torch.randn(4, 3)), "fails_always_TESTING")
    outcome = reproarchive.run(path)
    assert outcome.status == REPRODUCED
    assert outcome.shapes["policy"] == "recorded" and outcome.shapes["symbolic"] is False
    assert not any("shape" in w for w in outcome.warnings), outcome.warnings


def test_a_failure_only_on_free_symbols_minifies_to_a_graph_that_is_still_symbolic(tmp_path):
    def wider(x, y):
        a = torch.relu(x) * 3
        b = torch.sigmoid(y).sum(1)
        return a.sum(0) + b.max()

    x, y = torch.randn(8, 3), torch.randn(5, 4)
    torch._dynamo.mark_dynamic(x, 0, min=2, max=64)
    path = capture(tmp_path / "a.tar.zst", wider, (x, y), FREE_SYMBOLS)
    report = reproarchive.minify_archive(path, tmp_path / "min.tar.zst", isolate=False, max_time=120)
    assert report.status == "minified", report.to_dict()
    small = reproarchive.load(report.output)
    policy = small.records.shapes
    assert policy is not None and any(d.kind == "backed" for r in policy.inputs for d in r.dims), policy
    assert len(small.gm.graph.nodes) < len(reproarchive.load(path).gm.graph.nodes)
    assert all(r.input < len(small.args) for r in policy.inputs)
    outcome = reproarchive.run(report.output)
    assert outcome.status == REPRODUCED and outcome.shapes["symbolic"], outcome.to_dict()
    assert outcome.shapes["guards_match"] is True


def test_a_candidate_keeps_only_the_recorded_relations_of_symbols_its_inputs_still_have(tmp_path):
    """A minifier candidate's policy (``codec.shapes.restricted``) keeps a ShapeEnv guard only
    while the inputs it kept still carry every symbol the guard names: a guard on a cut input's
    size cannot be re-created, and every replay of the candidate said so ("the name 's20' is
    not allowed")."""

    def branchy(x, y):
        return torch.relu(x).sum() + (y.sum() if y.shape[0] > 4 else y.mean())

    x, y = torch.randn(8, 3), torch.randn(6, 2)
    torch._dynamo.mark_dynamic(x, 0)
    torch._dynamo.mark_dynamic(y, 0)
    policy = reproarchive.load(capture(tmp_path / "a.tar.zst", branchy, (x, y), FREE_SYMBOLS)).records.shapes
    y_symbol = next(d.expr for r in policy.inputs if r.source == "L['y']" for d in r.dims if d.kind == "backed")
    assert any(y_symbol in g for g in policy.shape_guards), policy.shape_guards
    order = [f"in{i}" for i in range(max(r.input for r in policy.inputs) + 1)]
    # y and the size Dynamo passes beside it are cut
    with_y = {r.input for r in policy.inputs if any(d.expr == y_symbol for d in r.dims)}
    kept_x = [n for i, n in enumerate(order) if i not in with_y]
    assert any(y_symbol in g for g in restricted(policy, order, order).shape_guards)
    assert not any(y_symbol in g for g in restricted(policy, order, kept_x).shape_guards)
    # every guard here is Dynamo's (the backend added none): a candidate's count of them follows
    assert policy.entry.shape_guards == len(policy.shape_guards) > 0
    cut = restricted(policy, order, kept_x)
    assert cut.entry.shape_guards == len(cut.shape_guards) < len(policy.shape_guards)
    assert not any("L['y']" in g for g in cut.entry.guards) and any("L['y']" in g for g in policy.entry.guards)


@pytest.mark.slow  # inductor compiles four times, and a child Python runs the script
def test_a_bound_the_recorded_compile_added_is_for_the_replay_s_compile_to_add_again(tmp_path, monkeypatch):
    """Inductor bounds the batch size of a packed Linear (``s77 <= 4096``) while it compiles. The
    archive keeps that apart from the guards Dynamo made (``shapes.entry``), so a replay hands its
    compile only Dynamo's: Inductor must add the bound itself for the guards to match (before, the
    recorded bound was re-asserted first, and any bound came out "equal"), and another backend is
    judged on what it was handed, by ``run`` and the exported script alike (before: "equal" from
    ``run``, 125 from the script)."""
    monkeypatch.setattr(torch._inductor.config.cpp, "inject_relu_bug_TESTING_ONLY", "runtime_error")
    lin = torch.nn.Linear(8, 8)
    path = tmp_path / "a.tar.zst"
    compiled = torch.compile(lambda x: torch.relu(lin(x)) * 2, backend=reproarchive.capture("inductor", path=path),
                             dynamic=True)
    with pytest.raises(RuntimeError):
        compiled(torch.randn(6, 8))
    torch._dynamo.reset()
    monkeypatch.undo()  # the replay compiles with the recorded config
    policy = reproarchive.load(path).records.shapes
    bounded, dynamos = "2 <= L['x'].size()[0] and L['x'].size()[0] <= 4096", "2 <= L['x'].size()[0]"
    assert (list(policy.guards), list(policy.entry.guards)) == ([bounded], [dynamos])
    assert policy.shape_guards[policy.entry.shape_guards:] == ("s77 <= 4096",)

    outcome = reproarchive.run(path)
    assert outcome.status == REPRODUCED and outcome.shapes["guards_compared_at"] == "compile end", outcome.to_dict()
    assert outcome.shapes["guards_replayed"] == [bounded] and outcome.shapes["guards_match"] is True

    # a recording whose compile bounded the size otherwise: this compile does not, and it says so
    other = tmp_path / "other.tar.zst"
    other.write_bytes(hostile_corpus.rebuild(hostile_corpus.parse(path.read_bytes()), lambda index: index.update(
        shapes={**index["shapes"], "guards": [bounded.replace("4096", "1000")],
                "shape_guards": [*index["shapes"]["shape_guards"][:-1], "s77 <= 1000"]})))
    differs = reproarchive.run(other)
    assert differs.shapes["guards_match"] is False, differs.to_dict()
    assert differs.shapes["guards_missing"] == [bounded.replace("4096", "1000")]
    assert differs.shapes["guards_extra"] == [bounded]

    eager_passes_at_backend_entry(path, tmp_path / "script")


@pytest.mark.slow  # inductor compiles each candidate, and a child Python runs the script
def test_a_minified_inductor_graph_keeps_dynamo_s_guards_and_its_sizes_stay_symbolic(tmp_path, monkeypatch):
    """The minifier cuts the Linear whose batch size Inductor bounded, so a candidate's compile
    adds no bound: a cut graph is another program, judged on the guards Dynamo made (before,
    the minified archive replayed "guards DIFFER"). And a candidate that shrinks the symbolic
    batch size to 1 specializes it away (another program again): it is not taken, so the size
    stays at 2 or more, in the range the recording had (before: shrunk to 1)."""
    monkeypatch.setattr(torch._inductor.config.cpp, "inject_relu_bug_TESTING_ONLY", "runtime_error")
    lin = torch.nn.Linear(8, 8)
    path = tmp_path / "a.tar.zst"
    compiled = torch.compile(lambda x: torch.relu(x) * 2 + torch.sigmoid(lin(x)),
                             backend=reproarchive.capture("inductor", path=path), dynamic=True)
    with pytest.raises(RuntimeError):
        compiled(torch.randn(6, 8))
    torch._dynamo.reset()
    monkeypatch.undo()
    report = reproarchive.minify_archive(path, tmp_path / "min.tar.zst", isolate=False, max_time=300)
    assert report.status == "minified", report.to_dict()
    small = reproarchive.load(report.output)
    assert [n.target for n in small.gm.graph.nodes if n.op == "call_function"] == [torch.relu]
    (x,) = small.args
    assert x.shape[0] >= 2, x.shape
    outcome = reproarchive.run(report.output)
    assert outcome.status == REPRODUCED and outcome.unfaithful == [], outcome.to_dict()
    assert (outcome.shapes["guards_compared_at"], outcome.shapes["guards_match"]) == ("backend entry", True)
    assert outcome.shapes["guards_compared_because"] == "a graph cut from the recorded one"
    reproarchive.export(report.output, tmp_path / "script")  # the script judges it as run does
    done = subprocess.run([sys.executable, str(tmp_path / "script" / "repro.py")], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 1 and "guards" not in done.stderr, done.stderr[-2000:]


def _minified_to_a_symbolic_relu(tmp_path, fn):
    """``fn`` of an ``x`` marked dynamic, captured where the backend fails on a relu of a symbolic
    size, then minified: the minify report, the minified archive loaded, its one cut input's
    shape record; asserts the graph is the relu alone and that ``run`` reproduces it."""
    path = tmp_path / "a.tar.zst"
    x = torch.randn(6, 3)
    torch._dynamo.mark_dynamic(x, 0, min=2, max=64)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=reproarchive.capture(symbolic_backends.symbolic_relu_backend, path=path))
    with pytest.raises(Exception, match="a relu of a symbolic size"):
        compiled(x)
    torch._dynamo.reset()
    backend = symbolic_backends.SYMBOLIC_RELU
    report = reproarchive.minify_archive(path, tmp_path / "min.tar.zst", isolate=False, max_time=120, backend=backend)
    small = reproarchive.load(report.output)
    assert [n.target for n in small.gm.graph.nodes if n.op == "call_function"] == [torch.relu], report.code
    outcome = reproarchive.run(report.output, backend=backend, isolate=False)
    assert outcome.status == REPRODUCED and outcome.unfaithful == [], outcome.to_dict()
    (cut,) = small.records.shapes.inputs
    return report, small, cut


def test_a_value_cut_from_inside_the_graph_keeps_the_symbol_its_size_had(tmp_path):
    """The failure needs a symbolic compile (the backend fails on a relu of a symbolic size) and
    the relu's input is computed inside the graph (``x * 2 + 1`` of an ``x`` marked dynamic). Cut
    there, the candidate's input has ``x``'s symbol, range and origin, and no source of its own;
    before, it was static, the cut passed, and the minified graph kept the mul and the add."""
    report, small, cut = _minified_to_a_symbolic_relu(tmp_path, lambda x: torch.relu(x * 2 + 1).sum())
    assert [(d.kind, d.origin, d.min, d.max, d.source) for d in cut.dims] == [
        ("backed", "mark_dynamic", 2, 64, None), ("static", None, None, None, None)]
    assert small.args[0].shape[0] >= 2  # a size of 1 is static: the candidate that had it did not fail
    # the exported script compiles the cut input on its symbol too
    reproarchive.export(report.output, tmp_path / "script")
    done = subprocess.run([sys.executable, str(tmp_path / "script" / "repro.py"), "--backend",
                           symbolic_backends.SYMBOLIC_RELU], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert done.returncode == 1 and "a relu of a symbolic size" in done.stderr, done.stderr[-2000:]


def test_a_value_cut_from_inside_a_cond_branch_keeps_the_symbol_its_size_had(tmp_path):
    """As above, with the relu inside ``torch.cond``'s branch: the minifier inlines the branch and
    cuts there, and the cut input's symbol is read from the inlined graph it was cut from (before:
    static, so the ``t - 0.2`` before the relu stayed)."""
    _, _, cut = _minified_to_a_symbolic_relu(
        tmp_path, lambda x: torch.cond(x.sum() > -1e9, lambda t: torch.relu(t - 0.2) * 2, lambda t: t - 1, (x,)))
    assert [(d.kind, d.origin, d.source) for d in cut.dims] == [("backed", "mark_dynamic", None),
                                                                 ("static", None, None)]


def test_a_size_the_recorded_compile_fixed_is_handed_to_the_replay_as_its_symbol():
    """The compile added ``Eq(s77, 4)`` past the guards Dynamo made: Dynamo handed ``x``'s size as
    ``s77``, and so does a replay (its own compile fixes it again or not); a size Dynamo itself
    fixed stays a number. A symbol's name is matched as text, never used as a pattern."""
    from reproarchive.codec.shape_guards import as_handed
    from reproarchive.format.schema import ShapeDim, ShapeEntry, ShapeInput, ShapePolicy, ShapeSymbol

    def policy(made: int, name: str = "s77") -> ShapePolicy:
        dim = ShapeDim(kind="backed", size=4, expr="4", source="L['x'].size()[0]", min=2)
        return ShapePolicy(recorded_from="fake_tensors", inputs=(ShapeInput(input=0, kind="tensor", dims=(dim,)),),
                           symbols=(ShapeSymbol(name=name, kind="backed", hint=4, sources=("L['x'].size()[0]",),
                                                replaced_by="4"),),
                           shape_guards=(f"Eq({name}, 4)",), entry=ShapeEntry(guards=(), shape_guards=made))

    assert as_handed(policy(0)).inputs[0].dims[0].expr == "s77"
    assert as_handed(policy(1)).inputs[0].dims[0].expr == "4"  # Dynamo's own guard fixed it
    assert as_handed(policy(0, "(a+)+$")).inputs[0].dims[0].expr == "(a+)+$"


@pytest.mark.slow  # inductor compiles twice, and a child Python runs the script
def test_a_marked_dimension_keeps_the_range_dynamo_gave_it_not_the_compile_s_bound(tmp_path, monkeypatch):
    """``mark_dynamic(x, 0)`` with no range, on a Linear Inductor bounds (``<= 4096``): the
    dimension's recorded range is the compile's, and a replay re-imposes a marked dimension's
    range as its constraint. Taken from the compile's end, that bound reached a backend that never
    makes it: ``--backend eager`` rendered ``<= 4096`` at backend entry and said 125 where the bug
    is gone (and so did the script). The range is the one the guards at entry render."""
    monkeypatch.setattr(torch._inductor.config.cpp, "inject_relu_bug_TESTING_ONLY", "runtime_error")
    lin = torch.nn.Linear(8, 8)
    path = tmp_path / "a.tar.zst"
    x = torch.randn(6, 8)
    torch._dynamo.mark_dynamic(x, 0)
    compiled = torch.compile(lambda x: torch.relu(lin(x)) * 2, backend=reproarchive.capture("inductor", path=path))
    with pytest.raises(RuntimeError):
        compiled(x)
    torch._dynamo.reset()
    monkeypatch.undo()
    policy = reproarchive.load(path).records.shapes
    dim = next(r for r in policy.inputs if r.source == "L['x']").dims[0]
    assert (dim.origin, dim.max, list(policy.entry.guards)) == ("mark_dynamic", 4096, ["2 <= L['x'].size()[0]"])

    outcome = reproarchive.run(path)
    assert outcome.status == REPRODUCED and outcome.shapes["guards_match"] is True, outcome.to_dict()
    eager_passes_at_backend_entry(path, tmp_path / "script")


def test_a_range_at_entry_is_read_from_the_rendered_guards_as_text():
    from reproarchive.codec.shape_guards import entry_range

    x, y = "L['x'].size()[0]", "L['y'].size()[0]"
    assert entry_range([f"2 <= {x}"], [x]) == (2, None)
    assert entry_range([f"3 <= {x} and {x} <= 100"], [x]) == (3, 100)
    assert entry_range([f"3 <= {x} <= 100"], [x]) == (3, 100)  # chained, as some releases render it
    assert entry_range([f"2 <= {y} and {y} <= 64"], [x, y]) == (2, 64)  # a duck-sized symbol, named by y
    assert entry_range([f"{x} <= 10*{y}", f"12 <= {x}"], [x]) == (12, None)  # not a bound by a number
    assert entry_range([f"2 <= {x}"], ["L['x'].size()[0"]) == (None, None)  # a source is text, not a pattern
    assert entry_range([f"2 <= {x}1"], [x]) == (None, None)  # another source that starts alike
    assert entry_range([], [None]) == (None, None)


@pytest.mark.parametrize("fullgraph", [False, True])
def test_a_static_replay_compiles_in_a_shape_env_made_as_dynamo_made_it(tmp_path, fullgraph, monkeypatch):
    """Inductor lowers a static ``scan`` into a ``while_loop`` whose body calls ``.item()`` on a
    fake tensor: in Dynamo's ShapeEnv (no ``capture_scalar_outputs``) that raises
    ``DataDependentOutputException``, the program's real failure. A static replay made a bare
    ShapeEnv, which turns ``.item()`` into an unbacked symbol: the compile went past the failure,
    and ``run`` said PASSED (exit 0) on an archive of a compile that fails. With ``fullgraph=True``
    Dynamo's ShapeEnv allows scalar outputs, the compile goes on to Inductor's C++ relu bug, and
    the replay's ShapeEnv must allow them too (the recorded settings, not the config's)."""
    from torch._higher_order_ops.scan import scan

    def scanned(x):
        def step(carry, t):
            return carry + torch.relu(t), carry * 1
        return scan(step, torch.zeros(x.shape[1]), x)[0]

    expected = "CppCompileError" if fullgraph else "DataDependentOutputException"
    if fullgraph:
        monkeypatch.setattr(torch._inductor.config.cpp, "inject_relu_bug_TESTING_ONLY", "compile_error")
    path = tmp_path / "scan.tar.zst"
    compiled = torch.compile(scanned, backend=reproarchive.capture("inductor", path=path), fullgraph=fullgraph)
    try:
        compiled(torch.randn(5, 8))
    except Exception as exc:  # noqa: BLE001 - the program's failure, whichever this torch raises
        if expected not in f"{type(exc).__name__}: {exc}":
            raise
    else:
        pytest.skip("this torch's Inductor lowers a static scan without a data-dependent .item()")
    torch._dynamo.reset()
    monkeypatch.undo()  # the replay applies the recorded config
    repro = reproarchive.load(path)
    assert repro.records.shapes.settings["allow_scalar_outputs"] is fullgraph
    outcome = reproarchive.run(path)
    assert (outcome.status, outcome.exit_code) == (REPRODUCED, 1), outcome.to_dict()
    assert expected in outcome.observed.exception_type
