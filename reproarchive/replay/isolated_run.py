"""The child side of an isolated replay: ``python -m reproarchive.replay.isolated_run FOLDER``,
or ``--serve`` as a warm worker of ``isolation.WorkerPool``.

It reports what it is about to replay (``started``) before compiling, so that if the compiler
takes the process down, the parent can still say what crashed (``replay.isolation``). A
request carries the ``ReplaySettings`` and the parent's resolved ``DevicePlan`` as plain data
(the plan None: resolve ``settings.device`` here), so the device is resolved once per run.
"""

from __future__ import annotations

import sys

import torch
import torch.fx as fx

from reproarchive.child import child_main
from reproarchive.codec.devices import DevicePlan
from reproarchive.compat import dynamo
from reproarchive.replay.runner import replay_graph, run_here
from reproarchive.replay.settings import ReplaySettings


def _replay(request: dict, *, started, event) -> dict | None:
    if "warmup" in request:
        _warm(request["warmup"])
        return None
    settings = ReplaySettings.from_plain(request["settings"])
    plan = DevicePlan.from_plain(request["plan"]) if request.get("plan") is not None else None
    return run_here(request["path"], settings, plan=plan, on_start=started).to_dict()


def _warm(spec: dict) -> None:
    """Pay the backend's first-use cost (imports, toolchain probes) on a one-op graph."""

    g = fx.Graph()
    x = g.placeholder("x")
    g.output((g.call_function(torch.ops.aten.sin.default, (x,)),))
    gm = fx.GraphModule(torch.nn.Module(), g)
    try:
        replay_graph(gm, [torch.ones(4)], ReplaySettings(backend=spec.get("backend") or "eager", only_fwd=True),
                     source_kind=spec.get("source_kind"), report_differences=False)
    except Exception:  # noqa: BLE001 - a failed warm-up only costs the first request its setup
        pass


if __name__ == "__main__":
    sys.exit(child_main(_replay, unexpected_what="the isolated replay failed",
                        warm_imports=(dynamo.MODULE,)))
