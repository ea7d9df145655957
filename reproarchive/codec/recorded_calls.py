"""Running a graph once on real data to record what its foreign code did: the outputs of each
custom-op call (``custom_ops``) and what each user Triton kernel launch wrote (``triton_kernels``).

A capture that holds the real inputs runs the graph once more, on copies, through an FX
interpreter that records those calls; a source whose inputs are generated records none (its
outputs would not be real).
"""

from __future__ import annotations

from typing import Any

import torch

from reproarchive.codec import triton_kernels
from reproarchive.codec.collectives import collective_of
from reproarchive.codec.custom_ops import (
    LiveCall,
    LiveCustomOp,
    argument_key,
    custom_ops_of,
    describe,
    is_custom,
    op_name,
    overload_of,
    returned,
)
from reproarchive.codec.device_runtime import devices_of, forked_rng
from reproarchive.compat.fake import is_fake


class _BeforeCollective(Exception):
    """Ends the recording run before a collective."""


def _is_real(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return type(value) in (torch.Tensor, torch.nn.Parameter) and not is_fake(value) and value.device.type != "meta"
    if isinstance(value, (list, tuple)):
        return all(_is_real(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str, torch.SymInt))


def record_calls(gm: Any, inputs: list[Any]) -> list[Any]:
    """Run ``gm`` once on copies of ``inputs`` (grad off) and record every custom-op call and
    (1.4) what every user Triton kernel launch wrote (``LiveTritonKernel``): what a capture that
    holds the real inputs stores. Ops the run did not reach (it failed earlier)
    have no calls; a graph without custom ops is not run at all.

    The run changes nothing of the program's: the generators are put back after it, and it
    stops before the graph's first collective (a rank of a job that issued one here would meet
    its peers' next collective in place of its own), so an op called after one has no calls."""
    ops = custom_ops_of(gm)
    if not ops and not triton_kernels.has_launches(gm):
        return []
    live = {op_name(op): LiveCustomOp(describe(op)) for op in ops}
    kernels: dict[str, triton_kernels.LiveTritonKernel] = {}
    if not all(_is_real(x) for x in inputs):  # outputs computed from generated data are not real
        return list(live.values())

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            if n.op == "call_function" and collective_of(n) is not None:
                raise _BeforeCollective
            self.node = n
            return super().run_node(n)

        def call_function(self, target, args, kwargs):
            if triton_kernels.is_launch(target):  # (1.4) what a user Triton kernel wrote
                return triton_kernels.recorded_launch(
                    target, kwargs, lambda: super(Recorder, self).call_function(target, args, kwargs), kernels,
                    fresh=triton_kernels.fresh_buffers(self.node))
            out = super().call_function(target, args, kwargs)
            if is_custom(target):
                op = overload_of(target)
                outputs = returned(op._schema, out)
                call = LiveCall(argument_key(op._schema, args, kwargs),
                                tuple(o.detach().clone() if isinstance(o, torch.Tensor) else o for o in outputs))
                entry = live[op_name(op)]
                if all(c.arguments != call.arguments for c in entry.calls):
                    entry.calls.append(call)
            return out

    copies = [x.detach().clone() if isinstance(x, torch.Tensor) else x for x in inputs]
    try:
        with torch.no_grad(), forked_rng(devices_of(copies)):
            Recorder(gm).run(*copies)
    except Exception:  # noqa: BLE001 - the calls before the failure (or the first collective) are still real
        pass
    return [*live.values(), *kernels.values()]
