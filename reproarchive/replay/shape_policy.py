"""Replaying with the recorded dynamic-shape policy, and checking that it took.

How. A symbolic recording is compiled the way Dynamo compiled it: the backend gets the real
inputs (symbolic scalars as SymInts, as Dynamo passes them), each placeholder carries a fake
value made with the recorded per-dimension policy (``codec.shapes.fakes_for``), and the fake mode
with its ShapeEnv is the tracing context's, where AOTAutograd and Inductor look for it; the
real inputs are registered in that fake mode, so a backend that fakifies them gets the same
fakes. We chose this over re-running Dynamo on a wrapper with ``torch.compile(dynamic=...)`` and
``mark_dynamic``/``mark_unbacked`` per dimension: Dynamo re-tracing an already traced graph is
not idempotent (pytorch#102898), it would make every symbolic scalar input a fresh, independent
symbol (Dynamo's ``s77`` is the size of ``x``, a wrapper's int argument is not), and it names
its sources after the wrapper's arguments, so neither equalities nor guards would match the
recording. Building the ShapeEnv ourselves keeps the recorded sources, hence the recorded symbol
names and guard text.

Check. After the compile (or its failure) the replay's ShapeEnv renders its guards over the
same sources; ``compared`` says whether they equal the recorded ones and lists the difference:
a replay whose guards differ did not compile the program that failed.

A recording without a policy (older archives, sources that cannot see one) replays as before,
with static shapes, and ``unknown_policy_warning`` says so: louder when the archive shows that
the recording was symbolic (symbolic scalar inputs, dynamic dimensions).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from reproarchive.codec.shapes import ReplayShapes, fakes_for, is_symbolic, replay_shape_env
from reproarchive.compat.dynamo import tracing_with
from reproarchive.compat.fake import new_fake_mode, retraced
from reproarchive.compat.fx_meta import set_example_value
from reproarchive.compat.subgraph_values import propagate_example_values
from reproarchive.format.schema import Records, ShapePolicy, SymValue, TensorValue


@contextlib.contextmanager
def symbolic_compile(policy: ShapePolicy | None, gm: Any, args: list[Any], report: dict | None) -> Iterator[list[Any]]:
    """Around a backend call: yields the example inputs to hand it. With a symbolic ``policy``
    the placeholders of ``gm`` get fake values and the tracing context gets the fake mode
    (``gm`` is the replay's own copy); ``report`` (the outcome's ``shapes``) gets the guard
    comparison when the block ends, whether the compile passed or raised."""
    if policy is None or not is_symbolic(policy):
        with static_compile(gm, args, report, policy):
            yield args
        return


    _, _, shapes = placeholder_fakes(policy, gm, args)
    example = [fake if isinstance(fake, torch.SymInt) else arg for arg, fake in zip(args, shapes.fakes)]
    _example_values(gm, shapes.fake_mode, [arg if fake is None else fake for arg, fake in zip(args, shapes.fakes)],
                    report)
    before = _before_the_compile(shapes, report)
    try:
        with tracing_with(shapes.fake_mode):
            yield example
    finally:
        if report is not None:
            report.update(compared(policy, shapes, report.get("guards_compared_at", AT_COMPILE_END), before))


@contextlib.contextmanager
def static_compile(gm: Any, args: list[Any], report: dict | None, policy: ShapePolicy | None) -> Iterator[None]:
    """Around a backend call with static shapes: what Dynamo gives a backend then too, a fake
    mode with a ShapeEnv (made with ``policy``'s settings, ``codec.shapes.replay_shape_env``) in
    the tracing context and each placeholder's fake value (static sizes), the real inputs
    registered in it so a backend that fakifies them gets those fakes.
    Without the ShapeEnv, a compile that makes symbols of its own (a ``while_loop``'s carried
    values, a data-dependent size) fails where the recorded one did not. Inputs that cannot be
    fakified (``report`` says so) leave the compile without the context, as before, and so do
    integer inputs: Dynamo passes those only in a symbolic compile, so the recording was symbolic
    and its policy is unknown (``runner._unfaithful``), and under a ShapeEnv AOTAutograd would
    make each a fresh symbol of no recorded range, a compile that is neither."""

    if any(isinstance(a, int) and not isinstance(a, bool) for a in args):
        yield
        return
    try:
        fake_mode, fakes, _ = placeholder_fakes(policy, gm, args)
    except Exception as err:  # noqa: BLE001 - an input torch's fake tensors do not take
        if report is not None:
            report.setdefault("problems", []).append(f"compiled without a fake mode: {type(err).__name__}: {err}")
        yield
        return
    _example_values(gm, fake_mode, [arg if fake is None else fake for arg, fake in zip(args, fakes)], report)
    with tracing_with(fake_mode):
        yield


@contextlib.contextmanager
def inner_compile(policy: ShapePolicy | None, gm: Any, args: list[Any],
                  report: dict | None) -> Iterator[tuple[Any, list[Any]]]:
    """Around Inductor's inner compiler for an after_aot graph: yields (``gm`` traced again, the
    example inputs) as AOTAutograd hands them over. The examples are fake values in a fake mode
    with a ShapeEnv, made with the recorded policy when it is symbolic (static otherwise); the
    re-trace runs in that mode, so every node's ``val`` carries the recorded symbols, and the
    mode is the tracing context's. PyTorch's after_aot replay re-traces a symbolic dump too, but
    with ``tracing_mode="symbolic"``, which makes a fresh symbol per size; a static one it
    re-traces on real data. One path here, for both: a bug of the symbolic compile reproduces,
    and ``report`` gets the guard comparison as for any symbolic compile."""

    fake_mode, fakes, shapes = placeholder_fakes(policy, gm, args)
    example = [fake_mode.from_tensor(arg, static_shapes=True) if fake is None and isinstance(arg, torch.Tensor)
               else arg if fake is None else fake for arg, fake in zip(args, fakes)]
    before = _before_the_compile(shapes, report) if shapes is not None else None
    try:
        with tracing_with(fake_mode):
            with fake_mode:
                traced = retraced(gm, example)
            yield traced, example
    finally:
        if shapes is not None and report is not None:
            report.update(compared(policy, shapes, report.get("guards_compared_at", AT_COMPILE_END), before))


def placeholder_fakes(policy: ShapePolicy | None, gm: Any, args: list[Any]) -> tuple[Any, list[Any], Any]:
    """(the fake mode a replay's compile runs in, each input's fake value in it, the
    ``ReplayShapes`` when ``policy`` is symbolic): made with the recorded per-dimension policy
    (``codec.shapes.fakes_for``), else static in a fresh ShapeEnv, as Dynamo's fake mode always
    has one; a non-tensor input's fake is None unless the policy makes it a symbol. Each
    placeholder of ``gm`` gets its fake as ``example_value``. Raises what fakifying raises."""

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    shapes = None
    if policy is not None and is_symbolic(policy):
        shapes = fakes_for(policy, args, [n.name for n in placeholders])
        fake_mode, fakes = shapes.fake_mode, list(shapes.fakes)
    else:
        fake_mode = new_fake_mode(replay_shape_env(policy))
        fakes = [fake_mode.from_tensor(a, static_shapes=True) if isinstance(a, torch.Tensor) else None for a in args]
    for node, fake in zip(placeholders, fakes):
        if fake is not None:
            set_example_value(node, fake)
    return fake_mode, fakes, shapes


def _example_values(gm: Any, fake_mode: Any, fakes: list[Any], report: dict | None) -> None:
    """Every node's ``example_value``, as Dynamo's graph carries them for a backend that reads
    them (``compat.subgraph_values.propagate_example_values``); a graph whose fake run fails keeps its
    placeholders' only, and ``report["example_values"]`` (``run --json``) says why."""

    try:
        propagate_example_values(gm, fake_mode, fakes)
    except Exception as err:  # noqa: BLE001 - an op without a fake kernel: the backend may not need them
        if report is not None:
            report["example_values"] = f"inputs only: {type(err).__name__}: {str(err)[:200]}"


