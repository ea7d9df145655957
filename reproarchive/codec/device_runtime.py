"""Everything the library does that depends on the kind of device, one runtime per device type.

Replay, accuracy, containment, capture and the memory check need four things from a device:
wait for its queued work (so an asynchronous kernel error lands in the stage that caused it),
read and restore its random generators (so eager, fp64 and compiled runs draw the same
numbers, and a replay leaves the caller's generators as they were), ask how much memory is
free (so a load is refused before it allocates), and describe it (for the system record and
the reports). They ask through ``runtime(device)`` and never name a device API themselves;
``tests/codec/test_device_runtime.py`` greps the library to keep it so.

Runtimes here:

- ``CpuRuntime``: nothing to wait for, the default generator, host memory (cgroup-aware).
- ``ModuleRuntime``: any device type whose torch module (``torch.get_device_module``) has the
  usual functions (``synchronize``, ``get_rng_state``/``set_rng_state``, ``device_count``,
  optionally ``mem_get_info`` and ``get_device_properties``): xpu, mps, and PrivateUse1
  backends that follow the convention. A function the module lacks gives "unknown" (``None``),
  never a guess.
- ``CudaRuntime``: a ``ModuleRuntime`` over ``torch.cuda`` (ROCm builds too) that also knows
  the compute capability and what the system record's ``cuda`` section holds.

To add a device type (the numbered recipe, as safetensors' loader does for a device path):

1. If its torch module follows the convention above, nothing: ``runtime("xpu")`` already
   returns a ``ModuleRuntime`` for it. Check ``properties`` and ``free_memory`` say what you
   expect on a machine that has the device.
2. Otherwise, subclass ``DeviceRuntime`` (or ``ModuleRuntime`` to override one method) in this
   module and give every method an honest answer; ``None`` where the device cannot tell.
3. Register it in ``_SPECIAL`` under its ``torch.device(...).type``.
4. Subclass ``reproarchive.testing.device_runtimes.RuntimeTests`` (ours are in
   ``tests/codec/test_device_runtime.py``) with a ``device``: the conformance checks run on a
   machine with the device; elsewhere the runtime is checked to say it has none, and the
   checks that need the device skip, saying why.
5. If the device needs new facts in an archive (a system section like ``cuda``), that is a
   format change: ``spec/FORMAT.md``, a version rule and the schema, not this module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import platform
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from reproarchive.compat.absent_gpu import compiling_for, unavailable_reason


class DeviceRuntime:
    """One device type's runtime: the operations the library needs, each with a safe default."""

    type = "?"

    def available(self) -> bool:
        """Whether this machine has at least one such device that torch can use."""
        return False

    def device_count(self) -> int:
        return 0

    def synchronize(self, device: Any) -> None:
        """Wait until the work queued on ``device`` has finished (raising its errors)."""

    def rng_state(self, device: Any) -> Any:
        """The state of ``device``'s default random generator (a tensor to pass back)."""
        raise NotImplementedError(f"{self.type} has no random generator state here")

    def set_rng_state(self, device: Any, state: Any) -> None:
        raise NotImplementedError(f"{self.type} has no random generator state here")

    def free_memory(self, device: Any) -> int | None:
        """Bytes that can still be allocated on ``device``; None when the device cannot tell."""
        return None

    def properties(self, device: Any) -> dict[str, Any]:
        """What the device is (``name``, ``total_memory`` where known), as plain data."""
        return {"type": self.type}


class CpuRuntime(DeviceRuntime):
    """The host: synchronous, one default generator, memory as the kernel and cgroup allow."""

    type = "cpu"

    def available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def rng_state(self, device: Any) -> Any:
        import torch

        return torch.get_rng_state()

    def set_rng_state(self, device: Any, state: Any) -> None:
        import torch

        torch.set_rng_state(state)

    def free_memory(self, device: Any) -> int | None:
        return available_host_memory()

    def properties(self, device: Any) -> dict[str, Any]:
        return {"type": "cpu", "name": platform.processor() or platform.machine(), "count": os.cpu_count()}


