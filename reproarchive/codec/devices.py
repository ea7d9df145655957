"""Which device a replay runs on, and whether this machine has it.

A teammate replays on whatever they have: a CUDA archive must run on CPU when asked
(``--device cpu`` or ``{"cuda:0": "cpu"}``), and asking for a device this machine lacks is
"cannot run here" (exit 125), never a crash halfway through a replay. An archive recorded on a
device this machine lacks is "cannot run here" too unless the caller asks to move it: a replay
on the CPU of a CUDA-only bug that passes would otherwise read as "fixed" (a green ``git
bisect`` step). ``resolve_devices`` turns the request into a ``DevicePlan`` once per run;
``reproarchive.load`` takes the plan (or resolves a spec itself). Inputs are moved by
``load``; the graph itself can also name devices (``torch.ones(..., device=...)``,
``.to("cuda")``), so those constants are remapped here too. Whether a device exists is asked
of its runtime (``device_runtime``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Union

from reproarchive.codec.device_runtime import runtime
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


def canonical(name: str) -> str:
    """``name`` as a device is named here: the host is one device, so ``cpu:0`` is ``cpu``.

    torch puts a tensor made on ``cpu:0`` on ``cpu``, but keeps ``cpu:0`` in a graph's device
    constants, and the two then differ ("found at least two devices, cpu and cpu:0")."""
    dev = _device(name)
    return "cpu" if dev.type == "cpu" else str(dev)


def is_available(name: str) -> bool:
    """Whether ``name`` names a device this machine has (cpu and meta always)."""
    try:
        check_available(name)
    except DeviceUnavailableError:
        return False
    return True


def check_available(name: str) -> None:
    """Raise DeviceUnavailableError (exit 125) unless ``name`` exists on this machine."""
    dev = _device(name)
    if dev.type in ("cpu", "meta"):
        return
    rt = runtime(dev)
    if not rt.available():
        raise DeviceUnavailableError(
            f"device {name!r} is not available on this machine",
            "replay on another device with --device cpu (or a mapping like cuda:0=cpu)",
        )
    count = rt.device_count()
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


def _covers(key: str, recorded: str) -> bool:
    """Whether a mapping key names ``recorded``: the exact device, its type (``cuda`` covers
    every CUDA index), or device 0 for a device recorded without an index."""
    dev = _device(recorded)
    return key == recorded or key == dev.type or (dev.index is None and key == f"{dev.type}:0")


def target_for(recorded: str, spec: DeviceSpec) -> str:
    """The device that an object recorded on ``recorded`` goes to under ``spec``.

    A plain device moves everything; a mapping moves the devices it names, matching either the
    exact device (``cuda:0``) or its type (``cuda`` covers every CUDA index), and leaves the rest.
    """
    if spec is None:
        return recorded
    if isinstance(spec, str):
        return spec
    for key in sorted(spec, key=lambda k: (k != recorded, ":" in k)):  # exact, then type, then :0
        if _covers(key, recorded):
            return spec[key]
    return recorded


# --------------------------------------------------------------------------------------------
# resolving a spec against an archive, once


@dataclasses.dataclass(frozen=True)
class DevicePlan:
    """Where each device an archive names goes on this machine: the device spec resolved
    against the archive once, every target checked, so ``load`` and the replay after it use
    it without asking again. Call it as a function (recorded name -> device to use).

    ``targets`` maps every device the archive names (storages and graph constants) to the
    device used here; ``spec`` is what was asked for (None: the recorded devices); ``fallback``
    lists recorded devices this machine lacks that were put on the CPU (``load``'s lenient
    default; a replay refuses instead). ``missing`` is the rule for a recorded device this
    machine lacks, kept for a name the archive scan cannot see."""

    targets: Mapping[str, str]
    spec: DeviceSpec = None
    fallback: tuple[str, ...] = ()
    missing: str = "refuse"

    def __call__(self, recorded: str) -> str:
        if recorded in self.targets:
            return self.targets[recorded]
        # a name the scan of the archive did not list: the same rules, one device at a time
        return _place([recorded], self.spec, self.missing)[0][recorded]

    @property
    def moved(self) -> dict[str, str]:
        """Recorded devices that run on another device type here (meta, which holds no data,
        not counted)."""
        return {r: t for r, t in self.targets.items()
                if _device(r).type != "meta" and _device(r).type != _device(t).type}

    @property
    def recorded(self) -> str:
        """The devices the archive names (meta left out), for a report: ``cuda:0`` or ``cpu``."""
        names = [r for r in self.targets if _device(r).type != "meta"]
        return ",".join(names) if names else "cpu"

    def to_plain(self) -> dict[str, Any]:
        """Plain data, for a child process that replays under this plan."""
        spec = self.spec if self.spec is None or isinstance(self.spec, str) else dict(self.spec)
        return {"targets": dict(self.targets), "spec": spec, "fallback": list(self.fallback), "missing": self.missing}

    @classmethod
    def from_plain(cls, data: Mapping[str, Any]) -> DevicePlan:
        return cls(dict(data["targets"]), data.get("spec"), tuple(data.get("fallback", ())),
                   data.get("missing", "refuse"))


def resolve_devices(recorded: Iterable[str], spec: DeviceSpec | DevicePlan, *, missing: str = "refuse") -> DevicePlan:
    """Resolve ``spec`` against the devices an archive names (``recorded``), once.

    A mapping key that names none of them is a usage error (exit 2) that lists them; a target
    this machine lacks is DeviceUnavailableError (125). A recorded device no spec moves stays
    where it was if this machine has it (``meta`` goes to the CPU: it never held data);
    otherwise ``missing="refuse"`` raises DeviceUnavailableError with a hint to pass
    ``--device cpu`` (a replay on another device type is a different experiment, so it is
    never silent), and ``missing="cpu"`` puts it on the CPU and lists it in ``fallback``.
    """
    if isinstance(spec, DevicePlan):
        return spec
    if spec is not None and not isinstance(spec, (str, Mapping)):
        spec = str(spec)  # a torch.device
    names = list(dict.fromkeys(recorded))
    for name in names:
        check_recorded_device(name)
    if isinstance(spec, str):
        spec = canonical(spec)
    elif spec is not None:
        spec = {key: canonical(target) for key, target in spec.items()}
        unused = [key for key in spec if not any(_covers(_key(key), r) for r in names)]
        if unused:
            uses = ", ".join(names) if names else "no device (it has no tensors)"
            raise ReproArchiveError(
                f"the device mapping names {', '.join(unused)}, which the archive does not use (it uses {uses})",
                "map one of the archive's devices (e.g. --device cuda:0=cpu), or move everything with --device cpu",
            )
        spec = {_key(key): target for key, target in spec.items()}
    check_spec(spec)
    targets, fallback = _place(names, spec, missing)
    return DevicePlan(targets, spec, tuple(fallback), missing)


def _place(names: list[str], spec: DeviceSpec, missing: str) -> tuple[dict[str, str], list[str]]:
    """Each recorded device's place under an already checked ``spec`` (see ``resolve_devices``)."""
    targets: dict[str, str] = {}
    fallback: list[str] = []
    for name in names:
        target = target_for(name, spec)
        if target != name:
            targets[name] = target
        elif _device(name).type == "meta":
            targets[name] = "cpu"
        elif is_available(name):
            targets[name] = name
        elif missing == "cpu":
            targets[name] = "cpu"
            fallback.append(name)
        else:
            kind, rt = _device(name).type, runtime(name)
            have = f"it has {rt.device_count()} {kind} device(s)" if rt.available() else f"it has no {kind} device"
            raise DeviceUnavailableError(
                f"the archive was recorded on {name}, which this machine does not have ({have})",
                "replay it on the CPU with --device cpu (the verdict then says it ran on another device type), "
                f"or on a machine with {kind}",
            )
    return targets, fallback


