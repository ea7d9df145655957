"""Archives from real TORCH_TRACE logs: ls, pack, verify, load, run, minify, export.

The logs come from small failing jobs run once per session with TORCH_TRACE set
(``support/trace_programs.py``, fixture ``trace_jobs`` in conftest.py). Every compile of every
log is packed once per module (``packed``), with the options a user would give for failures
the log cannot record (runtime and accuracy failures: ``--backend``, ``--accuracy``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import reproarchive
from reproarchive.cli import main
from reproarchive.errors import SourceError
from reproarchive.format.schema import TraceSource
from reproarchive.minifier.driver import minify_archive
from reproarchive.sources.pack_report import PackReport
from reproarchive.sources.trace.pack_trace import TracePackResult, list_trace, pack_trace
from reproarchive.testing.sources import Captured, SourceTests
from support.shared_fixture import built_once
from support.trace_programs import recorded_on_cuda

# What a user passes for each job (the log names a backend only when it failed).
PACK_OPTIONS = {
    "compile_error": {},
    "runtime_error": {"backend": "relu_runtime_error_TESTING_ONLY"},
    "accuracy": {"backend": "relu_accuracy_error_TESTING_ONLY", "accuracy": True},
    "graph_break": {},
    "dynamic": {},
    "inductor_real": {},
    "hop_inductor": {},
}
# compile id -> (status in the log, stage recorded in the archive: from the log or the replay)
EXPECTED = {
    "compile_error": {"0/0": ("failed", "compile")},
    "runtime_error": {"0/0": ("ok", "forward")},
    "accuracy": {"0/0": ("ok", "accuracy")},
    "graph_break": {"0/0": ("ok", None), "1/0": ("failed", "compile")},
    "dynamic": {"0/0": ("failed", "compile"), "0/1": ("failed", "compile"), "0/2": ("failed", "compile")},
    "inductor_real": {"0/0": ("failed", "compile")},
    "hop_inductor": {"0/0": ("failed", "compile")},
}


@pytest.fixture(scope="module")
def packed_results(trace_jobs, tmp_path_factory) -> dict[str, TracePackResult]:
    """job -> what ``pack_trace`` reported, every compile of every log packed (``--all``); once
    for the whole run (``built_once``): the archives are read-only."""

    def build(root: Path) -> dict[str, TracePackResult]:
        out = {}
        for name, (_, trace) in trace_jobs.items():
            result = pack_trace(trace, root / name, all_compiles=True, **PACK_OPTIONS[name])
            assert not result.skipped, result.skipped
            out[name] = result
        return out

    def dump(results: dict[str, TracePackResult]) -> dict:
        return {name: {"source": str(r.source), "trace_kind": r.trace_kind, "warnings": r.warnings,
                       "packed": [p.to_plain() for p in r.packed]} for name, r in results.items()}

    def load(data: dict) -> dict[str, TracePackResult]:
        return {name: TracePackResult(source=Path(r["source"]), trace_kind=r["trace_kind"], skipped=[],
                                      warnings=r["warnings"], packed=[PackReport.from_plain(p) for p in r["packed"]])
                for name, r in data.items()}

    return built_once(tmp_path_factory, "packed_results", build, dump, load)


@pytest.fixture(scope="module")
def packed(packed_results) -> dict[str, dict[str, Path]]:
    """job -> compile id -> archive."""
    return {name: {p.compile_id: p.archive for p in result.packed} for name, result in packed_results.items()}


class TestTraceSource(SourceTests):
    """``pack LOG`` of a compile that failed in the log (PyTorch's bug injector)."""

    source_record = TraceSource
    stage = "compile"
    filled = ("backend", "system", "failure", "source")  # the log of a Dynamo graph holds no config

    @pytest.fixture(scope="module")
    def captured(self, packed_results, trace_jobs) -> Captured:
        reports = packed_results["compile_error"].packed
        return Captured(archives=[r.archive for r in reports], reports=reports, folders=trace_jobs["compile_error"])


def test_ls_lists_every_compile_with_its_status(trace_jobs):
    for name, (_, trace) in trace_jobs.items():
        listing = list_trace(trace)
        got = {r["compile_id"]: r for r in listing["compiles"]}
        assert {cid: r["status"] for cid, r in got.items()} == {cid: s for cid, (s, _) in EXPECTED[name].items()}, name
        assert all(r["ops"] and r["ops"] > 0 for r in got.values()), name
        assert listing["warnings"] == []
    rows = {r["compile_id"]: r for r in list_trace(trace_jobs["graph_break"][1])["compiles"]}
    assert rows["0/0"]["frame"]["name"] == "f"
    assert rows["1/0"]["frame"]["name"].startswith("torch_dynamo_resume_in_f")
    assert rows["1/0"]["fail_reason"].startswith("ReluCompileError")


def test_ls_cli_text_json_and_errors(trace_jobs, tmp_path):
    trace = trace_jobs["dynamic"][1]
    res = CliRunner().invoke(main, ["ls", str(trace)])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["COMPILE", "FRAME", "OPS", "STATUS", "REASON"]
    assert [ln.split()[0] for ln in lines[1:]] == ["[0/0]", "[0/1]", "[0/2]"]
    assert "ReluCompileError (backend relu_compile_error_TESTING_ONLY)" in lines[1]
    res = CliRunner().invoke(main, ["ls", "--json", str(trace)])
    assert [r["compile_id"] for r in json.loads(res.stdout)["compiles"]] == ["0/0", "0/1", "0/2"]
    other = tmp_path / "notes.txt"
    other.write_text("not a log\n")
    for args in (["ls", str(other)], ["ls", "--json", str(other)], ["ls", str(tmp_path / "missing")]):
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 4
        assert res.stderr.count("\n") == 1 and res.stderr.startswith("error: ")
        assert "Traceback" not in res.output
    assert json.loads(CliRunner().invoke(main, ["ls", "--json", str(other)]).stdout)["exit_code"] == 4


def test_every_compile_packs_verifies_and_loads(trace_jobs, packed):
    for name, archives in packed.items():
        assert set(archives) == set(EXPECTED[name]), name
        for cid, path in archives.items():
            assert path.name == f"repro-{cid.replace('/', '_')}.tar.zst"
            reproarchive.verify(path, progress=False)
            repro = reproarchive.load(path, device="cpu")
            info = reproarchive.inspect(path).to_plain()
            src = info["source"]
            assert src["kind"] == "torch_trace" and src["compile_id"] == cid and src.get("rank") is None
            assert src["tlparse"]["directory"] == f"-_{cid.replace('/', '_')}_{src['attempt']}"
            assert src["log"].startswith("dedicated_log_torch_trace")
            status, stage = EXPECTED[name][cid]
            assert (info["failure"] or {}).get("stage") == stage, (name, cid)
            assert info["system"]["torch"] == torch.__version__
            assert info["records"]["config"]["modules"]["torch._dynamo.config"]
            assert len(repro.args) == info["graph"]["placeholders"]


def _strings(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)


def test_records_hold_no_path_of_the_machine(trace_jobs, packed):
    """Spec §8: no absolute path of this machine (the job's folder, the trace, site-packages,
    home, the temporary folder, inductor's cache, the user name) in any record of the index."""
    from reproarchive.testing.machine_paths import machine_paths_in

    for name, archives in packed.items():
        for path in archives.values():
            assert machine_paths_in(path, trace_jobs[name][0], trace_jobs[name][1]) == [], name


def test_inputs_carry_the_logged_metadata(trace_jobs, packed):
    folder = trace_jobs["compile_error"][0]
    job_inputs = torch.load(folder / "inputs.pt")
    info = reproarchive.inspect(packed["compile_error"]["0/0"]).to_plain()
    rows = {r["name"]: r for r in info["inputs"]}
    assert all(r["fidelity"] == "absent" for r in rows.values())
    assert rows["l_x_"]["shape"] == list(job_inputs["x"].shape)
    assert rows["l_y_"]["stride"] == list(job_inputs["y"].stride())  # the strided view
    weight = rows["l_self_modules_lin_parameters_weight_"]
    assert weight["shape"] == list(job_inputs["weight"].shape) and weight["requires_grad"]
    records = {r["placeholder"]: r for r in info["source"]["inputs"]}
    assert records["L_self_modules_lin_parameters_weight_"]["is_parameter"]
    assert records["L_y_"]["source"] == "L['y']"

    dyn = reproarchive.inspect(packed["dynamic"]["0/1"]).to_plain()
    sym = next(r for r in dyn["source"]["inputs"] if r["kind"] == "symint")
    assert sym["hint"] == 4 and sym["expr"] == "s77" and sym["source"] == "L['x'].size()[0]"
    tensor = next(r for r in dyn["source"]["inputs"] if r["kind"] == "tensor")
    assert tensor["symbolic_shape"] == ["s77", 6] and tensor["shape"] == [4, 6]
    assert dyn["source"]["symbols"]["s77"]["hint"] == 4
    shapes = dyn["shapes"]  # the shape policy the log tells (spec §8 shapes, recorded_from torch_trace)
    assert shapes["recorded_from"] == "torch_trace"
    x_dims = next(r for r in shapes["inputs"] if r["kind"] == "tensor")["dims"]
    assert x_dims[0]["kind"] == "backed" and x_dims[0]["expr"] == "s77" and x_dims[0]["size"] == 4
    assert x_dims[0]["source"] == "L['x'].size()[0]" and x_dims[1] == {"kind": "static", "size": 6}


def test_a_dynamic_compile_replays_with_its_logged_shape_policy(packed):
    outcome = reproarchive.run(packed["dynamic"]["0/1"])
    assert outcome.status == "reproduced", outcome.to_dict()
    assert outcome.shapes["policy"] == "recorded" and outcome.shapes["symbolic"] is True
    assert outcome.shapes["guards_match"] is None  # a log renders no guards a replay can compare
    assert reproarchive.run(packed["compile_error"]["0/0"]).shapes["policy"] == "not recorded"


@pytest.mark.parametrize("name,cid", [("compile_error", "0/0"), ("runtime_error", "0/0"), ("accuracy", "0/0"),
                                      ("graph_break", "1/0"), ("dynamic", "0/1")])
def test_failures_reproduce_minify_and_export(packed, tmp_path, name, cid):
    """The failure depends only on the graph (PyTorch's bug-injecting backends), so generated
    inputs reproduce it; the archive minifies to the relu and exports a standalone script."""
    archive = packed[name][cid]
    outcome = reproarchive.run(archive)
    assert outcome.status == "reproduced", outcome.to_dict()
    report = minify_archive(archive, tmp_path / "min.tar.zst")
    assert report.status in ("minified", "unchanged")
    small = reproarchive.load(tmp_path / "min.tar.zst")
    ops = [n.target for n in small.gm.graph.nodes if n.op in ("call_function", "call_method")]
    assert any("relu" in str(t) for t in ops) and len(ops) <= 2, ops
    assert reproarchive.inspect(tmp_path / "min.tar.zst").to_plain()["source"]["kind"] == "torch_trace"
    reproarchive.export(archive, tmp_path / "bug")
    assert (tmp_path / "bug" / "repro.py").is_file()


_JOB_LINES = {
    "compile_error": 'line 11, in forward\n    return torch.relu(self.lin(x) + y).sum(1)\n',
    "inductor_real": 'line 7, in f\n    return torch.relu(torch.nn.functional.dropout(a @ b, 0.5, True) + 1).sum(1)\n',
}


@pytest.mark.parametrize("name", _JOB_LINES)
def test_each_op_keeps_the_model_line_the_log_names(packed, tmp_path, name):
    """(format 1.7) The log prints the innermost frame of each node's stack above its line: in
    the Dynamo graph (``compile_error``), and in the graph before Inductor's post-grad passes,
    which its runnable is another print of (``inductor_real``). Every op of the rebuilt graph
    gets the job's line, the job's folder written ``<job>``, but the seeds Inductor adds for
    the dropout (no model line: the log says "No stacktrace found"), and keeps it when minified."""
    ops = [n for n in reproarchive.load(packed[name]["0/0"], device="cpu").gm.graph.nodes
           if n.op in ("call_function", "call_method")]
    stack = f'  File "<job>/job.py", {_JOB_LINES[name]}'
    assert {str(n.target) for n in ops if n.meta.get("stack_trace") != stack} <= {"prims.inductor_seeds.default"}
    assert sum(n.meta.get("stack_trace") == stack for n in ops) >= 3
    if name == "compile_error":
        minify_archive(packed[name]["0/0"], tmp_path / "min.tar.zst")
        (relu,) = [n for n in reproarchive.load(tmp_path / "min.tar.zst").gm.graph.nodes if n.op == "call_function"]
        assert relu.meta["stack_trace"] == stack


def test_exported_script_raises_the_logged_error(packed, tmp_path):
    reproarchive.export(packed["compile_error"]["0/0"], tmp_path / "bug")
    proc = subprocess.run([sys.executable, str(tmp_path / "bug" / "repro.py")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0 and "ReluCompileError" in proc.stderr


def test_a_compile_that_passed_replays_as_passed(packed):
    assert reproarchive.run(packed["graph_break"]["0/0"]).status == "passed"


def test_a_pass_without_the_recorded_grad_mode_is_inconclusive(packed, tmp_path):
    """A log records no grad mode. The Linear's weight requires grad, so the replay's grad mode
    decides whether AOTAutograd compiles forward and backward: a pass there is no evidence (125).
    The graph-break job's first graph has no such input and compiles the same either way."""
    outcome = reproarchive.run(packed["compile_error"]["0/0"], backend="aot_eager")
    assert (outcome.status, outcome.exit_code) == ("inconclusive", 125), outcome.to_dict()
    assert any("grad mode of the failing run was not recorded" in u for u in outcome.unfaithful), outcome.unfaithful
    assert reproarchive.run(packed["graph_break"]["0/0"]).status == "passed"
    # the exported script judges it as run does
    reproarchive.export(packed["compile_error"]["0/0"], tmp_path / "bug")
    proc = subprocess.run([sys.executable, str(tmp_path / "bug" / "repro.py"), "--backend", "aot_eager"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 125 and "grad mode of the failing run was not recorded" in proc.stderr, proc.stderr


def test_records_say_where_the_failure_came_from(packed):
    logged = reproarchive.inspect(packed["compile_error"]["0/0"]).to_plain()
    assert logged["source"]["replay"]["failure_from"] == "log"
    assert logged["source"]["replay"]["agrees_with_log"] is True
    assert logged["source"]["backend_origin"] == "named in the failure logged for this compile"
    replayed = reproarchive.inspect(packed["runtime_error"]["0/0"]).to_plain()
    assert replayed["source"]["replay"]["failure_from"].startswith("replay")
    assert replayed["source"]["backend_origin"] == "--backend"
    assert replayed["failure"]["exception_type"] == "AssertionError"  # torch._assert(False, "ReluRuntimeError")
    assert "ReluRuntimeError" in replayed["failure"]["message"]


def test_inductor_runnable_with_real_data(trace_jobs, packed, tmp_path, monkeypatch):
    """TORCH_COMPILE_DEBUG_SAVE_REAL data next to the log makes the inputs real; the
    fx_graph_runnable (ATen graph) replays through Inductor and the compiler's errors are kept."""
    folder = trace_jobs["inductor_real"][0]
    job_inputs = torch.load(folder / "inputs.pt")
    archive = packed["inductor_real"]["0/0"]
    info = reproarchive.inspect(archive).to_plain()
    assert info["source"]["graph_from"] == "fx_graph_runnable" and info["source"]["graph_kind"] == "after_aot"
    assert info["backend"] == "inductor"
    assert [r["fidelity"] for r in info["inputs"]] == ["real", "real"]
    repro = reproarchive.load(archive)
    assert torch.equal(repro.args[0], job_inputs["a"]) and torch.equal(repro.args[1], job_inputs["b"])
    failure = info["records"]["failure"]
    assert failure["exception_type"] == "torch._inductor.exc.CppCompileError"
    diagnostics = info["source"]["diagnostics"]
    assert diagnostics and all(": error: " in d for d in diagnostics)
    assert diagnostics[0] in failure["message"]
    assert "warning:" not in failure["message"]
    assert info["records"]["config"]["modules"]["torch._inductor.config"]["cpp.inject_relu_bug_TESTING_ONLY"] == \
        "compile_error"
    # the job ran with TORCH_COMPILE_DEBUG (trace.enabled in the recorded config): a replay
    # must not write debug folders into the user's directory
    assert info["records"]["config"]["modules"]["torch._inductor.config"]["trace.enabled"] is True
    monkeypatch.chdir(tmp_path)
    outcome = reproarchive.run(archive)
    assert outcome.status == "reproduced", (outcome.recorded.signature, outcome.observed and outcome.observed.signature)
    assert list(tmp_path.iterdir()) == []
    # TORCH_COMPILE_DEBUG's own folder names the same trace
    assert list_trace(folder / "torch_compile_debug")["files"] == list_trace(trace_jobs["inductor_real"][1])["files"]


def test_random_ops_of_the_aot_graph_stay_ops(packed):
    """A call of the logged graph that takes no graph value (``aten.rand``, Inductor's seeds) is
    a node of the archive's graph: tracing it used to run it once and freeze the draw into a
    constant of the graph, stored as if it were the job's data."""
    archive = packed["inductor_real"]["0/0"]
    info = reproarchive.inspect(archive).to_plain()
    ops = info["graph"]["op_histogram"]
    assert ops.get("torch.ops.prims.inductor_seeds.default") == 1, ops
    assert ops.get("torch.ops.prims.inductor_random.default") == 1, ops
    assert "prims::inductor_seeds" in info["randomness"]
    assert not [n for n in reproarchive.load(archive).gm.graph.nodes if n.op == "get_attr"]
    # a compile error reads no random value: the replay is faithful without the RNG state
    outcome = reproarchive.run(archive)
    assert outcome.status == "reproduced" and outcome.unfaithful == [], outcome.to_dict()


def test_a_gpu_jobs_log_packs_on_a_machine_without_the_gpu(trace_jobs, tmp_path):
    """The same job's log as it reads on cuda:0 packs here without touching a device: the
    inputs keep their device, the random ops their device constant, the failure comes from the
    log and is not replayed on the CPU (which would record another program's failure), and
    ``run`` answers 125 unless asked to move it."""
    log = next(trace_jobs["inductor_real"][1].glob("*.log"))
    result = pack_trace(recorded_on_cuda(log, tmp_path / "gpu"), tmp_path / "out")
    (report,) = result.packed
    assert report.replay["performed"] is False and "cuda:0" in report.replay["reason"], report.replay
    info = reproarchive.inspect(report.archive).to_plain()
    assert {r["device"] for r in info["inputs"]} == {"cuda:0"} and {r["fidelity"] for r in info["inputs"]} == {"absent"}
    assert info["failure"]["stage"] == "compile" and info["source"]["replay"]["failure_from"] == "log"
    assert info["graph"]["op_histogram"].get("torch.ops.prims.inductor_seeds.default") == 1
    seeds = next(n for n in reproarchive.load(report.archive, device="cpu").gm.graph.nodes
                 if "inductor_seeds" in str(n.target))
    assert seeds.args[1] == torch.device("cpu")  # the graph's cuda:0 constant, moved as asked
    res = CliRunner().invoke(main, ["run", str(report.archive)])
    assert res.exit_code == 125 and "cuda:0" in res.stderr, res.output


def test_a_graph_with_a_cond_packs_replays_and_minifies_into_the_branch(packed_results, packed, tmp_path):
    """Inductor fails inside a ``torch.cond`` branch. PyTorch's fx_graph_runnable of such a graph
    is not Python, so the archive holds the Dynamo graph, its branches as subgraphs, and says
    why; it replays with Inductor and the minifier takes the relu out of the branch."""
    (report,) = packed_results["hop_inductor"].packed
    assert report.graph_from == "dynamo_output_graph"
    assert any("fx_graph_runnable for [0/0] is not valid Python" in w for w in report.warnings), report.warnings
    assert any("TORCH_COMPILE_DEBUG's runnables" in w and "inputs stay absent" in w for w in report.warnings)
    archive = packed["hop_inductor"]["0/0"]
    repro = reproarchive.load(archive)
    assert any(n.target is torch.ops.higher_order.cond for n in repro.gm.graph.nodes)
    assert isinstance(repro.gm.cond_true_0, torch.fx.GraphModule)
    outcome = reproarchive.run(archive)
    assert outcome.status == "reproduced" and "CppCompileError" in outcome.observed.exception_type, outcome.to_dict()
    minify_archive(archive, tmp_path / "min.tar.zst")
    small = reproarchive.load(tmp_path / "min.tar.zst")
    ops = [str(n.target) for n in small.gm.graph.nodes if n.op == "call_function"]
    assert any("relu" in t for t in ops) and not any("cond" in t for t in ops), ops


def test_default_selects_the_failed_compiles_only(trace_jobs, tmp_path):
    """What pack takes without --compile-id/--all (selection only: no child process)."""
    from reproarchive.sources.trace.log_reader import read_trace

    trace = read_trace(trace_jobs["graph_break"][1])
    assert [c.id for c in trace.select()] == ["1/0"]
    assert [c.id for c in trace.select(all_compiles=True)] == ["0/0", "1/0"]
    assert [c.id for c in trace.select(["[0/0]", "1/0_0"])] == ["0/0", "1/0"]
    with pytest.raises(SourceError, match="no compile failed"):
        pack_trace(trace_jobs["runtime_error"][1], tmp_path)
    with pytest.raises(SourceError, match="compile 7/0 is not in"):
        pack_trace(trace_jobs["graph_break"][1], tmp_path, compile_ids=["7/0"])
    with pytest.raises(SourceError, match="is not a compile id"):
        pack_trace(trace_jobs["graph_break"][1], tmp_path, compile_ids=["seven"])


def test_pack_cli_leaves_the_caller_alone(trace_jobs, tmp_path):
    import torch._dynamo.config as dcfg

    env_before, dyn_before, cwd_before = dict(os.environ), dcfg.get_config_copy(), os.getcwd()
    trace = trace_jobs["dynamic"][1]
    res = CliRunner().invoke(main, ["pack", str(trace), "--compile-id", "[0/1]", "-o", str(tmp_path / "one.tar.zst"),
                                    "--no-replay", "-q"])
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("wrote ") and "[0/1]" in res.stdout and "failure: compile" in res.stdout
    assert (tmp_path / "one.tar.zst").is_file()
    res = CliRunner().invoke(main, ["inspect", str(tmp_path / "one.tar.zst")])
    assert "from: TORCH_TRACE log dedicated_log_torch_trace" in res.stdout and "compile [0/1]" in res.stdout
    assert "tlparse: -_0_1_0/   graph: dynamo_output_graph" in res.stdout
    assert dict(os.environ) == env_before and dcfg.get_config_copy() == dyn_before and os.getcwd() == cwd_before
    res = CliRunner().invoke(main, ["pack", str(trace), "--json", "--no-replay", "-o", str(tmp_path / "one.tar.zst")])
    assert res.exit_code == 4 and json.loads(res.stdout)["error"]["what"].startswith("3 compiles are selected")
    res = CliRunner().invoke(main, ["pack", str(tmp_path), "--compile-id", "0/1"])
    assert res.exit_code == 2 and "only apply to a TORCH_TRACE log" in res.output
