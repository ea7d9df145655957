"""`reproarchive export`: a folder with a repro.py that needs only torch.

The exported scripts are run in a child Python started with ``-I`` (no PYTHONPATH, no cwd on
sys.path) and with ``reproarchive`` blocked in ``sys.modules``, from a different working
directory and after the folder was moved, so a script that imported reproarchive or read its
data by an absolute or cwd-relative path would fail here.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import textwrap

import torch
import torch.fx as fx

import reproarchive
from reproarchive.context import failure as failure_mod
from reproarchive.format.schema import FailureRecord, Records
from reproarchive.standalone.script import export
from support.captures import capture_failure
from support.cli import invoke
from support.isolated import run_isolated


def model(x, y):
    return torch.relu(x @ y).sum(1) * 2


def capture_archive(path, backend, *, accuracy=False):
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 4, generator=gen, requires_grad=True), torch.randn(4, 4, generator=gen)
    return capture_failure(path, model, (x, y), backend, accuracy=accuracy)


def test_export_runs_without_reproarchive_and_reproduces(tmp_path):
    archive = capture_archive(tmp_path / "compile.tar.zst", "relu_compile_error_TESTING_ONLY")
    code = invoke("export", archive, "-o", tmp_path / "out")
    assert code.exit_code == 0, code.output
    # Move the folder: everything it reads must be found relative to the script.
    moved = tmp_path / "elsewhere" / "bug-report"
    moved.parent.mkdir()
    shutil.move(str(tmp_path / "out"), str(moved))
    script = moved / "repro.py"
    text = script.read_text()
    assert "import reproarchive" not in text and "from reproarchive" not in text
    assert "torch.load" not in text and "pickle" not in text
    assert "relu_compile_error_TESTING_ONLY" in text and "real data" in text
    assert torch.__version__ in text  # the header names the recording torch

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (failed, detail), (passed, output) = run_isolated(script, [], ["--backend", "eager"], cwd=cwd)
    assert failed == "reproduced" and detail.startswith("ReluCompileError"), detail
    assert passed == "ok" and "no failure" in output, output


def test_the_script_judges_a_failure_as_run_does_the_recorded_one_or_another(tmp_path, monkeypatch):
    """A replay that fails with another error than the recorded one is a different failure: 3
    from `run`, and 3 from the script, which judges by the same rule (its bundled copy of
    ``context.failure_signature``); the recorded failure is 1 from both."""
    archive = capture_archive(tmp_path / "compile.tar.zst", "relu_compile_error_TESTING_ONLY")
    assert invoke("export", archive, "-o", tmp_path / "out").exit_code == 0
    (tmp_path / "out" / "otherbug.py").write_text("def backend(gm, args):\n    raise ValueError(\"another bug\")\n")
    monkeypatch.syspath_prepend(str(tmp_path / "out"))
    verdicts = {}
    for extra in ([], ["--backend", "otherbug:backend"]):
        by_run = invoke("run", archive, *extra, "--json")
        by_script = subprocess.run([sys.executable, "repro.py", *extra], cwd=tmp_path / "out",
                                   capture_output=True, text=True, timeout=300)
        verdicts[tuple(extra)] = (by_run.exit_code, by_script.returncode)
        said = by_script.stderr.strip().splitlines()[-1]
        assert said.startswith("reproduced: " if not extra else "different failure: "), by_script.stderr[-2000:]
    assert verdicts == {(): (1, 1), ("--backend", "otherbug:backend"): (3, 3)}, verdicts


def test_export_data_is_raw_bytes_and_aliasing_survives(tmp_path):
    """Inputs that share a storage share one data file, and the script rebuilds the views."""
    def f(a, b):
        return torch.relu(a) + b.sum()

    base = torch.arange(12, dtype=torch.float32)
    a, b = base[:8].view(2, 4), base[4:]  # overlapping views of one storage
    graphs = []
    torch._dynamo.reset()
    torch.compile(f, backend=lambda gm, ex: graphs.append(gm) or gm)(a, b)
    path = tmp_path / "alias.tar.zst"
    reproarchive.pack(graphs[0], [a, b], path, backend="eager", failure=failure_mod.unknown_record("test"))
    report = export(path, tmp_path / "out")
    data_files = [f for f in report.files if f.startswith("data/")]
    assert len(data_files) == 1
    assert (tmp_path / "out" / data_files[0]).read_bytes() == bytes(base.untyped_storage())

    check = tmp_path / "check.py"
    check.write_text(textwrap.dedent(f"""
        import sys, runpy
        sys.modules["reproarchive"] = None
        g = runpy.run_path({str(tmp_path / "out" / "repro.py")!r}, run_name="exported")
        a, b = g["load_inputs"]()
        assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr(), "aliasing lost"
        assert a.shape == (2, 4) and b.storage_offset() == 4 and b.stride() == (1,)
        assert a.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]] and b.tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
        print("ok")
    """))
    result = subprocess.run([sys.executable, "-I", str(check)], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


def test_export_accuracy_failure_and_config(tmp_path):
    archive = capture_archive(tmp_path / "acc.tar.zst", "relu_accuracy_error_TESTING_ONLY", accuracy=True)
    out = tmp_path / "out"
    export(archive, out)
    (failed, detail), (passed, _) = run_isolated(out / "repro.py", [], ["--no-accuracy"], cwd=tmp_path)
    assert failed == "reproduced" and detail.startswith("AssertionError: accuracy failure"), detail
    assert passed == "ok"


def test_export_writes_recorded_config_settings(tmp_path):
    graphs = []
    torch._dynamo.reset()
    torch.compile(lambda x: torch.relu(x), backend=lambda gm, ex: graphs.append(gm) or gm)(torch.randn(3))
    from reproarchive.context import config as snapshot

    with torch._inductor.config.patch({"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"}):
        config = snapshot.config_snapshot()
    path = tmp_path / "cfg.tar.zst"
    reproarchive.pack(graphs[0], [torch.randn(3)], path, backend="inductor", config=config)
    export(path, tmp_path / "out")
    text = (tmp_path / "out" / "repro.py").read_text()
    assert "_set_config(torch._inductor.config, 'cpp.inject_relu_bug_TESTING_ONLY', 'compile_error')" in text


def test_export_refuses_a_non_empty_folder_and_leaves_nothing(tmp_path):
    archive = capture_archive(tmp_path / "compile.tar.zst", "relu_compile_error_TESTING_ONLY")
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    before = sorted(p.name for p in tmp_path.iterdir())
    result = invoke("export", archive, "-o", out)
    assert result.exit_code == 4 and result.output.startswith("error: ")  # an unusable output folder
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no temp folder left behind


def test_export_header_survives_backslashes_in_messages(tmp_path):
    from reproarchive.standalone.script import write_export

    g = fx.Graph()
    x = g.placeholder("x")
    g.output((g.call_function(torch.relu, (x,)),))
    gm = fx.GraphModule(torch.nn.Module(), g)
    failure = FailureRecord(stage="compile", exception_type="OSError", message=r"cannot open C:\Users\me\x.so",
                            backend="eager")
    report = write_export(gm, [torch.ones(2)], tmp_path / "out", Records(backend="eager", failure=failure))
    ast.parse(open(report.script).read())


def test_the_script_shows_a_recorded_signature_with_its_control_characters_escaped(tmp_path):
    """The recorded signature is the archive's text: the script's verdict line escapes a terminal
    escape sequence in it instead of sending it to the terminal."""
    from reproarchive.standalone.script import write_export

    g = fx.Graph()
    x = g.placeholder("x")
    g.output((g.call_function(torch.relu, (x,)),))
    gm = fx.GraphModule(torch.nn.Module(), g)
    failure = FailureRecord(stage="compile", exception_type="OSError", message="boom",
                            signature="compile|OSError|\x1b[2J\x1b]0;owned\x07", backend="eager")
    report = write_export(gm, [torch.ones(2)], tmp_path / "out", Records(backend="eager", failure=failure))
    (tmp_path / "out" / "otherbug.py").write_text("def backend(gm, args):\n    raise ValueError('another bug')\n")
    ran = subprocess.run([sys.executable, report.script, "--backend", "otherbug:backend"], cwd=tmp_path / "out",
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 3, ran.stderr[-2000:]
    assert "\x1b" not in ran.stderr and "\x07" not in ran.stderr
    assert "(recorded: compile|OSError|\\x1b[2J\\x1b]0;owned\\x07)" in ran.stderr, ran.stderr[-1000:]


def test_export_hands_the_backend_non_leaf_inputs_as_recorded(tmp_path):
    """A non-leaf input stays non-leaf in the script's runs too: the archive of
    ``non_leaf_compile_error_TESTING_ONLY`` (fails only on a non-leaf) reproduces."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 4, generator=gen, requires_grad=True) * 2
    archive = capture_failure(tmp_path / "nonleaf.tar.zst", model, (x, torch.randn(4, 4, generator=gen)),
                              "non_leaf_compile_error_TESTING_ONLY")
    export(archive, tmp_path / "out")
    (failed, detail), (passed, output) = run_isolated(tmp_path / "out" / "repro.py", [], ["--backend", "eager"],
                                                      cwd=tmp_path)
    assert failed == "reproduced" and detail.startswith("TestingOnlyCompileError"), detail
    assert passed == "ok" and "no failure" in output, output
