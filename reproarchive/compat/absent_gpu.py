"""Compiling for a CUDA device this machine does not have, from its recorded description.

Most torch.compile bugs of GPU jobs fail while compiling (Dynamo, AOTAutograd, an Inductor
lowering, Triton code generation, Triton's compiler), before any kernel runs. Such a failure
needs the device's description, not the device: fake tensors carry ``device="cuda:0"``, Inductor
reads the device's properties (compute capability, SM count, warp size, shared memory) to choose
its code, and Triton compiles to PTX and a cubin for a named target (``GPUTarget("cuda", 90,
32)``) with its own ``ptxas`` and no driver.

torch offers no seam for "a CUDA device that is described, not present", so ``compiling_for``
makes one for the length of a compile, and takes it down after:

* ``torch.cuda`` answers from the description: available, the device count, properties,
  capability and name; initialisation, device switches and generator states are no-ops (a
  compile only saves and restores them);
* Triton's active driver is one that names the recorded target and launches nothing, and the
  generated kernel modules do not set up the GPU driver when they load;
* every Triton kernel is compiled for the target and left there (``precompile`` with
  ``warm_cache_only``: the compile-worker's path, which builds the cubin and loads no module
  into a driver);
* Inductor's pattern passes trace their search patterns once per device with real tensors;
  for an absent CUDA device they are traced on the CPU (a replacement is re-traced at its
  match, on the match's fake tensors). A pattern whose decomposition differs on CUDA would
  then not match here, where on the GPU it would: an approximation, in the docs;
* the Python calls that reach CUDA's device guard on a fake tensor (a literal, indexing) take
  another way (``compat.device_guards``);
* the one choice Inductor makes by default by timing kernels on the device while compiling,
  whether padding a matmul's shapes makes it faster (``pad_mm``), is answered "no" and counted
  (``Skipped.pad_mm``), so the verdict can say the compile may have differed there. Settings
  that benchmark more (``max_autotune`` ...) are refused before the compile
  (``replay.compile_only``).

Nothing is launched: the compiled callable is never called. This needs a CUDA build of torch
(a CPU-only build stops earlier, "not linked with support for cuda devices") and Triton with its
NVIDIA backend: ``unavailable_reason`` says which is missing.

Checked with the CUDA wheels of 2.15.0 and 2.11.0 from the registry, on a machine without a GPU
or a driver (``tests/replay/test_compile_only.py`` in CI's matrix); 2.11's fake tensors also
allocate one tensor on the device when first made (``init_gpu_context``), which is skipped.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator, Mapping
from typing import Any

from reproarchive.compat.device_guards import guard_free_getitem, without_device_guards

CHECKED_WITH = ("2.11.0", "2.13.0", "2.15.0")

PRIVATE_NAMES = (
    "torch._dynamo.device_interface.CudaInterface",
    "torch._inductor.fx_passes.joint_graph",
    "torch._inductor.fx_passes.joint_graph.lazy_init",
    "torch._inductor.fx_passes.pad_mm",
    "torch._inductor.runtime.triton_helpers",
    "torch._inductor.runtime.triton_helpers.set_driver_to_gpu",
    "torch._inductor.runtime.triton_heuristics",
    "torch._inductor.runtime.triton_heuristics.CachingAutotuner",
    "torch._inductor.runtime.triton_heuristics.CachingAutotuner.precompile",
    "torch._subclasses.fake_tensor",
    "torch.cuda._exchange_device",
    "torch.cuda._lazy_init",
    "torch.cuda._maybe_exchange_device",
    "torch.utils._triton.has_triton",
    "torch.utils._triton.has_triton.cache_clear",
)


def unavailable_reason() -> str | None:
    """Why this process cannot compile for an absent CUDA device (None: it can)."""
    import torch

    if not torch.backends.cuda.is_built():
        return (f"this torch ({torch.__version__}) is a CPU-only build, and compiling for a CUDA device without "
                "it needs a CUDA build of torch (pip's default torch wheel is one; it runs without a GPU)")
    try:
        import triton
        from triton.backends.compiler import GPUTarget  # noqa: F401 - the target the compile names

        if "nvidia" not in triton.backends.backends:
            return f"Triton {triton.__version__} here has no NVIDIA backend"
    except ImportError:
        return "Triton is not installed here (it comes with CUDA builds of torch)"
    return None


class Skipped:
    """What the compile would have timed on the device and did not: ``pad_mm`` is how many
    matmuls Inductor asked to time padded and unpadded (each left unpadded)."""

    def __init__(self) -> None:
        self.pad_mm = 0


@contextlib.contextmanager
def compiling_for(gpus: Mapping[int, Mapping[str, Any]]) -> Iterator[Skipped]:
    """For the ``with`` body, ``torch.cuda`` and Triton describe the devices ``gpus`` (device
    index -> the properties CUDA's ``get_device_properties`` would give: ``name``,
    ``major``, ``minor``, ``multi_processor_count``, ``warp_size`` ...), and every compile stops
    at the cubin (module docstring). ``gpus`` must not be empty; the first is current."""
    from torch.utils._triton import has_triton
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    first = min(gpus)
    props = {i: types.SimpleNamespace(**dict(p)) for i, p in gpus.items()}
    skipped = Skipped()
    with _patched([*_cuda_answers(props, first), *_compile_stops(skipped)]):
        target = GPUTarget("cuda", props[first].major * 10 + props[first].minor, props[first].warp_size)
        driver.set_active(_DescribedDriver(target, first))
        has_triton.cache_clear()  # cached by the first compile in this process: "no GPU, no Triton"
        try:
            with without_device_guards():
                yield skipped
        finally:
            driver.reset_active() if driver._default is not None else setattr(driver, "_active", None)
            has_triton.cache_clear()


def _cuda_answers(props: Mapping[int, Any], first: int) -> list[tuple[Any, str, Any]]:
    """What ``torch.cuda`` and Dynamo's CUDA device interface answer from ``props``."""
    import torch
    from torch._dynamo.device_interface import CudaInterface

    def properties(device: Any = None) -> Any:
        return props[_index(device, first)]

    def capability(device: Any = None) -> tuple[int, int]:
        return (properties(device).major, properties(device).minor)

    count, bf16 = max(props) + 1, props[first].major >= 8
    cuda = torch.cuda
    return [
        (cuda, "is_available", lambda: True),
        (cuda, "is_initialized", lambda: True),
        (cuda, "device_count", lambda: count),
        (cuda, "current_device", lambda: first),
        (cuda, "get_device_properties", properties),
        (cuda, "get_device_capability", capability),
        (cuda, "get_device_name", lambda device=None: properties(device).name),
        (cuda, "_lazy_init", lambda: None),
        (cuda, "_exchange_device", lambda device: first),
        (cuda, "_maybe_exchange_device", lambda device: first),
        (cuda, "get_rng_state", lambda device="cuda": torch.zeros(16, dtype=torch.uint8)),
        (cuda, "set_rng_state", lambda new_state, device="cuda": None),
        (cuda, "get_rng_state_all", lambda: [torch.zeros(16, dtype=torch.uint8) for _ in props]),
        (cuda, "set_rng_state_all", lambda new_states: None),
        (cuda, "synchronize", lambda device=None: None),
        (cuda, "is_bf16_supported", lambda including_emulation=True: bf16),
        # Dynamo's device interface bound torch.cuda's functions when it was imported
        (CudaInterface, "current_device", staticmethod(lambda: first)),
        (CudaInterface, "device_count", staticmethod(lambda: count)),
        (CudaInterface, "get_device_properties", staticmethod(properties)),
        (CudaInterface, "exchange_device", staticmethod(lambda device: first)),
        (CudaInterface, "maybe_exchange_device", staticmethod(lambda device: first)),
        (CudaInterface, "synchronize", staticmethod(lambda device=None: None)),
        (CudaInterface, "is_bf16_supported", staticmethod(lambda including_emulation=False: bf16)),
        (CudaInterface, "get_raw_stream", staticmethod(lambda device_index: 0)),
    ]


