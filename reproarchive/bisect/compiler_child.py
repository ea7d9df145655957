"""The child side of one ``bisect compiler`` replay: ``python -m reproarchive.bisect.compiler_child
FOLDER``.

PyTorch's bisector reads its state from ``TORCH_BISECT_*`` variables (set by the parent) and,
while it counts applications or bisects them, from files under ``CompilerBisector.get_dir()``.
The child points that folder at the bisection's private state folder before anything compiles,
so the counts it writes (the upper bound, the debug info of the last applications) reach the
parent and never the user's inductor cache. A config change the bisector tries for inductor
(``fallback_random`` ...) is applied inside the recorded config, where ``torch.compile`` would
apply it (``config_change_backend``); otherwise this is an ordinary isolated replay.
"""

from __future__ import annotations

import json
import os
import sys

from reproarchive.child import child_main
from reproarchive.codec.devices import DevicePlan
from reproarchive.compat import inductor
from reproarchive.replay.backends import resolve_backend
from reproarchive.replay.runner import run_here
from reproarchive.replay.settings import ReplaySettings

# Loaded here, so that a fork server (``bisect.compiler``) has imported the compiler once for
# all its children; what they share is imported code, never compiled state.
inductor.import_compiler()

#: the backend a config-change trial wraps, for ``config_change_backend``
WRAPPED_ENV = "REPROARCHIVE_BISECT_WRAPPED_BACKEND"


#: recorded Inductor settings put back to their defaults (JSON: key -> value), for ``config_flags``
FLAGS_ENV = "REPROARCHIVE_BISECT_INDUCTOR_DEFAULTS"


def config_change_backend(gm, example_inputs):
    """The wrapped backend, compiled under the inductor config change the bisector is trying
    (what ``torch.compile`` applies for it through ``_TorchCompileInductorWrapper``) and the
    recorded settings the flag search puts back to their defaults."""
    changes = {**inductor.bisector_config_changes("inductor"), **json.loads(os.environ.get(FLAGS_ENV) or "{}")}
    with inductor.patched_config(changes):
        return resolve_backend(os.environ[WRAPPED_ENV])(gm, example_inputs)


CONFIG_CHANGE_BACKEND = "reproarchive.bisect.compiler_child:config_change_backend"


def _replay(request: dict, *, started, event) -> dict:
    inductor.enable_bisector(request["state"])
    settings = ReplaySettings.from_plain(request["settings"])
    plan = DevicePlan.from_plain(request["plan"]) if request.get("plan") is not None else None
    return run_here(request["path"], settings, plan=plan, on_start=started).to_dict()


if __name__ == "__main__":
    sys.exit(child_main(_replay, unexpected_what="the bisection's replay failed"))
