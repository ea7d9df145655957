"""Replaying an archived graph: does it fail here too, and is it the same failure?

How the graph is compiled. The archived graph is exactly what the original compiler was handed,
so replay hands it to the same compiler function directly (``compiler_fn(gm, example_inputs)``,
the call Dynamo makes) instead of wrapping it in ``torch.compile``: re-running Dynamo over an
already traced graph is not idempotent (pytorch#102898) and can fail in Dynamo before the backend
ever sees the graph. For ATen-level graphs recorded after AOTAutograd (``source.kind ==
"after_aot"``) and replayed with inductor, the original compiler was inductor's inner compiler,
so ``compile_fx_inner`` is called, as PyTorch's after_aot ``run`` does.

How the outcome is judged. Every stage is classified separately (compile, forward, backward,
accuracy) and turned into a failure record with a normalised signature
(``reproarchive.context.failure``), which is compared with the recorded one: "reproduced",
"different failure" or "passed". Accuracy compares compiled against eager and uses an fp64 run of
the same graph to decide which of the two is wrong (``reproarchive.replay.accuracy.compare``), so a compiled
result that is closer to the truth than eager is not reported as a bug.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import warnings as _warnings
from pathlib import Path
from typing import Any, Mapping

from reproarchive.codec.device_runtime import devices_of, synchronize
from reproarchive.codec.devices import DevicePlan
from reproarchive.codec.inner_shapes import cut_from, inner_dims
from reproarchive.codec.rng import random_ops, restore_rng
from reproarchive.codec.shapes import placeholder_names, restricted
from reproarchive.compat.inductor import inner_compiler
from reproarchive.context import failure as _failure
from reproarchive.context.failure import faults_the_device
from reproarchive.context.system import torch_here, torch_version
from reproarchive.format.plain import to_plain
from reproarchive.format.reader import ContainerReader
from reproarchive.format.schema import FailureRecord, Records
from reproarchive.progress import ProgressFn
from reproarchive.replay import accuracy as _accuracy
from reproarchive.replay import shape_policy
from reproarchive.replay.backends import resolve_backend
from reproarchive.replay.compile_only import compiled_on, replay_compile_only
from reproarchive.replay.conditions import described_device, entered, planned_setup, tensors_in, verdict
from reproarchive.replay.faithfulness import as_replayed, generated_inputs, rng_unknown, state_unknown
from reproarchive.replay.isolation import run_in_child
from reproarchive.replay.outcome import Outcome, unless_faithful
from reproarchive.replay.prepared import prepared
from reproarchive.replay.settings import ReplaySettings

# --------------------------------------------------------------------------------------------
# the replay of one in-memory graph


_NO_RECORDS = Records()  # a graph that comes with nothing recorded (a probe, a test)


def replay_graph(
    gm: Any,
    args: list[Any],
    settings: ReplaySettings,
    records: Records = _NO_RECORDS,
    *,
    report_differences: bool = True,
    input_records: Any = None,
    rng_states: Mapping[str, Any] | None = None,
) -> Outcome:
    """Compile ``gm`` with ``settings.backend``, run it on ``args`` (already on their devices)
    and judge the result.

    ``settings`` come with the backend and accuracy mode chosen (``settings.for_recorded``);
    ``settings.device`` and ``max_memory`` were used when ``args`` were loaded. With
    ``strict_accuracy=False`` accuracy is judged on floating outputs (and gradients) only, as
    PyTorch's minifier ``--accuracy`` does; the default also requires non-floating outputs
    (bool masks, indices) to be equal, as capture and PyTorch's ``--strict-accuracy`` do.

    ``records`` are what the archive (or one rank of it) says around the graph, the judged
    ``failure`` included; a consumer that judges against another failure (a rank's), or under
    another shape policy (a candidate's), gives a copy that says so. Its config, environment
    and execution state are entered around compile and run (``planned_setup``, ``entered``); the
    config, environment and system are diffed against this machine for the report
    (``report_differences=False`` skips that: the minifier replays hundreds of candidates).
    ``shapes`` is the recorded dynamic-shape policy: a symbolic one is re-created for the backend
    and the replay's guards compared with the recorded ones (``replay.shape_policy``); without
    one the graph is compiled with static shapes and a warning says that the policy was unknown
    (louder when ``input_records``, the index's input records, show a symbolic recording). ``rng_states``
    are the generator states the failing call started from (``codec.rng``; None: not recorded,
    as where ``records.rng`` is absent), set after compiling, right before the run; accuracy on
    a graph that draws random numbers is checked under ``accuracy.fair_to_randomness``. The
    outcome's ``randomness`` and ``accuracy_rule`` say what was done.
    Raises BackendUnavailableError (exit 125) when the backend is missing here.
    """
    compiler_fn = resolve_backend(settings.backend)
    rng_states = None if records.rng is None else rng_states
    setup = planned_setup(records, settings)
    warnings = setup.warnings
    fwd_only = not _needs_backward(args, settings, records)
    shape_report = shape_policy.report_for(records, input_records, settings.backend)
    ops = random_ops(gm)  # one walk of the graph, for the report and the verdict
    randomness, rng_warnings = _randomness(ops, rng_states)
    warnings.extend(rng_warnings)
    with contextlib.ExitStack() as stack:
        rule = entered(stack, gm, records, settings, setup)
        with _warnings.catch_warnings(record=True) as caught:
            _warnings.simplefilter("always")
            ran = _compile_and_run(
                compiler_fn, gm, args, backend=settings.backend, source_kind=records.graph_kind,
                fwd_only=fwd_only, accuracy=bool(settings.accuracy), tol=settings.tol, warnings=warnings,
                ignore_non_fp=not settings.strict_accuracy, shapes=(records.shapes, shape_report),
                rng_states=rng_states,
            )
        warnings.extend(_dedupe(str(w.message) for w in caught if _worth_reporting(w)))
    warnings.extend(shape_policy.warnings_for(shape_report))
    outcome = verdict(records, setup, args, settings.backend, ran, report_differences=report_differences,
                       shapes=shape_report, randomness=randomness, rule=rule)
    return unless_faithful(outcome, [*_unfaithful(shape_report), *rng_unknown(ops, rng_states, records.failure),
                                     *state_unknown(records, args)])


def _needs_backward(args: list[Any], settings: ReplaySettings, records: Records) -> bool:
    """Whether the replay runs backward too: when the recorded failure was in backward or an
    input requires grad. An after_aot graph is one half of what AOTAutograd compiled, and
    AOTAutograd runs both halves with grad mode off (its autograd.Function supplies the
    autograd): it is replayed so, forward only (``entered``). With grad on, inductor's out=
    kernels (addmm) refuse inputs that require grad, a failure the original run never had."""
    recorded_failure = records.failure
    return not settings.only_fwd and records.graph_kind != "after_aot" and (
        (recorded_failure is not None and recorded_failure.stage == "backward")
        or any(t.requires_grad for t in tensors_in(args))
    )


def _unfaithful(shape_report: dict[str, Any]) -> list[str]:
    """What of the recorded shape policy this replay could not honour, so that a pass is no
    evidence (``outcome.unless_faithful``): a symbolic recording replayed static, a policy
    re-created in part or with other guards (a compile under other guards is another
    specialization). What is known before the replay is ``replay.faithfulness``'s."""
    out = []
    if shape_report.get("policy") == "not recorded" and shape_report.get("symbolic"):
        out.append("the recording was symbolic but its shape policy was not recorded: the replay compiled "
                   "static shapes")
    out.extend(f"the recorded shape policy was not fully re-created: {p}" for p in shape_report.get("problems", ()))
    if shape_report.get("guards_match") is False:
        out.append("the replay's shape guards differ from the recorded ones: it compiled another specialization")
    return out


def _randomness(ops: list[str], rng_states: Mapping[str, Any] | None) -> tuple[str, list[str]]:
    """What the replay does about randomness (``ops``: the graph's random ops), in words, and
    the warnings to give."""
    drawn = f"the graph draws random numbers ({', '.join(ops)})" if ops else "the graph draws no random numbers"
    if rng_states:
        return f"{drawn}; the recorded RNG state ({', '.join(rng_states)}) is restored before the run", []
    if rng_states is None:
        said = f"{drawn}; RNG unknown: the archive does not record the RNG state"
    else:
        said = f"{drawn}; the archive's source could not see the RNG state"
    if not ops:
        return said, []
    return said, [f"{said}: this replay draws other random numbers than the failing run"]


def _compile_and_run(compiler_fn, gm, args, *, backend, source_kind, fwd_only, accuracy, tol, warnings,
                     ignore_non_fp=False, shapes=(None, None), rng_states=None):
    """(observed failure record or None, accuracy report or None, whether backward ran).
    ``shapes``: the recorded shape policy and the outcome's report of it (``_compile``)."""

    try:
        compiled = _compile(compiler_fn, backend, copy.deepcopy(gm), _accuracy.clone_inputs(args), source_kind,
                            shapes)
    except Exception as exc:  # noqa: BLE001 - every failure of the compiler is data
        return _failure.record_from_exception(exc, "compile", backend=backend), None, False
    warnings.extend(restore_rng(rng_states or {}))  # after compiling: a compiler may draw (autotuning)
    try:
        if accuracy:
            kwargs = {} if tol is None else {"tol": tol}
            report = _accuracy.check_accuracy(gm, compiled, args, fwd_only=fwd_only, ignore_non_fp=ignore_non_fp,
                                              **kwargs)
            ran_backward = any(str(o.name or "").startswith("grad") for o in report.outputs)
            if report.passed:
                return None, report, ran_backward
            return _failure.accuracy_record(report, backend=backend), report, ran_backward
        result = _accuracy.run_forward_backward(compiled, _accuracy.clone_inputs(args), fwd_only=fwd_only)
        synchronize(devices_of(args))  # an asynchronous device error belongs to this stage
        return None, None, bool(result.get("grads"))
    except _accuracy.EagerFailed as exc:
        warnings.append("the graph fails in eager mode too, so the compiler is not to blame")
        cause = exc.__cause__ or exc
        return _failure.record_from_exception(cause, _accuracy.stage_of(cause), backend="eager"), None, False
    except Exception as exc:  # noqa: BLE001
        stage = _accuracy.stage_of(exc)  # a backward that failed ran
        return _failure.record_from_exception(exc, stage, backend=backend), None, stage == "backward"


def _compile(compiler_fn, backend: str, gm, args: list[Any], source_kind: str | None, shapes=(None, None)):
    """The compiled callable, taking positional arguments (what Dynamo's generated code does).
    With a symbolic shape policy the backend gets what Dynamo handed it: symbolic fake values
    on the placeholders and the fake mode in the tracing context (``replay.shape_policy``)."""
    policy, report = shapes
    if source_kind == "after_aot" and backend == "inductor":
        # what AOTAutograd hands Inductor's inner compiler, with the recorded symbols when symbolic
        with shape_policy.inner_compile(policy, gm, args, report) as (traced, example):
            inner = inner_compiler()(traced, example)
        return lambda *a: inner(list(a))
    with shape_policy.symbolic_compile(policy, gm, args, report) as example_inputs:
        compiled = compiler_fn(gm, example_inputs)
    # A plain wrapper: aot_autograd's result carries a copied ``_boxed_call`` attribute although
    # it takes positional arguments, and Dynamo always calls a backend's result positionally.
    return lambda *a: compiled(*a)


# --------------------------------------------------------------------------------------------
# small helpers


def _device_facts(args: Any, plan: DevicePlan) -> dict[str, Any]:
    """Where the replay ran and where the archive was recorded, for the outcome."""
    return {"device": described_device(args, plan), "recorded_device": plan.recorded,
            "same_device_type": not plan.moved}


def _moved_warning(plan: DevicePlan) -> list[str]:
    if not plan.moved:
        return []
    moved = ", ".join(f"{r} -> {t}" for r, t in plan.moved.items())
    return [(f"replayed on another device type than recorded ({moved}): a pass here does not show that the "
             "recorded failure is gone on the recorded device")]


def _worth_reporting(w: _warnings.WarningMessage) -> bool:
    return issubclass(w.category, UserWarning) and "reproarchive" in str(getattr(w, "filename", ""))


def _dedupe(items) -> list[str]:
    seen: dict[str, None] = {}
    for item in items:
        seen.setdefault(item, None)
    return list(seen)


# --------------------------------------------------------------------------------------------
# the public entry point


def run(path: str | Path, settings: ReplaySettings, *, isolate: bool | None = None,
        progress: ProgressFn | None = None, reader: Any = None) -> Outcome:
    """Replay the archive at ``path`` on this machine under ``settings``; see ``reproarchive run --help``.

    ``isolate`` runs the replay in a child process so that a crash (segfault, abort, fatal
    device error) becomes an outcome instead of killing the caller; by default it is on when
    the recorded failure is a crash, is unknown, or is not recorded (``needs_isolation``).
    ``settings.device=None`` replays on the recorded devices: an archive recorded on a device
    this machine lacks cannot run here (125) until ``device`` moves it (``"cpu"``), and then the
    outcome says it ran on another device type (``same_device_type``). The index is decoded
    and the devices resolved once: the reader that answers both questions also loads the
    archive, and a child gets the resolved plan.
    Raises DeviceUnavailableError / BackendUnavailableError (exit 125) when it cannot run here,
    ArchiveError (exit 2) for an unreadable archive, ReproArchiveError (2) for a device mapping
    that names a device the archive does not use.
    """

    if settings.backend is not None:
        resolve_backend(settings.backend)  # cannot run here: say so before loading anything
    if reader is None:
        with ContainerReader(path) as own:
            return run(path, settings, isolate=isolate, progress=progress, reader=own)
    # one reader (``reader``: the caller's): the index decoded once, the data loaded from it
    auto = isolate is None
    isolate = needs_isolation(reader.index.records.failure) if auto else isolate
    ready = prepared(path, settings, reader=reader, here=not isolate)  # a child gets its plan
    if auto and ready.compile_only is not None and ready.compile_only.gpus:
        isolate = True  # compiling for an absent GPU changes torch.cuda and Triton for the compile's length
    repro = None if isolate else ready.load(progress=progress, reader=reader)
    if repro is None:
        return run_in_child(path, settings, plan=ready.plan, environment=ready.records.environment)
    return replayed(ready, repro)


def needs_isolation(recorded: FailureRecord | None) -> bool:
    """Whether a replay must run in a child: when the archive does not say that the failure is
    an ordinary exception, it may be a crash (an archive packed with --no-replay, or written
    before the compiled code ran), and a crash in this process would take the caller, and a
    ``git bisect run`` verdict, with it. So does a fault on the device (an illegal address, a
    device-side assert): after one, every use of the device in that process fails. Known
    exceptions keep the fast in-process path."""
    return recorded is None or recorded.stage in ("crash", "unknown") or faults_the_device(recorded)


def run_here(path, settings: ReplaySettings, *, plan: DevicePlan | None = None, on_start=None,
             progress: ProgressFn | None = None) -> Outcome:
    """Load and replay in this process (an isolated child's side of ``run``). ``plan``: the
    devices as ``run`` resolved them (None: resolved here from ``settings.device``, as ``run``
    does). ``on_start`` gets the recorded facts before compiling, so that an isolating parent
    can still report them if the compile takes the process down."""

    with contextlib.ExitStack() as stack:
        with ContainerReader(path) as reader:
            ready = prepared(path, settings, reader=reader, plan=plan)
            stack.enter_context(ready.as_its_rank())  # a job's failing rank, compiled alone (bisect)
            repro = ready.load(progress=progress, reader=reader)
        return replayed(ready, repro, on_start=on_start)


def replayed(ready, repro, *, on_start=None, report_differences: bool = True) -> Outcome:
    """Judge the loaded ``repro`` of the ``ready`` (prepared) archive: the outcome of ``run``, and
    of each rank a job's rank worker replays (``ready.rank``). ``report_differences=False``:
    the recorded config, environment and system are not diffed against this machine's (a
    job's ranks but one)."""
    plan, chosen, records = ready.plan, ready.settings, repro.records
    only = ready.compile_only
    load_warnings = _dedupe([*(repro.warnings or []), *([] if only else _moved_warning(plan))])
    facts = _device_facts(repro.args, plan)
    if only is not None:  # the storages of an absent device were loaded onto meta, and compiled for it
        facts.update(device=compiled_on(plan), same_device_type=True)
    if on_start is not None:
        on_start({"recorded": to_plain(records.failure) if records.failure else None, "backend": chosen.backend,
                  "digest": repro.digest, **facts, "warnings": load_warnings, "torch": torch_here(),
                  "recorded_torch": torch_version(records.system),
                  "config": "current" if chosen.current_config else "recorded"})
    outcome = replay_repro(repro, chosen, report_differences=report_differences)
    outcome.device, outcome.recorded_device, outcome.same_device_type = (
        facts["device"], facts["recorded_device"], facts["same_device_type"])
    outcome.warnings[:0] = load_warnings
    outcome.archive = ready.path
    outcome.digest = repro.digest
    return as_replayed(outcome, list(repro.stand_ins), generated_inputs(repro.gm, repro.fidelity, records))


def replay_repro(repro, settings: ReplaySettings, gm=None, args=None, *, report_differences: bool = True) -> Outcome:
    """Judge a loaded archive's graph, or a candidate ``gm`` on ``args`` made from it, against
    its recorded failure with its recorded records: the one judgement ``run``, the minifier's
    check of the original and its oracle all go through, so they cannot disagree about whether
    an archive reproduces. ``settings`` has its backend and accuracy chosen (``for_recorded``)."""
    records = repro.records
    if gm is not None:  # a candidate, cut from the archive's graph: the recorded policy of the inputs it kept
        records = dataclasses.replace(records, parent=repro.digest, shapes=restricted(
            records.shapes, placeholder_names(repro.gm), placeholder_names(gm), args,
            inner_dims(records.shapes, cut_from(gm, repro.gm), list(repro.args))))
    if repro.compile_only is not None:
        return replay_compile_only(repro, settings, repro.compile_only, gm=gm, args=args, records=records)
    return replay_graph(
        repro.gm if gm is None else gm,
        list(repro.args if args is None else args),
        settings,
        records,
        report_differences=report_differences,
        input_records=repro.input_records if gm is None else None,
        rng_states=repro.rng_states,
    )
