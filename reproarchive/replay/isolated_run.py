"""The child side of an isolated replay: ``python -m reproarchive.replay.isolated_run FOLDER``,
or ``--serve`` as a warm worker of ``isolation.WorkerPool``.

It reports what it is about to replay (``started``) before compiling, so that if the compiler
takes the process down, the parent can still say what crashed (``replay.isolation``). A
request's ``device`` is the parent's resolved ``DevicePlan`` as plain data (or None: the
recorded devices), so the device is resolved once per run, in the parent.
"""

from __future__ import annotations

import sys

from reproarchive.child import child_main
from reproarchive.codec.devices import DevicePlan
from reproarchive.replay.runner import replay_graph, run_here


def _replay(request: dict, *, started, event) -> dict | None:
    if "warmup" in request:
        _warm(request["warmup"])
        return None
    options = dict(request["options"])
    if options.get("device") is not None:  # the parent's resolved DevicePlan, as plain data
        options["device"] = DevicePlan.from_plain(options["device"])
    return run_here(request["path"], on_start=started, **options).to_dict()


def _warm(spec: dict) -> None:
    """Pay the backend's first-use cost (imports, toolchain probes) on a one-op graph."""
    import torch
    import torch.fx as fx

    g = fx.Graph()
    x = g.placeholder("x")
    g.output((g.call_function(torch.ops.aten.sin.default, (x,)),))
    gm = fx.GraphModule(torch.nn.Module(), g)
    try:
        replay_graph(gm, [torch.ones(4)], backend=spec.get("backend") or "eager", source_kind=spec.get("source_kind"),
                     only_fwd=True, report_differences=False)
    except Exception:  # noqa: BLE001 - a failed warm-up only costs the first request its setup
        pass


if __name__ == "__main__":
    sys.exit(child_main(_replay, unexpected_what="the isolated replay failed"))
