"""A compile-stage failure of a GPU graph, replayed on a machine without that GPU.

Most compiler bugs filed from GPU jobs fail while compiling, before any kernel runs, and what
that needs of the device is its description (``codec.gpu_description``), not the device. So
when the recorded device is absent here and the recorded failure is of the compile stage,
``run`` compiles only (``--compile-only`` asks for it on any archive): the backend is handed
fake tensors of the recorded devices, as Dynamo hands them, Inductor generates Triton for the
recorded target and Triton compiles it to a cubin for it (``compat.absent_gpu``); nothing is
launched. The verdict says so (``Outcome.compile_only``): a compile that fails as recorded is
REPRODUCED; one that passes is "passed, compile only" with its own exit code (6), never 0: it
shows the compile is fixed, not that the graph runs. A failure of a later stage (a kernel's
fault, an accuracy failure, a crash) needs the device: 125 with the hint, as before.

The decision is taken once, with the archive's other preparations (``replay.prepared``): the
storages of an absent device load onto ``meta`` (shapes and strides, no data) and become fake
tensors of that device here.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from typing import Any

import torch

from reproarchive.codec.checks import recorded_devices
from reproarchive.codec.device_runtime import DescribedCudaRuntime
from reproarchive.codec.devices import DevicePlan, is_available
from reproarchive.codec.gpu_description import GpuDescription, NotDescribed, describe
from reproarchive.compat.absent_gpu import moved_fake
from reproarchive.compat.dynamo import tracing_with
from reproarchive.compat.fake import retraced
from reproarchive.compat.fx_meta import set_example_value
from reproarchive.compat.inductor import inner_compiler, patched_config
from reproarchive.context import failure as _failure
from reproarchive.errors import DeviceUnavailableError, ReproArchiveError
from reproarchive.format.schema import Index
from reproarchive.replay import conditions, shape_policy
from reproarchive.replay.backends import resolve_backend
from reproarchive.replay.outcome import EXIT_COMPILED_ONLY
from reproarchive.replay.settings import ReplaySettings
from reproarchive.replay.shape_policy import compared, placeholder_fakes

#: Inductor settings under which a compile benchmarks kernels on the device, which a compile
#: without it cannot do (the choices the failing compile made are not recorded).
_BENCHMARKING = ("max_autotune", "max_autotune_gemm", "max_autotune_pointwise", "coordinate_descent_tuning")


@dataclasses.dataclass(frozen=True)
class CompileOnly:
    """A replay that compiles and launches nothing: ``gpus`` describe the ``absent`` devices it
    compiles for (empty where every recorded device is here and ``--compile-only`` was asked)."""

    gpus: tuple[GpuDescription, ...] = ()
    absent: tuple[str, ...] = ()

    def plan(self, recorded: list[str]) -> DevicePlan:
        """Where the archive's storages load: an absent device's onto ``meta``."""
        return DevicePlan({r: "meta" if r in self.absent else ("cpu" if r.startswith("meta") else r)
                           for r in recorded})

    def runtime(self) -> DescribedCudaRuntime:
        """The device runtime of the absent GPUs: their description, and the compile for them."""
        return DescribedCudaRuntime({g.index: dict(g.properties) for g in self.gpus})

    def said(self) -> str:
        """``for cuda:0 sm_90 (NVIDIA H200) without the device``, for the verdict."""
        if not self.gpus:
            return "on this machine's devices"
        derived = sorted({f for g in self.gpus for f in g.derived})
        note = f" ({', '.join(derived)}: from the compute capability, not recorded)" if derived else ""
        return f"for {', '.join(g.said() for g in self.gpus)} without the device{note}"


def planned(system: Any, settings: ReplaySettings, plan: DevicePlan) -> CompileOnly | None:
    """What a child replaying under its parent's ``plan`` does: compile only where the parent
    decided to (``decided``), which its plan shows (an absent device loaded onto ``meta``), for
    the devices ``system`` (the archive's system record; a job's rank: its own) describes."""
    absent = tuple(r for r, t in plan.targets.items() if t == "meta" and not r.startswith("meta"))
    if absent:
        return CompileOnly(tuple(describe(system, absent)), absent)
    return CompileOnly() if settings.compile_only else None


def decided(index: Index, settings: ReplaySettings) -> CompileOnly | None:
    """Whether a replay of ``index`` under ``settings`` compiles only (module docstring): when
    asked (``settings.compile_only``), or when a recorded device is absent, ``--device`` does
    not move it and the recorded failure is of the compile stage. Raises
    DeviceUnavailableError (125), saying why, where it would but cannot."""
    asked = settings.compile_only
    if asked is False:
        return None
    if asked and settings.device is not None:
        raise ReproArchiveError("--compile-only compiles for the recorded devices; --device moves them",
                                "drop one of the two")
    devices = [d for d in recorded_devices(index) if d.split(":")[0] not in ("cpu", "meta")]
    absent = tuple(d for d in devices if not is_available(d))
    failure = _recorded_failure(index)
    stage = failure.stage if failure is not None else None
    if settings.device is not None or (not asked and (not absent or stage in (None, "unknown"))):
        return None
    _check_no_dtensors(index, absent)
    if not absent:
        return CompileOnly()
    where = _named(absent)
    if stage not in ("compile", None, "unknown"):
        raise DeviceUnavailableError(
            f"the archive was recorded on {where}, which this machine does not have, and its recorded failure is a "
            f"{stage} failure, which only running the graph shows",
            "replay it on a machine with the device, or on the CPU with --device cpu (another experiment)")
    try:
        gpus = describe(index.records.system, absent)
    except NotDescribed as err:
        raise DeviceUnavailableError(
            f"the archive was recorded on {where}, which this machine does not have, and a compile for it without "
            f"the device cannot be made: {err}",
            "replay it on a machine with the device, or on the CPU with --device cpu") from None
    _check_can_compile(index, absent)
    return CompileOnly(tuple(gpus), absent)


def _recorded_failure(index: Index) -> Any:
    """The failure a compile-only replay is judged against: the archive's, or of a multi-rank
    job, its failing rank's (each rank's replay is judged against its own)."""
    job = index.job
    if index.records.failure is not None or job is None:
        return index.records.failure
    failed = next((r for r in job.ranks if r.rank == job.failing_rank and r.outcome is not None), None)
    return failed.outcome.failure if failed is not None else None


def _check_no_dtensors(index: Index, absent: tuple[str, ...]) -> None:
    """A job's rank whose inputs were DTensors compiled a graph of DTensors, which a compile-only
    replay cannot hand it (it loads their local shards, with no data where the device is absent):
    compiling the shards would be another program."""
    if index.job is None or not any(r.dtensors for r in index.job.ranks):
        return
    if absent:
        raise DeviceUnavailableError(
            f"the job was recorded on {_named(absent)}, which this machine does not have, and its ranks' inputs are "
            "DTensors, which a compile without the device cannot rebuild",
            "replay the job on machines with its devices, or on the CPU with --device cpu")
    raise ReproArchiveError("--compile-only cannot compile a job whose ranks' inputs are DTensors (it would compile "
                            "their local shards: another program)", "replay the job launched (drop --compile-only)")


def _check_can_compile(index: Index, absent: tuple[str, ...]) -> None:
    where = _named(absent)
    reason = DescribedCudaRuntime.unavailable_reason()
    if reason is not None:
        raise DeviceUnavailableError(
            f"the archive was recorded on {where}, which this machine does not have; its compile-stage failure can be "
            f"compiled for {where} without the device, but {reason}",
            "install a CUDA build of torch here (then `run` compiles for the recorded GPU), or replay on the CPU with "
            "--device cpu (another compiler backend)")
    configs = [index.records.config, *(r.config for r in (index.job.records if index.job is not None else ()))]
    inductor = [c.changed.get("torch._inductor.config") or {} for c in configs if c is not None]  # every rank's
    tuning = [k for k in _BENCHMARKING if any(settings.get(k) for settings in inductor)]
    if tuning:
        raise DeviceUnavailableError(
            f"cannot compile for {where} without the device: the recorded config turns on {', '.join(tuning)}, "
            "which benchmarks kernels on the device while compiling",
            "replay it on a machine with the device, or with --current-config")


def _named(devices: tuple[str, ...] | list[str], sep: str = ", ") -> str:
    """``devices`` as a compile names them (``cuda`` is ``cuda:0``), each once."""

    named = (torch.device(d) for d in devices)
    return sep.join(dict.fromkeys("cpu" if d.type == "cpu" else f"{d.type}:{d.index or 0}" for d in named))


def compiled_on(plan: DevicePlan) -> str:
    """The devices a compile-only replay under ``plan`` compiled for, for the outcome."""
    return _named([r for r in plan.targets if not r.startswith("meta")], ",") or "cpu"


# --------------------------------------------------------------------------------------------
# the replay


def replay_compile_only(repro: Any, settings: ReplaySettings, only: CompileOnly, *, gm: Any = None,
                        args: Any = None, records: Any = None) -> Any:
    """Judge ``repro`` (loaded under ``only.plan``), or a minifier's candidate ``gm`` on
    ``args`` with its ``records``, by compiling the graph, as ``run`` judges a replay: the same
    records applied, the same verdict rule, with ``compile_only`` said."""

    records = repro.records if records is None else records
    graph, inputs = (repro.gm, list(repro.args)) if gm is None else (gm, list(args))
    compiler_fn = resolve_backend(settings.backend)
    setup = conditions.planned_setup(records, settings)
    shape_report = shape_policy.report_for(records, repro.input_records if gm is None else None, settings.backend)
    device = _named(only.absent[:1]) or None
    forward_only = _forward_only(records, settings, inputs, graph) if only.gpus else False
    observed = None
    with contextlib.ExitStack() as stack:
        conditions.entered(stack, graph, records, settings.replace(accuracy=False), setup)
        stack.enter_context(_no_compile_workers())
        if forward_only:
            stack.enter_context(torch.no_grad())
            setup.warnings.append("compiled the forward (inference) graph only (--only-fwd): the inputs require grad, "
                                  "and a training graph for an absent GPU needs its CUDA runtime")
        skipped = None
        if only.gpus:
            skipped = stack.enter_context(only.runtime().compiling())
        try:
            with _fake_inputs(graph, inputs, records.shapes, device, shape_report,
                              no_grad=bool(only.gpus)) as (faked, example, fake_mode):
                _compiled(compiler_fn, settings.backend, records.graph_kind, faked, example, fake_mode)
        except Exception as exc:  # noqa: BLE001 - every failure of the compiler is data
            observed = _failure.record_from_exception(exc, "compile", backend=settings.backend)
    outcome = conditions.verdict(records, setup, [], settings.backend, (observed, None, False), report_differences=True,
                             shapes=shape_report, randomness="compiled only: no random number was drawn", rule=None)
    outcome.warnings.extend(shape_policy.warnings_for(shape_report))
    if skipped is not None and skipped.pad_mm:
        outcome.warnings.append(f"Inductor asked to time {skipped.pad_mm} matmul(s) padded and unpadded on the device "
                                "(pad_mm); without it they were left unpadded, which the recorded compile may not have "
                                "chosen (its choice is not recorded)")
    outcome.compile_only = only.said()
    if outcome.status == "passed":
        outcome.exit_code = EXIT_COMPILED_ONLY
    return outcome


def _compiled(compiler_fn: Any, backend: str, graph_kind: str | None, gm: Any, example: list[Any],
              fake_mode: Any) -> Any:
    """The backend's compile of ``gm``, as ``runner`` compiles it: an ATen graph recorded after
    AOTAutograd goes to Inductor's inner compiler, re-traced (in the inputs' fake mode, so that
    an operator that makes a tensor makes a fake one) so every node has its fake value."""
    if graph_kind == "after_aot" and backend == "inductor":
        with fake_mode:
            traced = retraced(gm, example)
        return inner_compiler()(traced, example)
    return compiler_fn(gm, example)


def _forward_only(records: Any, settings: ReplaySettings, inputs: list[Any], gm: Any) -> bool:
    """Whether the compile for an absent GPU runs with grad off: where it would anyway (the
    recorded grad mode was off, an after_aot graph) False, the graph compiles as recorded; where
    it would trace a training graph, True if ``--only-fwd`` asks for the forward graph, and
    otherwise DeviceUnavailableError (125): autograd on a fake CUDA tensor asks the CUDA runtime
    for the device's stream, which a machine without a driver cannot answer."""

    execution = records.execution
    grad_on = records.graph_kind != "after_aot" and (execution is None or execution.grad_enabled)
    tensors = [*(a for a in inputs if isinstance(a, torch.Tensor)), *gm.parameters()]
    if not grad_on or not any(t.requires_grad for t in tensors):
        return False
    if settings.only_fwd:
        return True
    raise DeviceUnavailableError(
        "the graph's inputs require grad, and compiling its training graph for a GPU this machine lacks needs that "
        "GPU's CUDA runtime (autograd asks the device for its stream)",
        "replay it on a machine with the device, or compile its forward (inference) graph here with --only-fwd")


