"""What a capture writes for a failing graph: its records, read in the failing call
(``capture_of``), the archive of them (``write_archive``), and the graph copy a backend keeps
before the compiler may rewrite the graph in place (``copy_graph_structure``). The capture
backend, the crash guard and the Inductor door all write through here."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from reproarchive.archive.writing import Capture, write_capture
from reproarchive.codec.recorded_calls import record_calls
from reproarchive.codec.rng import rng_snapshot
from reproarchive.codec.shapes import policy_of
from reproarchive.compat.dispatch import disable_current_modes
from reproarchive.compat.fake import is_unbacked
from reproarchive.compat.fx_meta import example_value_of
from reproarchive.context.environment import environment_snapshot
from reproarchive.context.execution import execution_snapshot
from reproarchive.context.system import system_snapshot
from reproarchive.format.schema import CaptureSource, ConfigRecord, FailureRecord, Records


def capture_of(gm: Any, inputs: list[Any], *, config: ConfigRecord, failure: FailureRecord, backend: str,
               accuracy: bool, capture_settings: dict, door: dict | None = None,
               rng_states: dict | None = None, custom_ops: list | None = None) -> Capture:
    """The failing graph, its inputs and the records of this process around them. ``door``: the
    source fields of a capture door that is not Dynamo's (``after_aot_hook``: ``graph_kind``
    after_aot, the door, how many inputs are real, where the failure came from). The execution
    state is read here, in the failing call: the backend call while Dynamo traces (compile
    failures) or the first call of the compiled graph (runtime failures, the crash guard), both
    under the grad mode and autocast Dynamo guarded the graph on. The shape policy is read from
    the fake values Dynamo left on ``gm``'s placeholders and their ShapeEnv (``codec.shapes``).
    So are the generator states (``rng_states`` None: read now): the check runs inside
    ``_preserved_state``, which puts them back before a failure is written, and Dynamo draws
    nothing while it traces, so now is just before the failing call; a caller that writes after
    the call ran passes the states it read before. ``custom_ops``: the calls recorded already
    (a rank of a job records them before its first call, while its inputs are untouched)."""
    source = CaptureSource(stage=failure.stage, fwd_only=bool(capture_settings.get("fwd_only")),
                           tolerance=capture_settings.get("tolerance"),
                           check_runtime=bool(capture_settings.get("check_runtime")),
                           written_before_run=True if failure.stage == "crash" else None, **(door or {}))
    # the custom ops' real outputs, from one run on copies of the real inputs; not before a
    # possible crash (the op itself may be what crashes)
    inputs = with_unbacked_sizes(gm, inputs)
    if custom_ops is None and failure.stage != "crash":
        custom_ops = record_calls(gm, inputs)
    return Capture(gm, inputs, Records(backend=backend, accuracy=accuracy, config=config,
                                       environment=environment_snapshot(), system=system_snapshot(),
                                       failure=failure, source=source, execution=execution_snapshot(inputs),
                                       shapes=policy_of(gm, inputs, config)),
                   rng_states=rng_snapshot(inputs) if rng_states is None else rng_states, custom_ops=custom_ops)


def with_unbacked_sizes(gm: Any, inputs: list[Any]) -> list[Any]:
    """``inputs`` with each size Dynamo passes as an unbacked symbol (``mark_unbacked``: a SymInt
    without a hint, which no archive can store) replaced by its value in the real tensor whose
    fake value on its placeholder has that symbol as a size: the run's own value, which the
    archive stores as the symbol's size (§6.3)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    sizes: dict[str, int] = {}
    for node, real in zip(placeholders, inputs):
        fake = example_value_of(node)
        if isinstance(fake, torch.Tensor) and isinstance(real, torch.Tensor) and fake.dim() == real.dim():
            for size, value in zip(fake.shape, real.shape):
                # a nested int has no expression; a fake has no value
                expr = getattr(size.node, "expr", None) if isinstance(size, torch.SymInt) else None
                if expr is not None and not isinstance(value, torch.SymInt):
                    sizes.setdefault(str(expr), int(value))
    return [sizes.get(str(v.node.expr), v) if is_unbacked(v) else v for v in inputs]


def write_archive(gm: Any, inputs: list[Any], destination: Path, **records: Any) -> Path:
    """``capture_of`` written to ``destination`` (redacted: ``archive.writing``). A compiler
    may be called with PyTorch's fake-tensor mode still active (AOTAutograd does so for graphs
    with ``cond`` or ``while_loop``): the records read real tensors (the generator states, the
    custom ops' calls), so all of it runs outside any mode."""

    with disable_current_modes():
        return write_capture(capture_of(gm, inputs, **records), destination)


def copy_graph_structure(gm: Any) -> Any:
    """A GraphModule with its own copy of the graph that shares the original's parameters,
    buffers and submodules: O(nodes), no tensor data copied."""

    try:
        graph = copy.deepcopy(gm.graph)
        copied = torch.fx.GraphModule(gm, graph, class_name=type(gm).__name__)
        copied.meta = dict(getattr(gm, "meta", {}) or {})
        return copied
    except Exception:  # exotic graphs: fall back to a full copy
        return copy.deepcopy(gm)