def _key(key: str) -> str:
    """A mapping key as written, or canonical when it names a device (``cpu:0`` is ``cpu``)."""
    dev = _device(key)
    return "cpu" if dev.type == "cpu" else key


def remap_graph_devices(gm: Any, spec: DeviceSpec | Callable[[str], str]) -> int:
    """Rewrite device constants in the graph's args/kwargs (typed devices, ``device=`` strings,
    ``.to("cuda")`` arguments) by ``spec`` or a mapping function; returns how many changed."""
    if spec is None:
        return 0
    import torch

    if not callable(spec):
        spec_value = spec

        def target_for_spec(d):
            return target_for(d, spec_value)
    else:
        target_for_spec = spec

    remap = _DeviceRemap(target_for_spec)
    for module in gm.modules():
        graph = getattr(module, "graph", None)
        if not isinstance(graph, torch.fx.Graph):
            continue
        before = remap.changed
        for node in graph.nodes:
            remap.node(node)
        if remap.changed != before:
            module.recompile()
    return remap.changed


class _DeviceRemap:
    """One rewrite of a module tree's device constants, counting what it changed (a graph is
    recompiled only when it changed)."""

    def __init__(self, target_for_spec: Callable[[str], str]):
        self.target_for_spec = target_for_spec
        self.changed = 0

    def fix(self, value: Any) -> Any:
        import torch

        if isinstance(value, torch.device):
            new = torch.device(self.target_for_spec(str(value)))
            if new != value:
                self.changed += 1
            return new
        if isinstance(value, (list, tuple)):
            return type(value)(self.fix(v) for v in value)
        if isinstance(value, dict):
            return {k: self.fix(v) for k, v in value.items()}
        return value

    def fix_kw(self, key: str, value: Any) -> Any:
        if key == "device" and isinstance(value, str):
            new = self.target_for_spec(value)
            if new != value:
                self.changed += 1
            return new
        return self.fix(value)

    def node(self, node: Any) -> None:
        node.args = self.fix(node.args)
        node.kwargs = {k: self.fix_kw(k, v) for k, v in node.kwargs.items()}
        # x.cuda() names its device only by the method: make it x.to(<mapped device>)
        if node.op == "call_method" and node.target == "cuda" and len(node.args) == 1 and not node.kwargs:
            new = self.target_for_spec("cuda")
            if new != "cuda":
                node.target, node.args = "to", (node.args[0], new)
                self.changed += 1
        # Tensor.to("cuda") carries the device as a plain string.
        if node.op == "call_method" and node.target == "to":
            new_args = tuple(
                self.target_for_spec(a) if isinstance(a, str) and is_device_name(a) else a for a in node.args
            )
            self.changed += sum(a != b for a, b in zip(new_args, node.args))
            node.args = new_args


def graph_devices(gm: Any) -> list[str]:
    """Every device ``gm`` and its subgraphs name, as ``remap_graph_devices`` reads them (typed
    devices, ``device=`` strings, ``.to("cuda")``, ``.cuda()``), in first-seen order."""
    seen: list[str] = []
    remap_graph_devices(gm, lambda name: seen.append(name) or name)  # maps each to itself: changes nothing
    return list(dict.fromkeys(seen))


def is_device_name(text: str) -> bool:
    import torch

    try:
        torch.device(text)
        return True
    except (RuntimeError, TypeError, ValueError):
        return False