def _no_compile_workers() -> Any:
    """One compile thread: Inductor's worker processes would compile without the description."""

    return patched_config({"compile_threads": 1})


@contextlib.contextmanager
def _fake_inputs(gm: Any, args: list[Any], policy: Any, device: str | None, report: dict, *, no_grad: bool = False):
    """(the graph to compile, its example inputs, their fake mode): fake tensors, the ones loaded onto ``meta``
    said to live on ``device``, made under the recorded shape policy when it is symbolic, with
    the fake mode in the tracing context as Dynamo leaves it for a backend. The graph's own
    tensors (parameters, buffers, constants) are faked in the same mode, so a backend that
    fakifies them gets the same fakes. ``no_grad``: the fakes of ``device`` do not require grad
    (a compile with grad off traces the same inference graph either way, and AOTAutograd's
    metadata pass would otherwise ask the absent device's runtime for its stream)."""

    gm = copy.deepcopy(gm)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]

    def placed(fake: Any, real: Any) -> Any:
        if isinstance(real, torch.Tensor) and real.device.type == "meta" and device is not None:
            if no_grad and fake.requires_grad:
                fake.requires_grad_(False)
            return moved_fake(fake, device)
        return fake

    fake_mode, fakes, shapes = placeholder_fakes(policy, gm, args)
    example = []
    for arg, fake, node in zip(args, fakes, placeholders):
        if fake is None and isinstance(arg, torch.Tensor):  # an input the symbolic policy does not describe
            fake = fake_mode.from_tensor(arg, static_shapes=True)
            set_example_value(node, fake)
        example.append(placed(fake, arg) if fake is not None else arg)
    held = [placed(fake_mode.from_tensor(t, static_shapes=True), t)  # the converter's memo holds them weakly
            for t in [*gm.parameters(), *gm.buffers(), *_tensor_attributes(gm)]]
    try:
        with tracing_with(fake_mode):
            yield gm, example, fake_mode
    finally:
        del held
        if shapes is not None:
            report.update(compared(policy, shapes))


def _tensor_attributes(gm: Any) -> list[Any]:
    return [v for m in gm.modules() for v in vars(m).values() if isinstance(v, torch.Tensor)]