class ModuleRuntime(DeviceRuntime):
    """A device type served by a torch module with the usual functions (``torch.xpu``,
    ``torch.mps``, ``torch.cuda``); ``module`` is that module (tests pass a stand-in)."""

    def __init__(self, device_type: str, module: Any):
        self.type = device_type
        self.module = module

    def _call(self, name: str, *args: Any, default: Any = None) -> Any:
        fn = getattr(self.module, name, None)
        return default if fn is None else fn(*args)

    def available(self) -> bool:
        try:
            return bool(self._call("is_available", default=False))
        except Exception:  # noqa: BLE001 - a broken driver is "not available", not a crash
            return False

    def device_count(self) -> int:
        return int(self._call("device_count", default=1 if self.available() else 0))

    def synchronize(self, device: Any) -> None:
        self._call("synchronize", device)

    def _index(self, device: Any) -> int:
        """The index a module function wants: ``cuda`` alone means the current device."""
        index = device if isinstance(device, int) else _device(device).index
        return int(self._call("current_device", default=0)) if index is None else index

    def rng_state(self, device: Any) -> Any:
        return self.module.get_rng_state(self._index(device))

    def set_rng_state(self, device: Any, state: Any) -> None:
        self.module.set_rng_state(state, self._index(device))

    def free_memory(self, device: Any) -> int | None:
        if not hasattr(self.module, "mem_get_info") or not self.available():
            return None
        try:
            return int(self.module.mem_get_info(self._index(device))[0])
        except RuntimeError:  # a device that cannot be queried: unknown, not zero
            return None

    def properties(self, device: Any) -> dict[str, Any]:
        info: dict[str, Any] = {"type": self.type, "index": self._index(device)}
        props = self._call("get_device_properties", self._index(device))
        if props is not None:
            info["name"] = getattr(props, "name", None)
            total = getattr(props, "total_memory", None)
            info["total_memory"] = None if total is None else int(total)
        return info


#: The properties of a CUDA device Inductor and Triton read when compiling for it, beyond its
#: name, capability and SM count; the system record keeps them (spec §8 ``system``).
COMPILE_PROPERTIES = ("warp_size", "regs_per_multiprocessor", "max_threads_per_multi_processor",
                      "shared_memory_per_block", "shared_memory_per_block_optin")


