"""``reproarchive run --minify`` on captured archives: smaller, same failure, never loses work."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx as fx
from click.testing import CliRunner
from torch._dynamo.exc import BackendCompilerFailed

import reproarchive
from reproarchive import child
from reproarchive.cli import main
from reproarchive.minifier import driver as ma


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.a(x).sin() * 2 + 1
        z = self.b(y).cos()
        w = torch.relu(z - y) / 3
        return (w.tanh() + z.exp()).sum(1)


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    d = tmp_path_factory.mktemp("cap")
    path = d / "repro.tar.zst"
    f = torch.compile(Net(), backend=reproarchive.capture("relu_compile_error_TESTING_ONLY", path=path))
    with pytest.raises(BackendCompilerFailed):
        f(torch.randn(4, 8))
    assert path.exists()
    return path


def ops(path) -> int:
    return reproarchive.inspect(path).graph.ops


def test_minify_cli_end_to_end(captured, tmp_path):
    out = tmp_path / "min.tar.zst"
    result = CliRunner().invoke(main, ["run", "--minify", str(captured), "-o", str(out), "-q"])
    assert result.exit_code == 0, result.output
    assert "torch.relu" in result.output and "minified:" in result.output
    # the minified graph names the model line of each op (format 1.7: stacks kept, paths redacted)
    assert "# File: ./tests/minifier/test_minify_cli.py:" in result.output
    assert "code: w = torch.relu(z - y) / 3" in result.output
    assert ops(out) == 1 < ops(captured)
    info = reproarchive.inspect(out).to_plain()
    assert info["parent"] == reproarchive.inspect(captured).digest
    assert info["minify"]["stop_reason"] == "fixpoint" and info["minify"]["calls"] > 0
    # input moves ran (default): the one input is labelled as not the original data
    (entry,) = info["minify"]["inputs"]
    assert entry["real"] is False and entry["values"] == "zeros" and entry["shape"]["now"] == [1, 1]
    assert "inputs that are not the original data:" in result.output
    reproarchive.verify(out)
    # (format 1.7) the op left still says which model line it came from, as Dynamo said it
    (relu,) = [n for n in reproarchive.load(out).gm.graph.nodes if n.op == "call_function"]
    assert relu.meta["stack_trace"].startswith('  File "./tests/minifier/test_minify_cli.py", line ')
    assert "w = torch.relu(z - y) / 3" in relu.meta["stack_trace"]
    replay = CliRunner().invoke(main, ["run", str(out)])
    assert replay.exit_code == 1, replay.output
    as_json = CliRunner().invoke(main, ["run", "--minify", str(captured), "-o", str(tmp_path / "j.tar.zst"), "--json"])
    assert as_json.exit_code == 0 and '"status": "minified"' in as_json.output


def test_interrupted_minify_keeps_the_best_graph(captured, tmp_path, monkeypatch):
    real = ma._replay_predicate
    calls = []

    def interrupting(*args, **kwargs):
        fails = real(*args, **kwargs)

        def wrapped(gm, inputs):
            calls.append(1)
            answer = fails(gm, inputs)
            if answer and len(calls) > 1:  # first smaller failing graph: accept, then "Ctrl-C"
                wrapped.accepted = True
                return answer
            if getattr(wrapped, "accepted", False):
                raise KeyboardInterrupt
            return answer

        return wrapped

    monkeypatch.setattr(ma, "_replay_predicate", interrupting)
    out = tmp_path / "int.tar.zst"
    report = ma.minify_archive(captured, out)
    assert report.stats["stop_reason"] == "interrupted"
    assert out.exists() and ops(out) < ops(captured)
    assert reproarchive.run(out).exit_code == 1


def test_minify_refuses_an_archive_that_does_not_reproduce(tmp_path):
    g = fx.Graph()
    x = g.placeholder("x")
    g.output((g.call_function(operator.add, (x, x)),))
    gm = fx.GraphModule(torch.nn.Module(), g)
    failure = {"stage": "compile", "exception_type": "RuntimeError", "message": "boom", "traceback": "",
               "signature": "compile|RuntimeError|boom", "backend": "eager", "accuracy": None}
    path = reproarchive.pack(gm, [torch.ones(2)], tmp_path / "p.tar.zst", backend="eager", failure=failure)
    result = CliRunner().invoke(main, ["run", "--minify", str(path), "-o", str(tmp_path / "m.tar.zst")])
    assert result.exit_code == 3 and "does not reproduce" in result.output
    assert not (tmp_path / "m.tar.zst").exists()
    # without -o the output goes next to the input; `minify` is the same command
    for argv in (["run", "--minify", str(path)], ["minify", str(path)]):
        result = CliRunner().invoke(main, argv)
        assert result.exit_code == 3 and "does not reproduce" in result.output
        assert sorted(p.name for p in tmp_path.iterdir()) == ["p.tar.zst"]
    for flag in (["--strict-accuracy"], ["--jobs", "2"]):
        usage = CliRunner().invoke(main, ["run", str(path), *flag])
        assert usage.exit_code == 2 and "only apply with --minify" in usage.output



def test_minify_of_an_unknown_failure_says_why_it_is_unknown(tmp_path):
    """An archive whose pack could not learn its failure (here: the graph fails in eager mode
    too) has no signature to minify against. The error named a cause it did not have ("replay
    it first: pack without --no-replay", for an archive that was replayed) and not the one it
    records."""
    g = fx.Graph()
    x = g.placeholder("x")
    g.output((g.call_function(operator.add, (x, x)),))
    gm = fx.GraphModule(torch.nn.Module(), g)
    message = "the graph fails in eager mode too (IndexError: index 9 is out of bounds); not replayed"
    failure = {"stage": "unknown", "exception_type": "", "message": message, "traceback": "", "signature": "",
               "backend": "eager", "accuracy": None}
    path = reproarchive.pack(gm, [torch.ones(2)], tmp_path / "u.tar.zst", backend="eager", failure=failure)
    result = CliRunner().invoke(main, ["run", "--minify", str(path), "-o", str(tmp_path / "m.tar.zst")])
    assert result.exit_code == 2 and "without --no-replay records one" not in result.output
    assert f"the archive's failure is unknown, so there is no signature to minify against ({message})" in result.output
    assert "not the compiler's to minify" in result.output and not (tmp_path / "m.tar.zst").exists()
    bare = reproarchive.pack(gm, [torch.ones(2)], tmp_path / "none.tar.zst", backend="eager")
    result = CliRunner().invoke(main, ["run", "--minify", str(bare), "-o", str(tmp_path / "m.tar.zst")])
    assert result.exit_code == 2 and "records no failure to minify against" in result.output, result.output


@pytest.mark.slow
def test_isolated_minify(tmp_path):
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(torch.sin, (x,))
    b = g.call_function(torch.relu, (a,))
    g.output((g.call_function(torch.cos, (b,)),))
    gm = fx.GraphModule(torch.nn.Module(), g)
    path = tmp_path / "iso.tar.zst"
    f = torch.compile(gm, backend=reproarchive.capture("relu_compile_error_TESTING_ONLY", path=path))
    with pytest.raises(BackendCompilerFailed):
        f(torch.randn(3))
    out = tmp_path / "iso-min.tar.zst"
    report = ma.minify_archive(path, out, isolate=True)
    assert report.stats["isolate"] and ops(out) == 1


CRASHING = '''
import os
import torch


def abort_on_relu(gm, example_inputs):
    """A compiler that dies (SIGABRT) on any graph with a relu, like inductor's runtime injector."""
    if any(n.target in (torch.relu, torch.ops.aten.relu.default) for n in gm.graph.nodes):
        os.abort()
    return gm
'''


@pytest.mark.slow
def test_crash_minify_uses_warm_workers(tmp_path, monkeypatch):
    """A recorded crash is minified isolated by default: warm workers judge two candidates at a
    time and a worker killed by a crashing candidate is replaced; the folders of the replays
    that died with their worker go with it."""
    import tempfile

    from reproarchive.context import failure as failure_mod

    temp = tmp_path / "tmp"  # the system's temporary folder, for this test and its workers
    temp.mkdir()
    monkeypatch.setattr(child, "_warm", None)  # the last replay's child started, not from a server that lives on
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", None)
    (tmp_path / "crashing_backends.py").write_text(CRASHING)
    monkeypatch.syspath_prepend(str(tmp_path))
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(torch.sin, (x,))
    b = g.call_function(torch.relu, (a,))
    c = g.call_function(torch.cos, (b,))
    g.output((g.call_function(torch.tanh, (c,)),))
    gm = fx.GraphModule(torch.nn.Module(), g)
    crash = {"stage": "crash", "exception_type": "SIGABRT", "message": "killed by SIGABRT", "traceback": "",
             "signature": failure_mod.signature("crash", "SIGABRT", ""), "backend": "crashing_backends:abort_on_relu",
             "accuracy": None}
    path = reproarchive.pack(gm, [torch.randn(16, 8)], tmp_path / "crash.tar.zst",
                             backend="crashing_backends:abort_on_relu", failure=crash)
    out = tmp_path / "min.tar.zst"
    report = ma.minify_archive(path, out, backend="crashing_backends:abort_on_relu", jobs=2, shrink_inputs=False)
    s = report.stats
    assert s["isolate"] and s["jobs"] == 2 and ops(out) == 1 and "torch.relu" in report.code
    assert s["workers_started"] > 3  # two workers, a spare, and replacements for crashed ones
    assert s["inputs"] == [{"origin": "node:sin", "depends_on": [0], "values": "recorded", "from_absent": False,
                            "real": True}]
    assert reproarchive.run(out, backend="crashing_backends:abort_on_relu").status == "reproduced"
    assert sorted(p.name for p in temp.glob("reproarchive-*")) == []


def test_the_default_minified_name_sits_next_to_the_input(tmp_path):
    from reproarchive.cli.replay_cmds import default_minified_path

    assert default_minified_path(str(tmp_path / "bug.tar.zst")) == tmp_path / "bug.min.tar.zst"
    assert default_minified_path("repro.zst").name == "repro.min.tar.zst"


def test_minify_of_an_archive_recorded_on_a_device_not_here_answers_as_run_does(tmp_path):
    """A replaying command has one device rule: an archive recorded on ``cuda:0`` on a machine
    without it cannot run here (125, with the hint to pass --device cpu), for ``run``, ``run
    --minify`` and ``bisect compiler`` alike; it is not "does not reproduce here" (3)."""
    from support.devices import pack_with_device_constant

    if torch.cuda.is_available():
        pytest.skip("this machine has the recorded device")
    path = pack_with_device_constant(tmp_path / "device.tar.zst", "cuda:0")
    runner = CliRunner()
    ran = runner.invoke(main, ["run", str(path)])
    minified = runner.invoke(main, ["run", "--minify", str(path), "-o", str(tmp_path / "min.tar.zst")])
    assert ran.exit_code == minified.exit_code == 125, (ran.output, minified.output)
    assert minified.output.strip().splitlines()[-1] == ran.output.strip().splitlines()[-1]
    assert "--device cpu" in minified.output and not (tmp_path / "min.tar.zst").exists()
    bisected = runner.invoke(main, ["bisect", "compiler", str(path)])
    assert bisected.exit_code == 125 and bisected.output.strip().splitlines()[-1] == ran.output.strip().splitlines()[-1]


def test_job_options_given_for_one_graph_are_one_line_errors(tmp_path):
    """--timeout to minify one graph, --isolate to run a job: a mistake said in one line, exit 2,
    with --json a JSON error document, and nothing written."""
    import json

    from support.graphs import pack_chain

    path = pack_chain(tmp_path / "one.tar.zst", 4)
    runner = CliRunner()
    minified = runner.invoke(main, ["run", "--minify", str(path), "-o", str(tmp_path / "m.tar.zst"),
                                    "--timeout", "5", "--json"])
    assert minified.exit_code == 2, minified.output
    assert "multi-rank job archive only" in json.loads(minified.stdout)["error"]["message"]
    assert not (tmp_path / "m.tar.zst").exists() and "Traceback" not in minified.output
    text = runner.invoke(main, ["run", "--minify", str(path), "-o", str(tmp_path / "m.tar.zst"), "--timeout", "5"])
    lines = [ln for ln in text.output.splitlines() if ln.startswith("error:")]
    assert text.exit_code == 2 and len(lines) == 1 and "leave --timeout out" in lines[0]


def test_minify_summary_is_a_bug_report_that_reproduces(tmp_path, fresh_dynamo):
    """``--summary``: the failure, the command that replays the minified archive, the versions,
    the config the failing run changed (as Python to paste) and the smallest graph."""
    from support.captures import capture_failure

    with torch._inductor.config.patch({"freezing": True}):
        path = capture_failure(tmp_path / "r.tar.zst", lambda x: torch.relu(x.sin()) * 2, [torch.randn(8)],
                               "relu_compile_error_TESTING_ONLY")
    assert ("torch._inductor.config", "freezing", True) in reproarchive._internal.recorded_config(path)
    out, summary = tmp_path / "min.tar.zst", tmp_path / "bug.md"
    result = CliRunner().invoke(main, ["run", "--minify", str(path), "-o", str(out), "--summary", str(summary), "-q"])
    assert result.exit_code == 0, result.output
    text = summary.read_text()
    assert f"replay it: `reproarchive run {out}`" in text and "- failure: " in text and "torch.relu" in text
    code = text[text.index("```python", text.index("set it before compiling")):]
    assert "torch._inductor.config.freezing = True" in code.split("```")[1]
    refused = CliRunner().invoke(main, ["run", str(path), "-o", str(tmp_path / "x.tar.zst")])
    assert refused.exit_code == 2 and "only apply with --minify" in refused.output
