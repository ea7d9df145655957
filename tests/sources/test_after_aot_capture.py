"""``capture --after aot`` on a BERT-style training step with Inductor's C++ compile-error
injector: the archive holds the graph Inductor was handed with the program's real inputs and
its CppCompileError (Inductor's door, ``sources.program.after_aot_hook``), and PyTorch's data-less dump
of the same failure, packed alone, records the failure it learned on generated data as such,
reaching the real compile error instead of an IndexError from generated ids.

One capture (one failing Inductor compile) serves every test; each replay is one more."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import reproarchive
from support import dump_programs as progs
from support.cli import invoke
from support.custom_op_programs import refusing_library
from support.shared_fixture import built_once

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """The one capture, once for the whole run (``built_once``): its archive and PyTorch's kept
    dump are read-only; they live in the run's temporary root, which pytest removes."""

    def build(folder: Path) -> tuple[Path, dict]:
        (folder / "prog.py").write_text(progs.bert_step_program("compile_error"))
        out = folder / "archives"
        out.mkdir()
        cwd = os.getcwd()
        os.chdir(folder)
        try:
            result = invoke("capture", "--after", "aot", "--keep-dumps", "--json", "-o", out, "--",
                            sys.executable, "prog.py")
        finally:
            os.chdir(cwd)
        report = json.loads(result.stdout)
        if report.get("dumps_kept"):  # inside the run's folder, so that pytest removes it with the rest
            kept = Path(report["dumps_kept"])
            shutil.move(str(kept), folder / kept.name)
            report["dumps_kept"] = str(folder / kept.name)
        return folder, report

    return built_once(tmp_path_factory, "after_aot_bert_capture", build,
                      dump=lambda v: [str(v[0]), v[1]], load=lambda v: (Path(v[0]), v[1]))


def test_the_archive_holds_the_real_inputs_and_the_programs_compile_error(captured):
    folder, report = captured
    assert report["exit_code"] == 1
    assert report["dumps_found"] == 1 and report["errors"] == []
    (packed,) = report["archives"]  # PyTorch's data-less dump of the same failure is left out
    assert packed["kind"] == "capture (after_aot)"
    assert packed["inputs"]["absent"] == 0 and packed["inputs"]["real"] == packed["inputs"]["total"] > 20
    assert packed["failure"]["stage"] == "compile"
    assert packed["failure"]["exception_type"].endswith("CppCompileError")
    assert packed["replay"]["failure_from"] == "program"
    repro = reproarchive.load(packed["archive"])
    assert repro.records.graph_kind == "after_aot" and repro.records.backend == "inductor"
    assert set(repro.fidelity) <= {"real"}
    saved = torch.load(folder / "inputs.pt")
    ints = [a for a in repro.args if isinstance(a, torch.Tensor) and a.dtype == torch.int64]
    assert any(torch.equal(a, saved["ids"]) for a in ints)  # the program's own token ids
    assert any(torch.equal(a, saved["labels"]) for a in ints)


def test_run_reproduces_the_compile_error(captured):
    _, report = captured
    result = invoke("run", "--json", report["archives"][0]["archive"])
    outcome = json.loads(result.stdout)
    assert result.exit_code == 1, result.output
    assert outcome["status"] == "reproduced"
    assert outcome["observed"]["exception_type"].endswith("CppCompileError")


def test_the_data_less_dump_packed_alone_says_its_failure_came_from_generated_data(captured, tmp_path):
    _, report = captured
    dump = Path(report["dumps_kept"])
    result = invoke("pack", "--json", dump, "-o", tmp_path / "dump.tar.zst")
    packed = json.loads(result.stdout)
    assert result.exit_code == 0, result.output
    assert packed["inputs"]["real"] == 0 and packed["inputs"]["absent"] == packed["inputs"]["total"]
    # generated ids stay inside the token-type table and the classes: the replay reaches the
    # program's compile error, and the archive says it was learned on generated data
    assert packed["failure"]["exception_type"].endswith("CppCompileError"), packed["failure"]
    assert packed["replay"]["failure_from"] == "replay on generated data"
    assert any("generated input(s)" in w for w in packed["warnings"])
    info = reproarchive.inspect(packed["archive"]).to_plain()
    assert info["source"]["replay"]["failure_from"] == "replay on generated data"
    # the dropout's random draws stay ops of the graph, as in the dump, none frozen into a
    # constant, and the index demands reach past them (the class targets stay in range above);
    # the capture also recorded the generator's state, which a dump cannot hold
    assert info["randomness"] == "random ops: prims::inductor_seeds; RNG state not recorded"
    captured_randomness = reproarchive.inspect(report["archives"][0]["archive"]).randomness
    assert captured_randomness == "random ops: prims::inductor_seeds; RNG state recorded (cpu)"
    assert not [n for n in reproarchive.load(packed["archive"]).gm.graph.nodes if n.op == "get_attr"]


