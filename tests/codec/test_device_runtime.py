"""The device seam: every device-specific call goes through ``codec/device_runtime.py``.

``RuntimeTests`` (``reproarchive.testing.device_runtimes``) is the conformance suite a runtime's
tests subclass (the recipe in the module's docstring, step 4): its checks run on a real device;
where this machine has none, the runtime is checked to say so and the checks that need the
device skip. The adapter logic over a torch device module (which function gets which index, what "unknown" looks
like) is also checked against a stand-in module, since this machine has no GPU.
"""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest
import torch

from reproarchive.codec import device_runtime
from reproarchive.codec.device_runtime import (
    CpuRuntime,
    CudaRuntime,
    ModuleRuntime,
    RngState,
    devices_here,
    devices_of,
    runtime,
)
from reproarchive.testing.device_runtimes import RuntimeTests

ROOT = Path(__file__).resolve().parents[2]

# Files outside the runtime module that may name torch.cuda, and why. Keep it this short.
ALLOWED: dict[str, str] = {
    "reproarchive/compat/absent_gpu.py": "what DescribedCudaRuntime.compiling stands on: torch.cuda itself answering "
                                         "from a recorded description while a compile for an absent GPU runs; its "
                                         "private names must be listed there (tests/test_private_torch.py)",
}


