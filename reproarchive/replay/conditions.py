"""What a replay runs under, and how its result is judged: shared by the full replay
(``replay.runner``) and the compile-only one (``replay.compile_only``), so the two apply the
same recorded config, environment and execution state and give the same verdict.

``planned_setup`` decides once, before anything is entered, which of the recorded snapshots the
replay applies (and warns about what it cannot); ``entered`` enters them around the compile;
``verdict`` judges what was observed against the recorded failure.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Mapping

import torch

from reproarchive.codec.devices import DevicePlan
from reproarchive.compat.dynamo import patched_config
from reproarchive.context.config import applied_config
from reproarchive.context.environment import applied_environment, plan
from reproarchive.context.execution import applied_execution
from reproarchive.context.failure import as_collective_timeout
from reproarchive.context.system import torch_here, torch_version
from reproarchive.format.schema import Records
from reproarchive.replay.accuracy import fair_to_randomness
from reproarchive.replay.containment import contained
from reproarchive.replay.differences import differences
from reproarchive.replay.outcome import Outcome, across_versions, judged
from reproarchive.replay.settings import ReplaySettings


@dataclasses.dataclass
class Setup:
    """What ``planned_setup`` decided before the replay, for ``entered`` and ``verdict``."""

    config_applied: bool
    across: bool
    env_to_set: Any
    here: str
    recorded_torch: str | None
    warnings: list[str]


def planned_setup(records: Records, settings: ReplaySettings) -> Setup:
    """Which of the recorded snapshots the replay applies, and the warnings for what it cannot:
    decided once, before anything is entered, so that the report says what was done. The config
    is applied unless ``settings.current_config``; the environment variables that can be set
    in-process are set. Recorded on another torch release (``records.system``), only the config
    settings the recording changed are applied (the others are that release's defaults, which
    this release may not share: an int default that became None there breaks a comparison
    here). Without a recorded ``execution`` the graph runs in this thread's state."""
    config = records.config
    warnings: list[str] = []
    config_applied = bool(config) and not settings.current_config
    env_to_set, env_warnings = plan(records.environment, config_applied=config_applied)
    warnings.extend(env_warnings)
    if config and not config_applied:
        warnings.append("running with this machine's torch config (--current-config), not the recorded one")
    here, recorded_torch = torch_here(), torch_version(records.system)
    across = across_versions(here, recorded_torch)
    if config_applied and across:
        warnings.append(f"recorded on torch {recorded_torch}: only the config settings the recording changed are "
                        f"applied; the others keep torch {here}'s defaults")
    if records.execution is None:
        warnings.append("the execution state (grad mode, autocast, inference mode ...) was not recorded: "
                        "replayed in this process's state")
    return Setup(config_applied, across, env_to_set, here, recorded_torch, warnings)


def entered(stack: contextlib.ExitStack, gm: Any, records: Records, settings: ReplaySettings,
             setup: Setup) -> Any:
    """Enter on ``stack`` everything the compile and run happen under, in this order: the
    recorded config, PyTorch's repro hooks off, the environment, containment, the recorded
    execution state (``execution``: grad and inference mode, autocast, deterministic
    algorithms, default dtype, matmul precision), grad off for an after_aot graph
    (``_needs_backward``) and, when accuracy is judged, the accuracy rule for random draws,
    which is returned (None otherwise)."""
    warnings = setup.warnings
    if setup.config_applied:
        stack.enter_context(applied_config_of(records.config, warnings, only_changed=setup.across))
    stack.enter_context(without_pytorch_repro_hooks())
    stack.enter_context(applied_environment(setup.env_to_set))
    stack.enter_context(contained())
    warnings.extend(stack.enter_context(applied_execution(records.execution)))
    if records.graph_kind == "after_aot":
        stack.enter_context(torch.no_grad())
    if not settings.accuracy:
        return None

    return stack.enter_context(fair_to_randomness(gm))


def verdict(records: Records, setup: Setup, args: Any, backend: str | None, ran: tuple, *, report_differences: bool,
             shapes: dict[str, Any], randomness: str, rule: Any) -> Outcome:
    """The outcome: ``ran`` (``_compile_and_run``'s observed failure, accuracy report and
    whether backward ran) judged against the recorded failure, with what the replay did."""
    observed, details, ran_backward = ran
    observed = as_collective_timeout(observed)  # a collective that waited past its timeout: a hang, as recorded
    config_applied = setup.config_applied
    # across releases the defaults were not applied: a differing one is listed (not as important)
    found = differences(config=records.config, environment=records.environment, system=records.system,
                        config_applied=None if setup.across and config_applied else config_applied
                        ) if report_differences else []
    return judged(
        records.failure, observed, accuracy=details, differences=found, device=described_device(args),
        backend=backend, warnings=setup.warnings, ran_backward=ran_backward,
        config="current" if not config_applied else "recorded", shapes=shapes, randomness=randomness,
        accuracy_rule=rule, torch=setup.here, recorded_torch=setup.recorded_torch,
    )


def without_pytorch_repro_hooks():
    """PyTorch's own repro hooks off (``repro_after``): this replay is the repro. A recorded
    config from a dump has them on (the dump was made by them); left on, they wrap the compiler
    again, write a dump into the working folder and raise their own ``AccuracyError`` from the
    forward (torch 2.11), a failure the recording did not have."""

    return patched_config({"repro_after": None})


@contextlib.contextmanager
def applied_config_of(config: Mapping[str, Any], warnings: list[str], *, only_changed: bool = False):
    with applied_config(config, only_changed=only_changed) as result:
        for label, names in (
            ("recorded config settings this torch does not have", result.missing),
            ("recorded config modules not applied (only torch config modules already known here are; a replay never "
             "imports a module an archive names)", result.missing_modules),
            ("changed config settings that could not be recorded (e.g. custom passes)", result.unrepresentable),
            ("recorded config settings overridden here by an environment variable", result.forced_by_env),
            ("recorded config settings that failed to apply", [f["key"] for f in result.failed]),
            ("recorded config values not applied because they could name a program, path or command",
             result.unsafe),
        ):
            if names:
                shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
                warnings.append(f"{label}: {shown}")
        yield


def tensors_in(value: Any):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from tensors_in(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from tensors_in(v)


def described_device(args: Any, plan: DevicePlan | None = None) -> str:
    devices = sorted({str(t.device) for t in tensors_in(args)})
    if devices:
        return ",".join(devices)
    used = sorted(set(plan.targets.values())) if plan is not None else []
    return ",".join(used) if used else "cpu"
