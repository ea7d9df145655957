"""Which device a replay runs on: resolved once, never silently another device type.

CUDA archives are made here without a GPU by rewriting a CPU archive's storage records
(``support.devices.with_storage_devices``), or by packing a graph whose device constant names
``cuda:0``; a machine that has CUDA skips the tests that need its absence.
"""

from __future__ import annotations

import json

import pytest
import torch

import reproarchive
from reproarchive.codec import devices as devices_mod
from reproarchive.codec.checks import recorded_devices
from reproarchive.codec.device_runtime import runtime
from reproarchive.codec.devices import DevicePlan, canonical, resolve_devices
from reproarchive.errors import DeviceUnavailableError, ReproArchiveError
from reproarchive.format.reader import ContainerReader
from support.captures import capture_failure
from support.cli import invoke
from support.devices import pack_with_device_constant, with_storage_devices

no_cuda = pytest.mark.skipif(runtime("cuda").available(), reason="needs a machine without CUDA")


def model(x, y):
    return torch.relu(x @ y).sum(1) * 2


@pytest.fixture(scope="module")
def cpu_archive(tmp_path_factory):
    """A real compile failure (PyTorch's cheap injector), captured on the CPU."""
    gen = torch.Generator().manual_seed(0)
    args = torch.randn(4, 4, generator=gen), torch.randn(4, 4, generator=gen)
    return capture_failure(tmp_path_factory.mktemp("dev") / "cpu.tar.zst", model, args,
                           "relu_compile_error_TESTING_ONLY")


@pytest.fixture(scope="module")
def cuda_archive(cpu_archive, tmp_path_factory):
    """The same archive, as a capture on cuda:0 records it."""
    return with_storage_devices(cpu_archive, tmp_path_factory.mktemp("dev") / "cuda.tar.zst", "cuda:0")


# ---------------------------------------------------------------------------------------------
# a device this machine lacks: cannot run here, unless asked to move


@no_cuda
def test_recorded_device_missing_is_cannot_run_here(cuda_archive):
    with ContainerReader(cuda_archive) as r:
        assert recorded_devices(r.index) == ["cuda:0"]  # a generator state's storage is host bytes
    with pytest.raises(DeviceUnavailableError) as err:
        reproarchive.run(cuda_archive, isolate=False)
    assert err.value.exit_code == 125 and "--device cpu" in err.value.hint
    result = invoke("run", cuda_archive)
    assert result.exit_code == 125, result.output
    assert result.output.startswith("error: the archive was recorded on cuda:0") and "--device cpu" in result.output
    assert "PASSED" not in result.output and "Traceback" not in result.output
    result = invoke("run", cuda_archive, "--json")
    assert result.exit_code == 125 and json.loads(result.stdout)["exit_code"] == 125


@no_cuda
def test_a_device_named_only_by_the_graph_counts_too(tmp_path):
    path = pack_with_device_constant(tmp_path / "c.tar.zst", "cuda:0", backend="aot_eager")
    with pytest.raises(DeviceUnavailableError, match="recorded on cuda:0"):
        reproarchive.run(path, isolate=False)
    assert reproarchive.run(path, device="cpu", isolate=False).same_device_type is False


@no_cuda
def test_moved_to_cpu_the_verdict_says_another_device_type(cuda_archive):
    outcome = reproarchive.run(cuda_archive, device="cpu", backend="eager", isolate=False)
    assert (outcome.status, outcome.exit_code) == ("passed", 0)
    assert (outcome.device, outcome.recorded_device, outcome.same_device_type) == ("cpu", "cuda:0", False)
    assert any("another device type" in w for w in outcome.warnings)
    result = invoke("run", cuda_archive, "--device", "cuda:0=cpu", "--backend", "eager", "--no-isolate")
    assert result.exit_code == 0, result.output
    first = result.output.splitlines()[0]
    assert first == "PASSED ON ANOTHER DEVICE TYPE (cpu, recorded on cuda:0) (exit 0)"
    data = json.loads(invoke("run", cuda_archive, "--device", "cpu", "--json", "--no-isolate").stdout)
    assert data["status"] == "reproduced" and data["same_device_type"] is False and data["recorded_device"] == "cuda:0"


@no_cuda
def test_an_isolated_replay_gets_the_parents_plan(cuda_archive):
    """The child side of ``--isolate``, called here: the request carries the parent's plan as
    JSON, and the child replays under it (checking nothing again) and reports it at start."""
    from reproarchive.replay.isolated_run import _replay
    from reproarchive.replay.isolation import _request

    plan = resolve_devices(["cuda:0"], "cpu")
    request = json.loads(json.dumps(_request(cuda_archive, reproarchive.ReplaySettings(), plan)))
    started = []
    result = _replay(request, started=started.append, event=None)
    assert (result["status"], result["recorded_device"], result["same_device_type"]) == ("reproduced", "cuda:0", False)
    assert (started[0]["device"], started[0]["recorded_device"], started[0]["same_device_type"]) == ("cpu", "cuda:0",
                                                                                                     False)


