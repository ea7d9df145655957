"""Which device a replay runs on, and whether this machine has it.

A teammate replays on whatever they have: a CUDA archive must run on CPU when asked
(``--device cpu`` or ``{"cuda:0": "cpu"}``), and asking for a device this machine lacks is
"cannot run here" (exit 125), never a crash halfway through a replay. Inputs are moved by
``reproarchive.load``; the graph itself can also name devices (``torch.ones(..., device=...)``,
``.to("cuda")``), so those constants are remapped here too.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Union

from reproarchive.errors import DeviceUnavailableError, IndexSchemaError, ReproArchiveError

DeviceSpec = Union[None, str, Mapping[str, str]]


def _device(name: str):
    import torch

    try:
        return torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        raise ReproArchiveError(f"{name!r} is not a device name", "use cpu, cuda, cuda:1, mps, ...") from None


def check_recorded_device(name: str) -> None:
    """A device an (already validated) archive names must be a device type this torch knows;
    otherwise the archive needs a torch build that has it (IndexSchemaError, exit 2)."""
    import torch

    try:
        torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        raise IndexSchemaError(
            f"device {name[:40]!r} is unknown to this torch {torch.__version__}",
            "replay with the torch version recorded in the archive",
        ) from None


def is_available(name: str) -> bool:
    """Whether ``name`` names a device this machine has (cpu and meta always)."""
    try:
        check_available(name)
    except DeviceUnavailableError:
        return False
    return True


def loader_mapping(spec: DeviceSpec) -> Callable[[str], str]:
    """recorded device -> device to use, for loading an archive under ``spec``.

    Devices the spec maps go where it says (every target checked up front: exit 125 if one is
    missing); any other recorded device stays where it was when this machine has it, and goes
    to the CPU otherwise (``meta`` always does: it never held data).
    """
    if spec is not None and not isinstance(spec, (str, Mapping)):
        spec = str(spec)  # a torch.device
    check_spec(spec)

    def mapped(recorded: str) -> str:
        target = target_for(recorded, spec)
        if target != recorded:
            return target
        return recorded if _device(recorded).type != "meta" and is_available(recorded) else "cpu"

    return mapped


def check_available(name: str) -> None:
    """Raise DeviceUnavailableError (exit 125) unless ``name`` exists on this machine."""
    import torch

    dev = _device(name)
    if dev.type in ("cpu", "meta"):
        return
    backend = getattr(torch, dev.type, None)
    is_available = getattr(backend, "is_available", None)
    if is_available is None or not is_available():
        raise DeviceUnavailableError(
            f"device {name!r} is not available on this machine",
            "replay on another device with --device cpu (or a mapping like cuda:0=cpu)",
        )
    count = getattr(backend, "device_count", lambda: 1)()
    if dev.index is not None and dev.index >= count:
        raise DeviceUnavailableError(
            f"device {name!r} does not exist here (this machine has {count} {dev.type} device(s))",
            f"pick one of {dev.type}:0..{count - 1} with --device",
        )


def check_spec(spec: DeviceSpec) -> None:
    """Check every target device a spec names, before anything is loaded."""
    if spec is None:
        return
    targets = [spec] if isinstance(spec, str) else list(spec.values())
    for target in targets:
        check_available(target)


def target_for(recorded: str, spec: DeviceSpec) -> str:
    """The device that an object recorded on ``recorded`` goes to under ``spec``.

    A plain device moves everything; a mapping moves the devices it names, matching either the
    exact device (``cuda:0``) or its type (``cuda`` covers every CUDA index), and leaves the rest.
    """
    if spec is None:
        return recorded
    if isinstance(spec, str):
        return spec
    if recorded in spec:
        return spec[recorded]
    dev = _device(recorded)
    if dev.type in spec:
        return spec[dev.type]
    if dev.index is None and f"{dev.type}:0" in spec:
        return spec[f"{dev.type}:0"]
    return recorded


def remap_graph_devices(gm: Any, spec: DeviceSpec | Callable[[str], str]) -> int:
    """Rewrite device constants in the graph's args/kwargs (typed devices, ``device=`` strings,
    ``.to("cuda")`` arguments) by ``spec`` or a mapping function; returns how many changed."""
    if spec is None:
        return 0
    import torch

    if not callable(spec):
        spec_value = spec
        target_for_spec = lambda d: target_for(d, spec_value)  # noqa: E731
    else:
        target_for_spec = spec

    changed = 0

    def fix(value: Any) -> Any:
        nonlocal changed
        if isinstance(value, torch.device):
            new = torch.device(target_for_spec(str(value)))
            if new != value:
                changed += 1
            return new
        if isinstance(value, (list, tuple)):
            return type(value)(fix(v) for v in value)
        if isinstance(value, dict):
            return {k: fix(v) for k, v in value.items()}
        return value

    def fix_kw(key: str, value: Any) -> Any:
        nonlocal changed
        if key == "device" and isinstance(value, str):
            new = target_for_spec(value)
            if new != value:
                changed += 1
            return new
        return fix(value)

    for module in gm.modules():
        graph = getattr(module, "graph", None)
        if not isinstance(graph, torch.fx.Graph):
            continue
        before = changed
        for node in graph.nodes:
            node.args = fix(node.args)
            node.kwargs = {k: fix_kw(k, v) for k, v in node.kwargs.items()}
            # x.cuda() names its device only by the method: make it x.to(<mapped device>)
            if node.op == "call_method" and node.target == "cuda" and len(node.args) == 1 and not node.kwargs:
                new = target_for_spec("cuda")
                if new != "cuda":
                    node.target, node.args = "to", (node.args[0], new)
                    changed += 1
            # Tensor.to("cuda") carries the device as a plain string.
            if node.op == "call_method" and node.target == "to":
                new_args = tuple(
                    target_for_spec(a) if isinstance(a, str) and _is_device_name(a) else a for a in node.args
                )
                changed += sum(a != b for a, b in zip(new_args, node.args))
                node.args = new_args
        if changed != before:
            module.recompile()
    return changed


def _is_device_name(text: str) -> bool:
    import torch

    try:
        torch.device(text)
        return True
    except (RuntimeError, TypeError, ValueError):
        return False