def _compile_stops(skipped: Skipped) -> list[tuple[Any, str, Any]]:
    """Inductor's steps that would reach the device, made to stop short of it (module docstring)."""
    import torch
    import torch._inductor.fx_passes.joint_graph as joint_graph
    import torch._inductor.fx_passes.pad_mm as pad_mm
    import torch._inductor.runtime.triton_helpers as triton_helpers
    import torch._subclasses.fake_tensor as fake_tensor
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    def unpadded(*args: Any, **kwargs: Any) -> bool:
        skipped.pad_mm += 1
        return False

    return [
        (torch.Tensor, "__getitem__", guard_free_getitem()),
        (triton_helpers, "set_driver_to_gpu", lambda: None),
        (fake_tensor, "init_gpu_context", lambda device: None),  # 2.11 allocates on the device once
        (joint_graph, "lazy_init", _patterns_on_host(joint_graph.lazy_init)),
        (pad_mm, "_should_pad", unpadded),  # the part of should_pad that times both on the device
        (CachingAutotuner, "precompile", _warm_cache_only(CachingAutotuner.precompile)),
    ]


@contextlib.contextmanager
def _patched(patches: list[tuple[Any, str, Any]]) -> Iterator[None]:
    """Each ``(owner, name, value)`` set for the ``with`` body, and put back as it was after."""
    saved = [(owner, name, owner.__dict__.get(name, _MISSING)) for owner, name, _ in patches]
    for owner, name, value in patches:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in saved:
            if value is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


