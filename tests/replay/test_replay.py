"""Replay: capture a real torch.compile failure, then `reproarchive run` it.

Archives are made with the capture backend around PyTorch's cheap bug injectors (the
``relu_*_TESTING_ONLY`` Dynamo backends); one test uses inductor with its C++ bug injector to
show that the recorded config, not this process's, decides the replay.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import textwrap

import click
import pytest
import torch

import reproarchive
from reproarchive.cli.replay_cmds import DEVICE
from reproarchive.codec.devices import target_for
from reproarchive.context import config as snapshot
from reproarchive.context import failure as failure_mod
from reproarchive.errors import BackendUnavailableError, DeviceUnavailableError
from reproarchive.format.schema import EnvironmentRecord, Records
from reproarchive.replay.runner import replay_graph
from reproarchive.replay.settings import ReplaySettings
from support.captures import capture_failure
from support.cli import invoke
from support.devices import pack_with_device_constant


def model(x, y):
    return torch.relu(x @ y).sum(1) * 2


def inputs():
    gen = torch.Generator().manual_seed(0)
    return torch.randn(4, 4, generator=gen, requires_grad=True), torch.randn(4, 4, generator=gen)


def capture_archive(tmp_path, backend, *, accuracy=False, name="repro.tar.zst"):
    """Run ``model`` under reproarchive.capture(backend); return the archive it wrote."""
    return capture_failure(tmp_path / name, model, inputs(), backend, accuracy=accuracy)


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
    root = tmp_path_factory.mktemp("archives")
    return {
        "compile": capture_archive(root, "relu_compile_error_TESTING_ONLY", name="compile.tar.zst"),
        "runtime": capture_archive(root, "relu_runtime_error_TESTING_ONLY", name="runtime.tar.zst"),
        "accuracy": capture_archive(root, "relu_accuracy_error_TESTING_ONLY", accuracy=True, name="accuracy.tar.zst"),
    }


def cli(*args):
    result = invoke(*args)
    return result.exit_code, result.output


# ---------------------------------------------------------------------------------------------
# reproduced / passed / different / cannot run here


@pytest.mark.parametrize("kind, stage", [("compile", "compile"), ("runtime", "forward"), ("accuracy", "accuracy")])
def test_recorded_failure_reproduces(archives, kind, stage):
    outcome = reproarchive.run(archives[kind])
    assert outcome.recorded.stage == stage
    assert (outcome.status, outcome.exit_code) == ("reproduced", 1)
    assert outcome.observed.signature == outcome.recorded.signature
    code, out = cli("run", archives[kind])
    assert code == 1 and "REPRODUCED" in out


def test_accuracy_failure_has_per_output_figures(archives):
    outcome = reproarchive.run(archives["accuracy"])
    assert outcome.kind == "accuracy failure"
    failing = [o for o in outcome.accuracy.outputs if not o.passed]
    assert failing and all(o.max_abs_error > 0.5 for o in failing)  # relu(x) became x + 1
    assert outcome.accuracy.fp64_reference == "used"
    assert any(o.name.startswith("grad") for o in outcome.accuracy.outputs)  # backward was compared
    code, out = cli("run", archives["accuracy"])
    assert "max abs error" in out
    # Without the comparison the wrong result goes unnoticed: the run passes.
    assert reproarchive.run(archives["accuracy"], accuracy=False).exit_code == 0


@pytest.mark.parametrize("kind", ["compile", "runtime", "accuracy"])
def test_working_backend_passes(archives, kind):
    code, out = cli("run", archives[kind], "--backend", "eager")
    assert code == 0, out
    assert "PASSED" in out


def test_backend_failing_differently_is_exit_3(archives):
    code, out = cli("run", archives["compile"], "--backend", "relu_runtime_error_TESTING_ONLY")
    assert code == 3, out
    assert "DIFFERENT FAILURE" in out and "ReluCompileError" in out and "ReluRuntimeError" in out
    outcome = reproarchive.run(archives["runtime"], backend="relu_compile_error_TESTING_ONLY")
    assert outcome.status == "different failure" and outcome.observed.stage == "compile"


def test_json_output(archives):
    code, out = cli("run", archives["runtime"], "--json")
    data = json.loads(out)
    assert code == 1 and data["exit_code"] == 1 and data["status"] == "reproduced"
    assert data["kind"] == "runtime error (forward)"
    assert data["observed"]["exception_type"] == "AssertionError"


@pytest.mark.parametrize("option", [["--backend", "no_such_backend"], ["--backend", "no_such_module:fn"],
                                    ["--device", "cuda"], ["--device", "cpu=cuda:7"]])
def test_cannot_run_here_is_125(archives, option):
    if "cuda" in " ".join(option) and torch.cuda.is_available() and torch.cuda.device_count() > 7:
        pytest.skip("this machine has the device")
    if option == ["--device", "cuda"] and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    code, out = cli("run", archives["compile"], *option)
    assert code == 125, out
    assert out.startswith("error: ") and "Traceback" not in out


def test_unknown_backend_raises_from_api(archives):
    with pytest.raises(BackendUnavailableError):
        reproarchive.run(archives["compile"], backend="no_such_backend")


def test_help_documents_exit_codes_and_bisect():
    code, out = cli("run", "--help")
    assert code == 0
    for text in ("125", "git bisect run", "reproduced", "different failure"):
        assert text in out


def test_not_an_archive_is_exit_2(tmp_path):
    bogus = tmp_path / "bogus.tar.zst"
    bogus.write_bytes(b"not an archive at all" * 10)
    code, out = cli("run", bogus)
    assert code == 2, out


# ---------------------------------------------------------------------------------------------
# devices


def test_device_option_parsing_and_mapping():
    assert DEVICE.convert("", None, None) is None
    assert DEVICE.convert("cpu", None, None) == "cpu"
    spec = DEVICE.convert("cuda:0=cpu, cuda:1=cuda:0", None, None)
    assert spec == {"cuda:0": "cpu", "cuda:1": "cuda:0"}
    assert target_for("cuda:0", spec) == "cpu"
    assert target_for("cuda:1", spec) == "cuda:0"
    assert target_for("cuda", {"cuda:0": "cpu"}) == "cpu"  # an index-less device is device 0
    assert target_for("cuda:3", {"cuda": "cpu"}) == "cpu"  # a type covers every index
    assert target_for("cpu", {"cuda": "cpu"}) == "cpu"
    assert target_for("cuda:2", "cpu") == "cpu"
    with pytest.raises(click.BadParameter):
        DEVICE.convert("cuda:0=", None, None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_graph_runs_on_cpu_with_remapping(tmp_path):
    path = pack_with_device_constant(tmp_path / "device.tar.zst", "cuda:0")
    for spec in ("cpu", {"cuda:0": "cpu"}, {"cuda": "cpu"}):
        outcome = reproarchive.run(path, device=spec)
        assert outcome.exit_code == 0, (spec, outcome.observed)
        assert outcome.device == "cpu"
    with pytest.raises(DeviceUnavailableError):
        reproarchive.run(path, device="cuda")
    # the one place devices are mapped is load: graph constants follow the inputs
    mapped = reproarchive.load(path, device={"cuda": "cpu"})
    outcome = replay_graph(mapped.gm, mapped.args, ReplaySettings(backend="eager"))
    assert outcome.exit_code == 0, outcome.observed


# ---------------------------------------------------------------------------------------------
# isolation


HELPER = textwrap.dedent('''
    import os

    def abort_backend(gm, example_inputs):
        os.abort()

    def passing_backend(gm, example_inputs):
        return gm
''')


@pytest.fixture
def helper_module(tmp_path, monkeypatch):
    folder = tmp_path / "helpers"
    folder.mkdir()
    (folder / "replay_test_backends.py").write_text(HELPER)
    monkeypatch.syspath_prepend(str(folder))
    return "replay_test_backends"


def test_isolate_reports_abort_as_crash(archives, helper_module):
    outcome = reproarchive.run(archives["compile"], backend=f"{helper_module}:abort_backend", isolate=True)
    assert outcome.isolated
    assert outcome.observed.stage == "crash"
    assert outcome.observed.exception_type == "SIGABRT"
    assert str(int(signal.SIGABRT)) in outcome.observed.message
    assert (outcome.status, outcome.exit_code) == ("different failure", 3)


def test_module_function_backend_and_recorded_crash_reproduces(tmp_path, helper_module):
    """An archive whose recorded failure is a SIGABRT crash is replayed isolated by default."""
    x, y = inputs()
    graphs = []
    torch._dynamo.reset()
    torch.compile(model, backend=lambda gm, ex: graphs.append(gm) or gm)(x, y)
    crash = {"stage": "crash", "exception_type": "SIGABRT", "message": "killed by SIGABRT",
             "traceback": "", "signature": failure_mod.signature("crash", "SIGABRT", ""),
             "backend": f"{helper_module}:abort_backend", "accuracy": None}
    path = tmp_path / "crash.tar.zst"
    # the grad mode the graph ran under, which pack() outside a backend cannot see: without it a
    # pass of a graph whose inputs require grad would be inconclusive
    reproarchive.pack(graphs[0], [x, y], path, backend=f"{helper_module}:abort_backend", failure=crash,
                      execution={"grad_enabled": True})
    # A recorded module:function backend is imported only when the user names it.
    with pytest.raises(reproarchive.ReproArchiveError, match="--backend"):
        reproarchive.run(path)
    outcome = reproarchive.run(path, backend=f"{helper_module}:abort_backend")
    assert outcome.isolated and outcome.observed.exception_type == "SIGABRT"
    assert (outcome.status, outcome.exit_code) == ("reproduced", 1)
    # The same archive with a module:function backend that works, in-process.
    outcome = reproarchive.run(path, backend=f"{helper_module}:passing_backend", isolate=False)
    assert (outcome.status, outcome.exit_code, outcome.isolated) == ("passed", 0, False)


# ---------------------------------------------------------------------------------------------
# the recorded config is applied


@pytest.mark.slow
def test_recorded_inductor_config_reproduces(tmp_path):
    """The bug exists only under a config setting recorded in the archive, not set here."""
    def f(x):
        return torch.relu(x) * 2

    x = torch.randn(8)
    graphs = []
    torch._dynamo.reset()
    torch.compile(f, backend=lambda gm, ex: graphs.append(gm) or gm)(x)
    with torch._inductor.config.patch({"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"}):
        config = snapshot.config_snapshot()
    # Record the failure as the graph produced it under that config (what capture would do).
    from torch._inductor.compile_fx import compile_fx

    with torch._inductor.config.patch({"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"}):
        with pytest.raises(Exception) as info:
            compile_fx(graphs[0], [x])(x)
    recorded = failure_mod.record_from_exception(info.value, "compile", backend="inductor")
    path = tmp_path / "config.tar.zst"
    reproarchive.pack(graphs[0], [x], path, backend="inductor", config=config, failure=recorded)

    assert torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY is None
    outcome = reproarchive.run(path)
    assert (outcome.status, outcome.exit_code) == ("reproduced", 1), outcome.observed
    assert torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY is None  # restored afterwards
    # The same archive under this process's config compiles fine: the recorded setting is the cause.
    outcome = reproarchive.run(path, current_config=True)
    assert (outcome.status, outcome.exit_code) == ("passed", 0), outcome.observed
    assert any(d["name"] == "torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY" for d in outcome.differences)


def test_current_config_reports_the_config_difference(archives):
    """With --current-config the differing settings are listed as possible explanations."""
    from reproarchive.archive.loading import load

    repro = load(archives["compile"])
    config = repro.records.config
    changed = {"torch._inductor.config": {"cpp.inject_relu_bug_TESTING_ONLY": "runtime_error"}}
    modules = {**config.modules, "torch._inductor.config": {**config.modules["torch._inductor.config"],
                                                            "cpp.inject_relu_bug_TESTING_ONLY": "runtime_error"}}
    config = dataclasses.replace(config, modules=modules, changed=changed)
    outcome = replay_graph(repro.gm, repro.args, ReplaySettings(backend="eager", current_config=True),
                           Records(config=config))
    names = [d["name"] for d in outcome.differences if d["what"] == "config"]
    assert "torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY" in names
    assert outcome.config == "current"
    # Applied, the same setting is in force during the replay and so not listed as a difference.
    seen = {}

    def spy(gm, example_inputs):
        seen["value"] = torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY
        return gm

    import sys
    import types

    mod = types.ModuleType("replay_spy_backend")
    mod.spy = spy
    sys.modules["replay_spy_backend"] = mod
    try:
        outcome = replay_graph(repro.gm, repro.args, ReplaySettings(backend="replay_spy_backend:spy"),
                               Records(config=config))
    finally:
        del sys.modules["replay_spy_backend"]
    assert seen["value"] == "runtime_error"
    assert "torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY" not in [d["name"] for d in outcome.differences]
    assert torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY is None


def test_recorded_environment_variables_are_set_for_the_replay(archives, monkeypatch):
    from reproarchive.archive.loading import load

    repro = load(archives["compile"])
    env = EnvironmentRecord(variables={"TORCH_REPLAY_TEST_FLAG": "1", "TORCHINDUCTOR_CACHE_DIR": "/somewhere/else",
                                       "TORCH_LOGS": "+dynamo", "SECRET_TORCH_TOKEN": "<redacted>"})
    monkeypatch.delenv("TORCH_REPLAY_TEST_FLAG", raising=False)
    seen = {}

    def spy(gm, example_inputs):
        seen.update({k: os.environ.get(k) for k in env.variables})
        return gm

    import sys
    import types

    mod = types.ModuleType("replay_env_spy")
    mod.spy = spy
    monkeypatch.setitem(sys.modules, "replay_env_spy", mod)
    outcome = replay_graph(repro.gm, repro.args, ReplaySettings(backend="replay_env_spy:spy"),
                           Records(environment=env))
    assert seen["TORCH_REPLAY_TEST_FLAG"] == "1"
    assert seen["TORCHINDUCTOR_CACHE_DIR"] != "/somewhere/else"  # machine-specific: not copied
    assert seen["SECRET_TORCH_TOKEN"] != "<redacted>"
    assert "TORCH_REPLAY_TEST_FLAG" not in os.environ  # restored
    assert any("TORCH_LOGS" in w for w in outcome.warnings)  # only takes effect at import
