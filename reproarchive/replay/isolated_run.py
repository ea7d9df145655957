"""The child side of an isolated replay: ``python -m reproarchive.replay.isolated_run FOLDER``.

It reports what it is about to replay (``started``) before compiling, so that if the compiler
takes the process down, the parent can still say what crashed (``replay.isolation``).
"""

from __future__ import annotations

import sys

from reproarchive.child import child_main
from reproarchive.replay.runner import run_here


def _replay(request: dict, *, started, event) -> dict:
    return run_here(request["path"], on_start=started, **request["options"]).to_dict()


if __name__ == "__main__":
    sys.exit(child_main(_replay, unexpected_what="the isolated replay failed"))
