"""``RuntimeTests``: what every device runtime (``codec.device_runtime``) must do, as a suite its
tests subclass.

A subclass sets ``device``, the device its runtime serves (``"cuda:0"``, ``"xpu:0"``, a
PrivateUse1 backend's name); ``runtime(device)`` must return the runtime under test (register
it in ``codec.device_runtime._SPECIAL`` when torch's module for the device does not follow the
usual convention). Ours: ``tests/codec/test_device_runtime.py`` (cpu, cuda, and whatever
accelerator the machine has; ``device = None`` there means the machine has none).

On a machine with the device, every check runs: it is available and counted, its queued work
can be waited for, its generator state round-trips and ``forked_rng`` puts it back, free
memory is unknown or positive, its properties name it. On a machine without it, the runtime
is checked to say so (not available, no devices, free memory unknown), and the checks that
need the device skip with the reason: a device the machine lacks is the environment's
limit, not a capability the runtime may decline.
"""

from __future__ import annotations

import pytest
import torch

from reproarchive.codec.device_runtime import DeviceRuntime, devices_here, forked_rng, runtime

__all__ = ["RuntimeTests"]


class RuntimeTests:
    """Subclass with ``device``; name the subclass ``Test...``."""

    device: str | None = "cpu"

    @pytest.fixture
    def rt(self) -> DeviceRuntime:
        """The runtime of ``device``, on a machine that has the device."""
        if self.device is None:
            pytest.skip("this machine has no accelerator (test_says_whether_this_machine_has_it checked that)")
        rt = runtime(self.device)
        if not rt.available():
            pytest.skip(f"this machine has no {self.device} (test_says_whether_this_machine_has_it checked that)")
        return rt

    def test_says_whether_this_machine_has_it(self):
        """Never skipped: the device is there and counted, or the runtime says it is not."""
        if self.device is None:  # "this machine's accelerator", and it has none
            assert devices_here() == []
            return
        rt = runtime(self.device)
        assert rt.type == torch.device(self.device).type
        if rt.available():
            assert rt.device_count() >= 1
            return
        assert rt.device_count() == 0
        assert rt.free_memory(torch.device(self.device)) is None
        assert all(d.type != rt.type for d in devices_here())

    def test_is_available_and_counts_its_device(self, rt):
        assert rt.device_count() >= 1
        assert rt.type == torch.device(self.device).type

    def test_synchronize_returns(self, rt):
        torch.ones(8, device=self.device).sum()
        rt.synchronize(torch.device(self.device))

    def test_rng_state_round_trips(self, rt):
        state = rt.rng_state(self.device)
        first = torch.rand(16, device=self.device)
        rt.set_rng_state(self.device, state)
        assert torch.equal(torch.rand(16, device=self.device), first)

    def test_forked_rng_puts_every_listed_generator_back(self, rt):
        state, host = rt.rng_state(self.device), torch.get_rng_state()
        with forked_rng([torch.device(self.device)]):
            torch.rand(100, device=self.device)
            torch.rand(100)
        assert torch.equal(rt.rng_state(self.device).cpu(), state.cpu())
        assert torch.equal(torch.get_rng_state(), host)

    def test_free_memory_is_unknown_or_positive(self, rt):
        free = rt.free_memory(torch.device(self.device))
        assert free is None or (isinstance(free, int) and free > 0)

    def test_properties_name_the_device(self, rt):
        props = rt.properties(torch.device(self.device))
        assert props["type"] == torch.device(self.device).type
