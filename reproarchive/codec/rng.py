"""Randomness (spec §8 ``rng``): which of a graph's calls draw random numbers, and the
generator states a failing call started from, torch objects <-> records.

A graph with dropout computes another result for every generator state, so a replay that
does not start from the recorded state replays another run, and an accuracy check that gives
eager and compiled different states compares two different programs. The states are read
through the device seam (``codec.device_runtime``: the CPU generator and each device's) and
stored as storages of the archive's storage table, content-addressed like every tensor's
bytes; nothing here is pickled.

Whether a call draws random numbers is read from the operator, not from a list of names: a
call target is random when the ATen operator of its name carries torch's
``nondeterministic_seeded`` tag (``torch.rand``, ``Tensor.bernoulli_``, ``F.dropout`` and
``aten.native_dropout.default`` all resolve to one), plus the few functional wrappers that
have no ATen operator of their own. A dropout called with ``training=False`` or ``p=0``
draws nothing and is not counted.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from reproarchive.codec.device_runtime import RngState, devices_of, runtime
from reproarchive.compat.dispatch import OpOverload, OpOverloadPacket
from reproarchive.compat.nn import is_dropout
from reproarchive.format.schema import GeneratorState, RngRecord

#: ``torch.nn.functional`` wrappers that draw through other operators (no ATen op of their name).
_WRAPPERS = frozenset({"dropout1d", "dropout2d", "dropout3d", "gumbel_softmax"})


def _aten_name(target: Any, op: str) -> str | None:
    """The operator name a call goes by: ``aten`` ops by their bare name, others' as ``ns::name``."""
    if op == "call_method":
        return target if isinstance(target, str) else None
    if isinstance(target, OpOverload):
        return target._opname if target.namespace == "aten" else f"{target.namespace}::{target._opname}"
    if isinstance(target, OpOverloadPacket):
        return target._qualified_op_name.removeprefix("aten::")
    return getattr(target, "__name__", None)


def _packet_seeded(packet: OpOverloadPacket) -> bool:
    return any(torch.Tag.nondeterministic_seeded in getattr(packet, o).tags for o in packet.overloads())


@functools.lru_cache(maxsize=None)
def _aten_seeded(name: str) -> bool | None:
    """Whether an overload of ``aten.<name>`` draws random numbers; None: no such operator."""
    try:
        packet = getattr(torch.ops.aten, name)
    except (AttributeError, RuntimeError):
        return None
    return _packet_seeded(packet) if isinstance(packet, OpOverloadPacket) else None


def _seeded(target: Any, name: str) -> bool:
    if isinstance(target, OpOverload):
        return torch.Tag.nondeterministic_seeded in target.tags
    if isinstance(target, OpOverloadPacket):
        return _packet_seeded(target)
    seeded = _aten_seeded(name) if name and not name.startswith("__") else None
    if seeded is None:
        return name in _WRAPPERS and getattr(target, "__module__", "") == "torch.nn.functional"
    return seeded


def _draws(node: Any, name: str) -> bool:
    """False for a dropout that cannot draw: ``training``/``train`` False or ``p`` 0."""
    if "dropout" not in name:
        return True
    training = node.kwargs.get("training", node.kwargs.get("train", node.args[2] if len(node.args) > 2 else True))
    p = node.kwargs.get("p", node.args[1] if len(node.args) > 1 else 0.5)
    return training is not False and p != 0


def _module_draws(owner: Any, target: str) -> tuple[str, ...]:
    """A called module of torch's that draws in training mode (``nn.Dropout*``, ``nn.RReLU``),
    by its class name in lower case; a graph module's own calls are read where ``random_ops``
    reaches it."""
    try:
        module = owner.get_submodule(target)
    except AttributeError:
        return ()
    if not getattr(module, "training", False) or getattr(module, "p", 1) == 0:
        return ()
    if is_dropout(module):
        return (type(module).__name__.lower(),)
    return ("rrelu",) if isinstance(module, torch.nn.RReLU) else ()