def test_no_device_api_outside_the_runtime_module():
    found = []
    for folder in ("reproarchive", "cli"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "reproarchive/codec/device_runtime.py" or rel in ALLOWED:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(r"\btorch\.cuda\.|\.is_cuda\b", line):
                    found.append(f"{rel}:{number}: {line.strip()}")
    assert found == [], "device-specific code belongs in reproarchive/codec/device_runtime.py"


# ---------------------------------------------------------------------------------------------
# the conformance suite, on every runtime this machine may have


class TestCpuRuntime(RuntimeTests):
    device = "cpu"

    def test_host_memory_is_known_here(self, rt):
        assert isinstance(rt, CpuRuntime)
        assert rt.free_memory(torch.device("cpu")) > 0  # Linux: /proc/meminfo


class TestCudaRuntime(RuntimeTests):
    device = "cuda:0"


class TestAcceleratorRuntime(RuntimeTests):
    """Whatever accelerator this machine has (xpu, mps, ...), through its torch module."""

    device = getattr(torch.accelerator.current_accelerator(), "type", None)


# ---------------------------------------------------------------------------------------------
# dispatch, and the adapter over a device module


def test_dispatch_by_device_type():
    assert isinstance(runtime("cpu"), CpuRuntime)
    assert isinstance(runtime(torch.device("cuda", 1)), CudaRuntime)
    assert isinstance(runtime("cuda"), CudaRuntime)
    xpu = runtime("xpu")
    assert type(xpu) is ModuleRuntime and xpu.type == "xpu"
    assert runtime("meta").free_memory("meta") is None


@pytest.mark.skipif(torch.accelerator.is_available(), reason="this machine has an accelerator")
def test_no_accelerator_here_means_no_devices_and_nothing_available():
    assert devices_here() == []
    assert not runtime("cuda").available() and runtime("cuda").free_memory("cuda:0") is None
    assert not runtime("mps").available()


def test_devices_of_finds_accelerator_tensors_only():
    meta = torch.empty(2, device="meta")
    assert devices_of([torch.ones(1), [meta, {"a": torch.ones(1)}], 3]) == []


def test_rng_state_captures_cpu_and_restores_it():
    saved = RngState.capture()
    first = torch.rand(8)
    saved.restore()
    assert torch.equal(torch.rand(8), first)


class FakeCuda:
    """Stands in for ``torch.cuda`` on a machine with two GPUs: the functions the runtime
    calls, with torch's signatures; it records the calls."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.states = {0: torch.tensor([0], dtype=torch.uint8), 1: torch.tensor([1], dtype=torch.uint8)}

    def is_available(self):
        return True

    def device_count(self):
        return 2

    def current_device(self):
        return 1

    def synchronize(self, device=None):
        self.calls.append(("synchronize", device))

    def get_rng_state(self, device="cuda"):
        self.calls.append(("get_rng_state", device))
        return self.states[device]

    def set_rng_state(self, state, device="cuda"):
        self.calls.append(("set_rng_state", device))
        self.states[device] = state

    def mem_get_info(self, device=None):
        return (3 << 30, 16 << 30) if device == 1 else (1 << 30, 16 << 30)

    def get_device_properties(self, device):
        return types.SimpleNamespace(name=f"Fake GPU {device}", major=9, minor=0, total_memory=16 << 30,
                                     multi_processor_count=132, warp_size=32, regs_per_multiprocessor=65536,
                                     max_threads_per_multi_processor=2048, shared_memory_per_block=49152,
                                     shared_memory_per_block_optin=232448)

    def get_arch_list(self):
        return ["sm_90"]


def test_cuda_runtime_asks_the_module_for_the_right_device():
    fake = FakeCuda()
    rt = CudaRuntime(fake)
    assert rt.available() and rt.device_count() == 2
    assert rt.free_memory(torch.device("cuda", 1)) == 3 << 30
    assert rt.free_memory("cuda") == 3 << 30  # "cuda" alone is the current device (1 here)
    state = rt.rng_state("cuda:0")
    rt.set_rng_state("cuda:0", torch.tensor([7], dtype=torch.uint8))
    assert fake.states[0].item() == 7 and state.item() == 0
    assert ("get_rng_state", 0) in fake.calls and ("set_rng_state", 0) in fake.calls
    rt.synchronize(torch.device("cuda", 1))
    assert fake.calls[-1] == ("synchronize", torch.device("cuda", 1))
    props = rt.properties("cuda:1")
    assert props["name"] == "Fake GPU 1" and props["capability"] == "9.0" and props["total_memory"] == 16 << 30


def test_cuda_system_section_lists_every_device():
    fake_torch = types.SimpleNamespace(
        __version__="2.13.0+cu128", version=types.SimpleNamespace(cuda="12.8", hip=None),
        backends=types.SimpleNamespace(cudnn=types.SimpleNamespace(is_available=lambda: True, version=lambda: 91000)))
    info = CudaRuntime(FakeCuda()).system_info(fake_torch, "570.1")
    assert info["available"] and info["device_count"] == 2 and info["driver_version"] == "570.1"
    assert [d["name"] for d in info["devices"]] == ["Fake GPU 0", "Fake GPU 1"]
    assert info["devices"][0]["capability"] == "9.0" and info["arch_list"] == ["sm_90"] and info["cudnn"] == 91000
    # what a compile for the device reads is recorded, so a compile without it derives nothing
    from reproarchive.codec.gpu_description import describe
    from reproarchive.format.plain import from_plain
    from reproarchive.format.schema import SystemRecord

    assert info["devices"][1]["shared_memory_per_block_optin"] == 232448 and info["devices"][1]["warp_size"] == 32
    (gpu,) = describe(from_plain(SystemRecord, {"cuda": info}), ["cuda:1"])
    assert gpu.derived == () and gpu.said() == "cuda:1 sm_90 (Fake GPU 1)"


def test_cuda_system_section_on_this_build_says_why_not():
    info = device_runtime.cuda_runtime().system_info(torch, None)
    if torch.version.cuda is None:
        assert info["available"] is False and "no CUDA/ROCm support" in info["reason"]


def test_a_module_without_memory_or_properties_says_unknown():
    """mps has no ``mem_get_info`` and no ``get_device_properties``: unknown, never a guess."""
    module = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 1)
    rt = ModuleRuntime("mps", module)
    assert rt.free_memory("mps") is None
    assert rt.properties("mps") == {"type": "mps", "index": 0}