def test_export_reproduces_the_compile_error(captured, tmp_path):
    _, report = captured
    result = invoke("export", report["archives"][0]["archive"], "-o", tmp_path / "out")
    assert result.exit_code == 0, result.output
    script = tmp_path / "out" / "repro.py"
    assert "GENERATED" not in script.read_text()  # every input is the program's own data
    done = subprocess.run([sys.executable, "-I", str(script)], cwd=tmp_path, capture_output=True, text=True,
                          check=False,
                          timeout=600)
    assert done.returncode != 0 and "CppCompileError" in done.stdout + done.stderr, done.stderr[-2000:]


def _captured(tmp_path: Path, program: str, after: str = "aot") -> tuple[dict, Path]:
    """``capture --after AFTER -- python prog.py`` of ``program`` (its text), as a user runs it,
    with the program failing as it does on its own: the written archive's report and path."""
    (tmp_path / "prog.py").write_text(program)
    result = invoke("capture", "--after", after, "--json", "-o", tmp_path / "out", "--", sys.executable,
                    tmp_path / "prog.py")
    report = json.loads(result.stdout)
    assert result.exit_code == 1 and report["errors"] == [], result.output
    (written,) = report["archives"]
    return written, tmp_path / "out" / Path(written["archive"]).name


WHILE_LOOP_UNDER_INDUCTOR = """
import torch
from torch._higher_order_ops.while_loop import while_loop
torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY = "compile_error"

@torch.compile(backend="inductor", fullgraph=True)
def f(x):
    return while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, torch.relu(x) + 1), (torch.tensor(0), x))[1]

f(torch.randn(8, 16))
"""