def random_ops(gm: Any) -> tuple[str, ...]:
    """The names of ``gm``'s calls that draw random numbers (sorted, each once), subgraphs
    included: ``dropout``, ``native_dropout``, ``rand_like`` ..."""
    found: set[str] = set()
    for module in gm.modules() if hasattr(gm, "modules") else (gm,):
        graph = getattr(module, "graph", None)
        for node in graph.nodes if isinstance(graph, torch.fx.Graph) else ():
            if node.op == "call_module":
                found.update(_module_draws(module, node.target))
                continue
            if node.op not in ("call_function", "call_method"):
                continue
            name = _aten_name(node.target, node.op)
            if name and _seeded(node.target, name) and _draws(node, name):
                found.add(name)
    return tuple(sorted(found))


# ---------------------------------------------------------------------------------------------
# generator states


def draws_random(gm: Any) -> bool:
    """Whether ``gm`` may draw random numbers: a graph that cannot be read counts as drawing (a
    capture then reads the generator states before each of its calls, never too few)."""
    try:
        return bool(random_ops(gm))
    except Exception:  # noqa: BLE001 - unreadable: assume it draws
        return True


def archived_states(saved: RngState | None) -> dict[str, torch.Tensor] | None:
    """``saved`` as an archive holds it (``states_of``); None where nothing was read."""
    return None if saved is None else states_of(saved)


def rng_snapshot(inputs: Iterable[Any] = ()) -> dict[str, torch.Tensor]:
    """The CPU generator's state and that of each device ``inputs`` are on, now: device name ->
    the state as a uint8 tensor on the host."""
    return states_of(RngState.capture(devices_of(inputs)))


def states_of(saved: RngState) -> dict[str, torch.Tensor]:
    """``saved`` as an archive holds it (``rng_snapshot``)."""
    return {str(device): state.detach().to("cpu", torch.uint8).contiguous() for device, state in saved.states}


def encode_rng(gm: Any, states: Mapping[str, torch.Tensor] | None, table: Any) -> RngRecord | None:
    """The ``rng`` record of ``gm`` with ``states`` registered in the storage ``table`` (after
    the graph's own tensors); None when the graph draws nothing and no state was recorded."""
    ops = random_ops(gm)
    generators = tuple(GeneratorState(device=device, storage=table.add_tensor(state.detach().cpu().contiguous()))
                       for device, state in (states or {}).items())
    if not ops and not generators:
        return None
    return RngRecord(random_ops=ops, generators=generators)


def decode_rng(record: RngRecord | None, storages: list, devices: Mapping[str, str]) -> dict[str, torch.Tensor]:
    """The recorded states, by the device they apply to here: a recorded device follows the
    load's mapping (``devices``) when it stays of its device type, else keeps its name (and
    ``restore_rng`` says it cannot be restored)."""
    out: dict[str, torch.Tensor] = {}
    for generator in record.generators if record is not None else ():
        st = storages[generator.storage]
        state = torch.empty(0, dtype=torch.uint8, device=st.device).set_(st).cpu()
        target = devices.get(generator.device, generator.device)
        same_type = torch.device(target).type == torch.device(generator.device).type
        out[target if same_type else generator.device] = state
    return out


def restore_rng(states: Mapping[str, torch.Tensor]) -> list[str]:
    """Set each generator to its recorded state; returns notes about those that could not be
    set here (a device this machine lacks, a state this torch does not accept)."""
    notes = []
    for name, state in states.items():
        try:
            device = torch.device(name)
            if device.type != "cpu" and not runtime(device).available():
                raise RuntimeError(f"no {device.type} device here")
            runtime(device).set_rng_state(device, state)
        except Exception as exc:  # noqa: BLE001 - a state not restored is a note, never the replay's end
            notes.append(f"the recorded RNG state of {name} was not restored: {str(exc).splitlines()[0]}")
    return notes