#: where a replay's guards are compared with the recorded ones (the outcome's ``guards_compared_at``)
AT_COMPILE_END, AT_BACKEND_ENTRY, NOT_COMPARED = "compile end", "backend entry", "not compared"


def _before_the_compile(shapes: ReplayShapes, report: dict | None) -> list[str] | Exception | None:
    """The replay's guards before its compile, where they are what is compared: a backend other
    than the recorded one is judged on what it was handed (``codec.shape_guards``)."""
    if report is None or report.get("guards_compared_at") != AT_BACKEND_ENTRY:
        return None
    try:
        return shapes.guards()
    except Exception as err:  # noqa: BLE001 - a ShapeEnv that cannot render its guards
        return err


def compared(policy: ShapePolicy, shapes: ReplayShapes, at: str = AT_COMPILE_END,
             before: list[str] | Exception | None = None) -> dict[str, Any]:
    """The replay's guards next to the recorded ones (order does not matter), ``at`` the compile's
    end (with ``policy.guards``) or at backend entry (``before`` the compile, with those Dynamo
    made); an older archive replayed with another backend compares none (``NOT_COMPARED``)."""
    try:
        replayed = shapes.guards()
        if isinstance(before, Exception):
            raise before
    except Exception as err:  # noqa: BLE001 - a ShapeEnv that cannot render its guards
        return {"guards_match": None, "problems": [*shapes.problems, f"guards not rendered: {type(err).__name__}"]}
    # a log's or a dump's policy has no guards rendered this way
    if policy.recorded_from != "fake_tensors" or at == NOT_COMPARED:
        return {"guards_replayed": replayed, "guards_match": None, "problems": list(shapes.problems)}
    recorded, compared_with = ((list(policy.entry.guards), before) if at == AT_BACKEND_ENTRY and before is not None
                               else (list(policy.guards), replayed))
    return {"guards_replayed": replayed, "guards_match": sorted(recorded) == sorted(compared_with),
            "guards_missing": [g for g in recorded if g not in compared_with],
            "guards_extra": [g for g in compared_with if g not in recorded], "problems": list(shapes.problems)}


