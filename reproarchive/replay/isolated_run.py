"""The child side of an isolated replay: ``python -m reproarchive.replay.isolated_run FOLDER``,
or ``--serve`` as a warm worker of ``isolation.WorkerPool``.

It reports what it is about to replay (``started``) before compiling, so that if the compiler
takes the process down, the parent can still say what crashed (``replay.isolation``).
"""

from __future__ import annotations

import sys

from reproarchive.child import child_main
from reproarchive.replay.runner import replay_graph, run_here
from reproarchive.replay.settings import ReplaySettings


def _replay(request: dict, *, started, event) -> dict | None:
    if "warmup" in request:
        _warm(request["warmup"])
        return None
    settings = ReplaySettings.from_plain(request["settings"])
    return run_here(request["path"], settings, on_start=started).to_dict()


def _warm(spec: dict) -> None:
    """Pay the backend's first-use cost (imports, toolchain probes) on a one-op graph."""
    import torch
    import torch.fx as fx

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
    sys.exit(child_main(_replay, unexpected_what="the isolated replay failed"))