class CudaRuntime(ModuleRuntime):
    """``torch.cuda`` (NVIDIA and ROCm builds): adds compute capability and the system record."""

    def __init__(self, module: Any = None):
        if module is None:
            import torch

            module = torch.cuda
        super().__init__("cuda", module)

    def properties(self, device: Any) -> dict[str, Any]:
        info = super().properties(device)
        props = self._call("get_device_properties", self._index(device))
        if props is not None:
            info.update(capability=f"{props.major}.{props.minor}",
                        multi_processor_count=int(props.multi_processor_count),
                        arch=getattr(props, "gcnArchName", None),
                        # what a compile for this device reads (a compile without it: codec.gpu_description)
                        **{k: getattr(props, k) for k in COMPILE_PROPERTIES if getattr(props, k, None) is not None})
        return info

    def system_info(self, torch: Any, driver_version: str | None) -> dict[str, Any]:
        """The system record's ``cuda`` section: build, availability (or why not), devices."""
        info: dict[str, Any] = {"available": False, "version": torch.version.cuda}
        try:
            info["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        except Exception:  # noqa: BLE001 - a broken cudnn must not break a capture
            info["cudnn"] = None
        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            info["reason"] = f"this torch build has no CUDA/ROCm support ({torch.__version__})"
            info["driver_version"] = driver_version
            return info
        try:
            available = bool(self.module.is_available())
        except Exception as exc:  # noqa: BLE001
            available = False
            info["reason"] = f"torch.cuda.is_available() raised {type(exc).__name__}: {exc}"
        if not available:
            info.setdefault(
                "reason",
                "no usable GPU (no device, no driver, or CUDA_VISIBLE_DEVICES="
                f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')!s})",
            )
            info["driver_version"] = driver_version
            return info
        devices = []
        for index in range(self.module.device_count()):
            try:
                props = self.properties(index)
            except Exception as exc:  # noqa: BLE001 - one broken device is reported, not fatal
                devices.append({"index": index, "error": f"{type(exc).__name__}: {exc}"})
                continue
            devices.append({key: props[key] for key in ("index", "name", "capability", "total_memory",
                                                       "multi_processor_count", "arch", *COMPILE_PROPERTIES)
                            if key in props})
        info.update(
            available=True,
            device_count=len(devices),
            devices=devices,
            driver_version=driver_version,
            arch_list=list(self.module.get_arch_list()) if hasattr(self.module, "get_arch_list") else None,
        )
        return info


class DescribedCudaRuntime(DeviceRuntime):
    """CUDA devices this machine lacks, known by their recorded description
    (``codec.gpu_description``): nothing here to wait for, draw from or allocate on, but a
    compile can be made for them (``compiling``: ``replay.compile_only``). ``gpus`` maps a device
    index to the properties the recording machine's ``get_device_properties`` gave."""

    type = "cuda"

    def __init__(self, gpus: dict[int, dict[str, Any]]):
        self.gpus = {int(i): dict(p) for i, p in gpus.items()}

    def properties(self, device: Any) -> dict[str, Any]:
        return {"type": "cuda", **self.gpus[self._index(device)], "described": True}

    def _index(self, device: Any) -> int:
        import torch

        dev = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
        return min(self.gpus) if dev.index is None else dev.index

    @staticmethod
    def unavailable_reason() -> str | None:
        """Why this process cannot compile for a described device (None: it can)."""

        return unavailable_reason()

    def compiling(self) -> contextlib.AbstractContextManager:
        """For the ``with`` body, torch and Triton see these devices, and every compile stops at
        the cubin (``compat.absent_gpu``); yields what the compile could not time on them."""

        return compiling_for(self.gpus)


class MetaRuntime(DeviceRuntime):
    """``meta`` tensors hold no data: nothing to wait for, no generator, no memory."""

    type = "meta"

    def available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def free_memory(self, device: Any) -> int | None:
        return None


_SPECIAL: dict[str, type[DeviceRuntime]] = {"cpu": CpuRuntime, "cuda": CudaRuntime, "meta": MetaRuntime}


@functools.cache
def _runtime_of_type(device_type: str) -> DeviceRuntime:
    if device_type in _SPECIAL:
        return _SPECIAL[device_type]()
    import torch

    try:
        module = torch.get_device_module(device_type)
    except (RuntimeError, AttributeError):
        return _Unsupported(device_type)
    return ModuleRuntime(device_type, module)


class _Unsupported(DeviceRuntime):
    """A device type torch names but serves with no runtime module here: never available."""

    def __init__(self, device_type: str):
        self.type = device_type


def runtime(device: Any) -> DeviceRuntime:
    """The runtime of ``device`` (a ``torch.device``, a name like ``cuda:1``, or a type)."""
    return _runtime_of_type(_device(device).type)


def cuda_runtime() -> CudaRuntime:
    """The CUDA runtime, for the system record's ``cuda`` section (recorded on every machine)."""
    return _runtime_of_type("cuda")  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------
# what the library calls


def devices_of(values: Iterable[Any]) -> list[Any]:
    """The distinct devices (other than cpu and meta) that the tensors among ``values`` are on,
    nested lists, tuples and dicts included, in first-seen order."""
    import torch

    found: dict[Any, None] = {}

    def walk(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            if value.device.type not in ("cpu", "meta"):
                found.setdefault(value.device, None)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)

    walk(list(values))
    return list(found)


def synchronize(devices: Iterable[Any]) -> None:
    """Wait for every listed device, so an asynchronous error surfaces in the current stage."""
    for device in devices:
        runtime(device).synchronize(device)


def devices_here() -> list[Any]:
    """Every accelerator device of this machine (``torch.accelerator``'s type, every index)."""
    import torch

    accelerator = torch.accelerator.current_accelerator(check_available=True)
    if accelerator is None:
        return []
    count = runtime(accelerator).device_count()
    return [torch.device(accelerator.type, i) for i in range(count)]


@dataclasses.dataclass(frozen=True)
class RngState:
    """The CPU generator's state and each listed device's, to put back with ``restore``."""

    states: tuple[tuple[Any, Any], ...]

    @classmethod
    def capture(cls, devices: Iterable[Any] = ()) -> RngState:
        return cls.reader(devices)()

    @classmethod
    def reader(cls, devices: Iterable[Any] = ()) -> Callable[[], RngState]:
        """``capture`` of ``devices``, their runtimes resolved once: what a capture calls before
        every call of a graph that draws (a compiled graph's inputs keep their devices), where
        resolving them each time would cost more than reading the states."""
        wanted = [_device("cpu"), *(d for d in map(_device, devices) if d.type != "cpu")]
        pairs = tuple((d, runtime(d)) for d in dict.fromkeys(wanted))
        return lambda: cls(tuple((d, rt.rng_state(d)) for d, rt in pairs))

    def restore(self) -> None:
        for device, state in self.states:
            runtime(device).set_rng_state(device, state)


@contextlib.contextmanager
def forked_rng(devices: Iterable[Any] = ()) -> Iterator[RngState]:
    """The CPU generator and each listed device's put back after the body, whatever it drew
    (``torch.random.fork_rng`` for several device types at once); yields the saved state."""
    saved = RngState.capture(devices)
    try:
        yield saved
    finally:
        saved.restore()


def free_memory(device: Any) -> int | None:
    """Bytes that can still be allocated on ``device`` (host memory for the CPU); None: unknown."""
    return runtime(device).free_memory(device)


def available_host_memory() -> int | None:
    """Bytes this process can still get: the kernel's MemAvailable, bounded by the cgroup's
    memory limit where there is one (containers); None where neither can be read."""
    found: list[int] = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
                break
    except (OSError, ValueError, IndexError):
        pass
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            limit = Path(limit_file).read_text().strip()
            usage = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < (1 << 60):
            found.append(max(int(limit) - usage, 0))
        break
    if not found and hasattr(os, "sysconf"):
        try:
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError):
            pass
    return min(found) if found else None


def _device(device: Any) -> Any:
    import torch

    return device if isinstance(device, torch.device) else torch.device(device)