def test_a_while_loop_after_aot_is_captured_replayed_and_exported_under_inductor(tmp_path):
    """Inductor fails inside a ``while_loop`` body after AOTAutograd. PyTorch's after_aot dump
    of it is not valid Python (``self.while_loop_body_graph_0 = <lambda>()``) and ``capture``
    stopped on it with an unexpected SyntaxError (exit 70); replayed through Inductor's inner
    compiler without a ShapeEnv, the archive gave a DIFFERENT FAILURE ("'NoneType' object has no
    attribute 'ignore_fresh_unbacked_symbols'"), in ``run`` and in the exported script alike."""
    _, archive = _captured(tmp_path, WHILE_LOOP_UNDER_INDUCTOR)
    repro = reproarchive.load(archive)
    assert repro.records.source.graph_kind == "after_aot" and repro.fidelity == ["real"]
    assert "while_loop" in {getattr(n.target, "__name__", "") for n in repro.gm.graph.nodes}
    outcome = reproarchive.run(archive, isolate=False)
    assert (outcome.status, outcome.exit_code) == ("reproduced", 1), outcome.to_dict()
    exported = invoke("export", archive, "-o", tmp_path / "x")
    assert exported.exit_code == 0, exported.output
    done = subprocess.run([sys.executable, str(tmp_path / "x" / "repro.py")], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert done.returncode != 0 and "CppCompileError" in done.stderr, done.stderr[-2000:]


FLEX_ATTENTION_UNDER_INDUCTOR = """
import torch
from torch.nn.attention.flex_attention import flex_attention
torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY = "compile_error"

@torch.compile(backend="inductor", fullgraph=True)
def f(q):
    return flex_attention(q, q, q, score_mod=lambda s, b, h, m, n: torch.relu(s))

f(torch.randn(1, 1, 16, 16))
"""


def test_flex_attention_after_aot_replays_inductor_s_own_failure(tmp_path):
    """Inductor fails in flex_attention's score_mod after AOTAutograd. The replay re-traces the
    graph for Inductor's inner compiler, which gave flex_attention's unused third output a
    ``getitem`` that Inductor's lowering cannot give: a DIFFERENT FAILURE (``IndexError: tuple
    index out of range``)."""
    _, archive = _captured(tmp_path, FLEX_ATTENTION_UNDER_INDUCTOR)
    outcome = reproarchive.run(archive, isolate=False)
    assert (outcome.status, outcome.exit_code) == ("reproduced", 1), outcome.to_dict()
    assert outcome.observed.exception_type.endswith("CppCompileError")


DYNAMIC_UNDER_INDUCTOR = """
import torch
torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY = "compile_error"

def f(a, b):
    return torch.relu(a @ b + 1).sum(1)

torch.compile(f, backend="inductor", dynamic=True)(torch.randn(3, 4), torch.randn(4, 5))
"""


def test_a_dynamic_graph_after_aot_compiles_on_its_recorded_symbols_in_run_and_export(tmp_path):
    """Inductor fails on a ``dynamic=True`` graph after AOTAutograd. The replay compiled it
    re-traced on the real inputs with static shapes and said "not applied": a bug of the
    symbolic compile would have passed. Now Inductor's inner compiler gets the graph on fake
    values made with the recorded symbols (``s97``, ``s98`` ...), as AOTAutograd handed it, and
    the replay's ShapeEnv is checked against the recording; the exported script does the same."""
    _, archive = _captured(tmp_path, DYNAMIC_UNDER_INDUCTOR)
    recorded = reproarchive.inspect(archive).to_plain()["shapes"]
    symbols = {d["expr"] for r in recorded["inputs"] for d in r["dims"] if d["kind"] == "backed"}
    assert len(symbols) == 3, recorded
    outcome = reproarchive.run(archive, isolate=False)
    assert (outcome.status, outcome.exit_code) == ("reproduced", 1), outcome.to_dict()
    shapes = outcome.to_dict()["shapes"]
    assert shapes["symbolic"] and not shapes.get("problems"), shapes
    assert shapes["guards_match"] is True, shapes
    assert not [w for w in outcome.warnings if "shape" in w], outcome.warnings
    exported = invoke("export", archive, "-o", tmp_path / "x")
    assert exported.exit_code == 0, exported.output
    script = (tmp_path / "x" / "repro.py").read_text()
    assert all(s in script for s in symbols)
    done = subprocess.run([sys.executable, str(tmp_path / "x" / "repro.py")], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert done.returncode != 0 and "CppCompileError" in done.stderr, done.stderr[-2000:]
    assert "shape guards differ" not in done.stderr, done.stderr[-2000:]


UNBACKED_UNDER_INDUCTOR = """
import torch
torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY = "compile_error"
x = torch.randn(6, 3)
torch._dynamo.decorators.mark_unbacked(x, 0)
torch.compile(lambda x, y: (torch.relu(x) @ y).sum(0) * 2, backend="inductor")(x, torch.randn(3, 5))
"""


@pytest.mark.parametrize("after", ["dynamo", "aot"])
def test_a_mark_unbacked_input_is_captured_with_its_size_and_replays_on_its_unbacked_symbol(after, tmp_path):
    """Dynamo passes the size of a ``mark_unbacked`` dimension as an unbacked symbol ``u0``, with
    no value. PyTorch's after_dynamo dump writes it as None (its pack failed: "input 0 is a
    none"); its after_aot dump names ``u0`` without defining it (NameError); Inductor's door
    found no input to match and wrote nothing. Now both doors store the run's own size (6, from
    the tensor that has it), and the replay compiles on an unbacked symbol again; PyTorch's
    dump, packed alone, is refused in one line."""
    written, archive = _captured(tmp_path, UNBACKED_UNDER_INDUCTOR, after)
    assert written["inputs"]["absent"] == 0 and written["inputs"]["real"] == 2, written
    assert 6 in reproarchive.load(archive).args  # the size itself, from the real tensor
    outcome = reproarchive.run(archive, isolate=False)
    assert (outcome.status, outcome.exit_code) == ("reproduced", 1), outcome.to_dict()
    assert outcome.to_dict()["shapes"]["unbacked"] == ["u0"] and not outcome.to_dict()["shapes"]["problems"]
    assert not [w for w in outcome.warnings if "shape" in w], outcome.warnings
    if after == "dynamo":  # PyTorch's own dump of the program, as TORCHDYNAMO_REPRO_AFTER writes it
        launcher = progs.make_dump(tmp_path / "dump", UNBACKED_UNDER_INDUCTOR, after="dynamo", level=2)
        refused = invoke("pack", launcher, "-o", tmp_path / "dump.tar.zst")
        assert refused.exit_code == 2 and refused.stderr.count("\n") == 1, refused.output
        assert "has no value" in refused.stderr and not (tmp_path / "dump.tar.zst").exists()


RUNTIME_ERROR_AFTER_AOT = """
import torch
torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY = "runtime_error"
torch.manual_seed(0)
lin = torch.nn.Linear(4, 4)

@torch.compile(backend="inductor", dynamic=True)
def f(x):
    return torch.relu(torch.nn.functional.dropout(lin(x), 0.5, training=True) * 2)

f(torch.randn(8, 4))
"""


@pytest.mark.parametrize("after", ["aot", "dynamo"])
def test_a_failing_first_call_is_kept_from_the_spool_with_its_inputs_and_generators(tmp_path, after):
    """Inductor's code fails in the first call of a ``dynamic=True`` graph that draws dropout.
    PyTorch's after_aot hook dumps a failing call with fake copies of its inputs, and for this
    graph not at all: ``capture --after aot`` left no archive. Its after_dynamo dump (the default
    route) holds the inputs but not the generator states, so the archive said "RNG state not
    recorded" and learnt its failure from a replay. The crash guard's spool holds the call's
    real inputs and generator states from before it; the entry is completed into the archive (a
    host draft's forked writer is waited for), with the program's own exception and the shape
    guards as the compile left them (Inductor bounds the packed Linear's batch size), beside those
    Dynamo made, and replays the same numbers under the same guards, which its own compile adds.
    The dump it stands for is not packed as a second archive."""
    written, archive = _captured(tmp_path, RUNTIME_ERROR_AFTER_AOT, after)
    assert written["inputs"]["absent"] == 0 and written["inputs"]["real"] == 3, written  # x, weight, bias
    policy = reproarchive.load(archive).records.shapes
    bounded = "2 <= L['x'].size()[0] and L['x'].size()[0] <= 4096"
    assert bounded in policy.guards and "2 <= L['x'].size()[0]" in policy.entry.guards, policy
    assert written["failure"]["stage"] == "forward", written
    assert written["replay"]["failure_from"] == "program", written
    assert reproarchive.verify(archive).randomness == "random ops: dropout; RNG state recorded (cpu)"
    outcome = reproarchive.run(archive, isolate=False)
    assert (outcome.status, outcome.exit_code) == ("reproduced", 1), outcome.to_dict()
    assert "the recorded RNG state (cpu) is restored" in outcome.randomness
    assert outcome.shapes["guards_match"] is True, outcome.shapes


LATER_CALL_AFTER_AOT = """
import torch

def f(x, i):
    return torch.relu(x[i]) * 2

c = torch.compile(f, dynamic=True)
for n, idx in ((8, [0, 1]), (6, [2, 3]), (7, [5, 100])):  # the third call indexes out of bounds
    c(torch.randn(n, 4), torch.tensor(idx))
"""


def test_a_later_call_that_fails_after_aot_is_archived_with_its_inputs_even_from_a_warm_cache(tmp_path):
    """The third call of a ``dynamic=True`` graph fails in Inductor's code. PyTorch's after_aot
    hook dumps it with fake copies of its inputs: the archive held no data and its replay passed
    ("failure: unknown"). With AOTAutograd's cache warm (the program ran before), neither the
    hook nor Inductor's door saw the graph, and nothing was written at all. Now the call is
    archived at Inductor's door with the inputs it was called with and its own sizes."""
    (tmp_path / "prog.py").write_text(LATER_CALL_AFTER_AOT)
    warm = subprocess.run([sys.executable, str(tmp_path / "prog.py")], capture_output=True, text=True, timeout=300)
    assert warm.returncode == 1 and "index out of bounds" in warm.stderr, warm.stderr[-2000:]
    written, archive = _captured(tmp_path, LATER_CALL_AFTER_AOT)
    assert written["inputs"]["absent"] == 0 and written["inputs"]["real"] == 2, written
    assert written["failure"]["stage"] == "forward" and "index out of bounds" in written["failure"]["message"]
    records = reproarchive.load(archive).records
    assert records.source.real_inputs == 5 and "call 3" in records.source.door, records.source  # sizes too
    assert [r.dims[0].size for r in records.shapes.inputs if r.kind == "tensor"] == [7, 2]  # the third call's
    outcome = reproarchive.run(archive, isolate=False)
    assert (outcome.status, outcome.exit_code) == ("reproduced", 1), outcome.to_dict()
    assert outcome.shapes["guards_match"] is True and outcome.unfaithful == [], outcome.to_dict()




def test_a_later_call_s_dump_is_replayed_at_pack_time_as_run_replays_it(tmp_path):
    """The same third call under the default route: PyTorch's after_dynamo dump of it, packed.
    The replay that learns its failure at pack time compiled the call's sizes statically (``<
    7L``), while ``run`` compiles on the recorded symbols (``< ks2``): ``run`` answered DIFFERENT
    FAILURE (exit 3) for the program's own failure. The pack-time replay now takes the archive's
    shape policy, as ``run`` does."""
    written, archive = _captured(tmp_path, LATER_CALL_AFTER_AOT, "dynamo")
    assert written["replay"]["failure_from"] == "replay", written
    outcome = reproarchive.run(archive, isolate=False)
    assert (outcome.status, outcome.exit_code) == ("reproduced", 1), outcome.to_dict()
    assert outcome.shapes["guards_match"] is True and outcome.unfaithful == [], outcome.to_dict()

RANDOM_LATER_CALL = """
import sys, torch
import reproarchive
torch.manual_seed(0)

def f(x, i):
    return torch.nn.functional.dropout(torch.relu(x[i]), 0.5, training=True) * 2

c = torch.compile(f, dynamic=True{backend})
states = []
try:
    for n, idx in ((8, [0, 1]), (6, [2, 3]), (7, [5, 100])):  # the third call indexes out of bounds
        x, i = torch.randn(n, 4), torch.tensor(idx)
        states.append(torch.get_rng_state())
        c(x, i)
finally:
    torch.save(states, {states!r})
"""


@pytest.mark.parametrize("route", ["dynamo", "aot", "backend"])
def test_a_later_call_that_draws_random_numbers_keeps_the_generator_states_it_started_from(tmp_path, route):
    """The third call of a ``dynamic=True`` graph that draws dropout fails in Inductor's code.
    Written after the call failed, its archive held the generator states the call left, as if it
    had begun with them (the in-process backend, Inductor's door), or none at all (PyTorch's
    after_dynamo dump, whose replay at pack time also compiled the call's sizes statically, so
    ``run`` answered DIFFERENT FAILURE: ``< 7L`` against ``< ks2``). Now every route reads the
    states before each call of a graph that draws, and the archive holds those."""
    states = tmp_path / "states.pt"
    if route == "backend":  # reproarchive.capture in the program
        out = tmp_path / "out"
        (tmp_path / "prog.py").write_text(RANDOM_LATER_CALL.format(
            backend=f", backend=reproarchive.capture('inductor', path={str(out)!r})", states=str(states)))
        done = subprocess.run([sys.executable, str(tmp_path / "prog.py")], capture_output=True, text=True, timeout=300)
        assert done.returncode == 1 and "index out of bounds" in done.stderr, done.stderr[-2000:]
        (archive,) = out.glob("*.tar.zst")
    else:
        written, archive = _captured(tmp_path, RANDOM_LATER_CALL.format(backend="", states=str(states)), route)
        assert written["replay"]["failure_from"] == "program", written
    repro = reproarchive.load(archive)
    assert "index out of bounds" in repro.records.failure.message and repro.records.failure.stage == "forward"
    assert torch.equal(repro.rng_states["cpu"], torch.load(states)[-1])  # the third call's, not what it left
    outcome = reproarchive.run(archive, isolate=False)
    assert (outcome.status, outcome.exit_code) == ("reproduced", 1), outcome.to_dict()
    assert outcome.unfaithful == [] and "restored" in outcome.randomness, outcome.to_dict()


GRADIENT_CHECK_OP = refusing_library("bwcase") + """
@torch.library.custom_op("bwcase::scaled", mutates_args=())
def scaled(x: torch.Tensor) -> torch.Tensor:
    return x * 2

scaled.register_fake(lambda x: torch.empty_like(x))
scaled.register_autograd(lambda ctx, g: checked(g) * 2)
"""

BACKWARD_LATER_CALL = """
import torch, bwcase_ops
f = torch.compile(lambda x: torch.relu(bwcase_ops.scaled(x)).sum())
x = torch.randn(8, requires_grad=True)
for scale in (1.0, 2.0, 100.0):  # the third backward gets a gradient over 10
    (f(x) * scale).backward()
"""


def test_a_failing_backward_after_aot_is_archived_and_a_pass_on_its_freed_inputs_is_no_evidence(tmp_path,
                                                                                                monkeypatch):
    """The third call of a compiled backward fails (a custom op in it refuses the gradient).
    AOTAutograd frees the backward's inputs as it calls it, so Inductor's door archives the
    graph with the inputs it could still read and the rest absent. A replay on generated values
    in their place that passes said PASSED (exit 0) for a failure it never tried. (The capture's
    report loaded the archive here, which stood in for the op: ``imports`` withdraws that
    stand-in, which made the import fail before.)"""
    (tmp_path / "bwcase_ops.py").write_text(GRADIENT_CHECK_OP)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    written, archive = _captured(tmp_path, BACKWARD_LATER_CALL)
    assert "over 10" in written["failure"]["message"] and written["inputs"]["absent"] >= 1, written
    assert "call 3" in reproarchive.load(archive).records.source.door
    monkeypatch.syspath_prepend(str(tmp_path))
    outcome = reproarchive.run(archive, isolate=False, imports=("bwcase_ops",))
    assert (outcome.status, outcome.exit_code) == ("inconclusive", 125), outcome.to_dict()
    assert any("held generated values, not the failing run's data" in w for w in outcome.unfaithful)
    # the exported script judges so too
    exported = invoke("export", archive, "-o", tmp_path / "script", "--import", "bwcase_ops")
    assert exported.exit_code == 0, exported.output
    done = subprocess.run([sys.executable, str(tmp_path / "script" / "repro.py")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 125 and "held generated values" in done.stderr, done.stderr[-2000:]


CUSTOM_OP_DYNAMIC = """
import torch
torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY = "compile_error"

@torch.library.custom_op("aotcase::shifted", mutates_args=())
def shifted(x: torch.Tensor) -> torch.Tensor:
    return x - 0.5

shifted.register_fake(lambda x: torch.empty_like(x))
torch.compile(lambda x: torch.relu(shifted(x) * 2), dynamic=True)(torch.randn(8, 3))
"""


def test_a_custom_op_in_a_symbolic_compile_is_stood_in_for_on_its_symbols_in_run_and_export(tmp_path):
    """A ``dynamic=True`` graph that calls the program's own custom op, replayed where the op is
    not registered: the stand-in's fake implementation matched recorded calls on concrete
    shapes and missed on ``[s77, 3]`` (StandInMiss, a DIFFERENT FAILURE), in ``run`` and in the
    exported script. It now matches on the sizes' hints and keeps the output's size symbolic."""
    _, archive = _captured(tmp_path, CUSTOM_OP_DYNAMIC)
    outcome = reproarchive.run(archive, isolate=False)
    assert (outcome.status, outcome.exit_code) == ("reproduced", 1), outcome.to_dict()
    assert outcome.shapes["symbolic"] and outcome.shapes["guards_match"] is True, outcome.shapes
    exported = invoke("export", archive, "-o", tmp_path / "x")
    assert exported.exit_code == 0, exported.output
    done = subprocess.run([sys.executable, str(tmp_path / "x" / "repro.py")], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert done.returncode != 0 and "CppCompileError" in done.stderr, done.stderr[-2000:]
    assert "no call with inputs" not in done.stderr