_MISSING = object()


def _index(device: Any, default: int) -> int:
    import torch

    if device is None:
        return default
    if isinstance(device, int):
        return device
    dev = torch.device(device)
    return default if dev.index is None else dev.index


def _patterns_on_host(lazy_init: Any) -> Any:
    """Inductor's pattern initialiser, tracing the patterns of a CUDA device on the CPU."""
    import torch

    def traced_on_host(input_device: Any = None, *args: Any, **kwargs: Any) -> Any:
        if input_device is not None and torch.device(input_device).type == "cuda":
            input_device = torch.device("cpu")
        return lazy_init(input_device, *args, **kwargs)

    return traced_on_host


def _warm_cache_only(precompile: Any) -> Any:
    """``CachingAutotuner.precompile`` that compiles every config for the target and stops."""

    def compile_only(self: Any, warm_cache_only: bool = False, *args: Any, **kwargs: Any) -> Any:
        return precompile(self, True, *args, **kwargs)

    return compile_only


class _DescribedDriver:
    """Triton's driver for a described device: it names the target, and has no device."""

    def __init__(self, target: Any, index: int) -> None:
        self.target, self.index = target, index

    def get_current_target(self) -> Any:
        return self.target

    def get_current_device(self) -> int:
        return self.index

    def get_current_stream(self, device: Any = None) -> int:
        return 0

    def get_active_torch_device(self) -> Any:
        import torch

        return torch.device("cuda", self.index)

    def get_device_interface(self) -> Any:
        import torch

        return torch.cuda

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"the device is described, not present: Triton's driver has no {name!r} here "
                           "(compile-only replay launches nothing)")


def moved_fake(fake: Any, device: Any) -> Any:
    """``fake`` (a fake tensor, made from a meta tensor) said to live on ``device``: a fake
    tensor's device is its own attribute, over the meta tensor it wraps (what
    ``FakeTensorConverter.from_meta_and_device`` sets)."""
    import torch

    fake.fake_device = torch.device(device)
    return fake