def report_for(records: Records, inputs: Sequence[Any] | None = None, backend: str | None = None) -> dict[str, Any]:
    """The outcome's ``shapes`` before the replay: the recorded policy (``records.shapes``) and
    what it recorded, and where its guards will be compared (``_compared_at``)."""
    policy = records.shapes
    if policy is None:
        return {"policy": "not recorded", "symbolic": looks_symbolic(inputs)}
    dims = [dim.source or f"input {r.input} dim {d}" for r in policy.inputs if r.kind == "tensor"
            for d, dim in enumerate(r.dims) if dim.kind != "static"]
    at, why = _compared_at(records, backend)
    return {"policy": "recorded", "symbolic": is_symbolic(policy), "symbolic_dims": dims,
            "unbacked": [s.name for s in policy.symbols if s.kind == "unbacked"],
            "guards_recorded": list(policy.guards), "guards_compared_at": at,
            **({"guards_compared_because": why} if why else {}),
            **({"guards_at_backend_entry": list(policy.entry.guards)} if policy.entry is not None else {})}


def _compared_at(records: Records, backend: str | None) -> tuple[str, str | None]:
    """Where a replay with ``backend`` compares its guards, and why not after the compile. After
    it where the compile is the recorded one: the recorded backend (or an unknown one) on the
    recorded graph. Before it, with the guards Dynamo made (``shapes.entry``), where it is not:
    another backend makes other guards of its own, and a graph cut from the recorded one
    (``records.parent``: a minifier's candidate or result) is another program to compile. An
    older archive does not say which guards are Dynamo's: another backend compares none, a cut
    graph compares after the compile, as before."""
    other_backend = records.backend not in (None, backend)
    why = "another backend than recorded" if other_backend else (
        "a graph cut from the recorded one" if records.parent is not None else None)
    if why is None:
        return AT_COMPILE_END, None
    if records.shapes.entry is not None:
        return AT_BACKEND_ENTRY, why
    return (NOT_COMPARED, why) if other_backend else (AT_COMPILE_END, None)


def looks_symbolic(inputs: Sequence[Any] | None) -> bool:
    """Whether an archive without a policy shows that its recording was symbolic: a symbolic
    scalar input or a tensor input with dynamic dimensions (index records, §6.3)."""

    return any(isinstance(v, SymValue) or (isinstance(v, TensorValue) and v.dynamic) for v in inputs or ())


def warnings_for(report: dict[str, Any]) -> list[str]:
    """What the verdict must say about shapes: an unknown policy, or guards that differ."""
    if report.get("policy") == "not recorded":
        if report.get("symbolic"):
            return ["the recording was symbolic (symbolic inputs or dynamic dimensions) but its shape policy was "
                    "not recorded: replayed with static shapes, so a pass says nothing about the symbolic compile"]
        return ["the shape policy was not recorded: replayed with static shapes"]
    out = [f"shape policy not fully re-created: {p}" for p in report.get("problems", [])]
    if report.get("guards_compared_at") == NOT_COMPARED and report.get("symbolic"):
        out.append("shape guards not compared: this backend is not the recorded one, and the archive (written "
                   "before format 1.6) does not say which of its guards the recorded backend added")
    if report.get("guards_match") is False:
        missing, extra = report.get("guards_missing", []), report.get("guards_extra", [])
        where = " at backend entry" if report.get("guards_compared_at") == AT_BACKEND_ENTRY else ""
        out.append(f"the replay's shape guards{where} differ from the recorded ones"
                   + (f"; missing: {'; '.join(missing[:5])}" if missing else "")
                   + (f"; extra: {'; '.join(extra[:5])}" if extra else ""))
    return out