def test_same_device_is_a_faithful_replay(cpu_archive):
    outcome = reproarchive.run(cpu_archive, isolate=False)
    assert (outcome.status, outcome.recorded_device, outcome.same_device_type) == ("reproduced", "cpu", True)
    assert "ANOTHER DEVICE" not in invoke("run", cpu_archive, "--no-isolate").output


@no_cuda
def test_load_alone_still_falls_back_with_a_warning(cuda_archive):
    """``load`` is for looking at an archive's data: it moves a missing device to the CPU and
    says so; only a replay, which gives a verdict, refuses."""
    with pytest.warns(UserWarning, match="recorded device cuda:0 is not available here; loading on cpu"):
        repro = reproarchive.load(cuda_archive)
    assert repro.devices == {"cuda:0": "cpu"} and repro.args[0].device.type == "cpu"


# ---------------------------------------------------------------------------------------------
# cpu:0 is the CPU


def test_cpu_with_an_index_means_the_cpu(tmp_path):
    assert canonical("cpu:0") == "cpu" and canonical("cuda:1") == "cuda:1"
    path = pack_with_device_constant(tmp_path / "c.tar.zst", "cpu", backend="aot_eager")
    for spec in ("cpu:0", {"cpu": "cpu:0"}, {"cpu:0": "cpu"}):
        outcome = reproarchive.run(path, device=spec, isolate=False)
        # a "cpu:0" graph constant beside "cpu" inputs failed: "found at least two devices, cpu and cpu:0"
        assert (outcome.status, outcome.device, outcome.same_device_type) == ("passed", "cpu", True), outcome.observed
    result = invoke("run", path, "--device", "cpu:0", "--no-isolate")
    assert result.exit_code == 0 and result.output.startswith("PASSED (exit 0)"), result.output


# ---------------------------------------------------------------------------------------------
# a mapping names only devices the archive uses


def test_a_mapping_for_a_device_the_archive_does_not_use_is_an_error(cpu_archive):
    with pytest.raises(ReproArchiveError) as err:
        reproarchive.run(cpu_archive, device={"cuda:1": "cpu"}, isolate=False)
    assert err.value.exit_code == 2 and "cuda:1" in err.value.what and "it uses cpu" in err.value.what
    result = invoke("run", cpu_archive, "--device", "cuda:1=cpu,cpu=cpu")
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [(
        "error: the device mapping names cuda:1, which the archive does not use (it uses cpu); map one of the "
        "archive's devices (e.g. --device cuda:0=cpu), or move everything with --device cpu")]
    data = json.loads(invoke("run", cpu_archive, "--device", "cuda=cpu", "--json").stdout)
    assert data["exit_code"] == 2 and "does not use" in data["error"]["what"]


# ---------------------------------------------------------------------------------------------
# resolved once per run


def test_the_device_is_resolved_once_per_run(cpu_archive, monkeypatch):
    calls = []
    place = devices_mod._place
    monkeypatch.setattr(devices_mod, "_place", lambda *a: calls.append(a) or place(*a))
    reproarchive.run(cpu_archive, device="cpu", isolate=False)
    assert len(calls) == 1  # run resolves; load takes the plan as it is


def test_a_plan_crosses_a_process_boundary_as_plain_data():
    plan = resolve_devices(["cpu", "meta"], {"cpu:0": "cpu"})
    assert plan.targets == {"cpu": "cpu", "meta": "cpu"} and plan.moved == {} and plan.recorded == "cpu"
    assert DevicePlan.from_plain(json.loads(json.dumps(plan.to_plain()))) == plan


def test_recorded_devices_include_the_ones_a_graph_names_as_text(tmp_path):
    """``x.to("cuda:1")``, ``x.cuda()`` and ``device="meta"`` name devices as text; ``load``
    remaps them, so a replay must resolve them too."""
    from torch import fx

    g = fx.Graph()
    x = g.placeholder("x")
    moved = g.call_method("to", (x, "cuda:1"))
    cuda = g.call_method("cuda", (x,))
    empty = g.call_function(torch.ops.aten.empty.memory_format, ([2],), {"device": "meta"})
    g.output((moved, cuda, empty))
    path = reproarchive.pack(fx.GraphModule(torch.nn.Module(), g), [torch.randn(2)], tmp_path / "text.tar.zst")
    with ContainerReader(path) as r:
        assert recorded_devices(r.index) == ["cpu", "cuda:1", "cuda", "meta"]
