"""A kept first call's custom-op calls, recorded once the call has failed.

Why. The crash guard writes a graph's spool entry before its first call (a call may crash the
process), so the entry cannot hold what the graph's custom ops return: they have not run yet.
When that call fails and the entry is kept as the failure's archive (``crash_guard._keep``),
the process is alive and has the ops: they are run once on the kept inputs, which are the
inputs as they were before the call, and the archive is written again with their calls. Without
them a replay elsewhere has no stand-in for the op and can only say "cannot run the op" (125),
where the capture backend's archive of the same failure reproduces.

Not done where the archive stores an input as absent (outputs computed from generated data are
not real) or where the run cannot be made (a device that faulted): the archive stays as kept.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from reproarchive.archive.loading import load
from reproarchive.archive.packing import pack
from reproarchive.codec.recorded_calls import record_calls
from reproarchive.codec.tensors import FIDELITY_ABSENT

log = logging.getLogger("reproarchive.capture")


def with_op_calls(kept: Path, op_graph: Any) -> bool:
    """Archive ``kept`` written again with the calls of ``op_graph``'s custom ops (``op_graph``:
    the graph Dynamo handed the backend, before the backend rewrote it), run on the kept inputs.
    Whether it was; never raises (the kept archive is the program's record either way)."""
    try:
        repro = load(kept)
        if FIDELITY_ABSENT in repro.fidelity:
            return False
        calls = record_calls(op_graph, list(repro.args))
        if not any(op.calls for op in calls):
            return False
        pack(repro.gm, repro.args, kept, records=repro.records, rng_states=repro.rng_states or None,
             custom_ops=calls)
        return True
    except Exception as err:  # noqa: BLE001 - never in place of the program's own failure
        log.debug("reproarchive capture: the kept call's custom ops were not recorded: %s: %s",
                  type(err).__name__, err)
        return False
