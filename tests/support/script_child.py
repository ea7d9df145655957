"""A child module that runs one script per request as ``python SCRIPT ARGS`` in a folder would,
each in a fresh process forked from a server that imported torch and Dynamo once
(``child.ForkServer``): for tests that run many exported scripts, which would otherwise pay
those imports once each."""

from __future__ import annotations

import os
import runpy
import sys
import traceback

from reproarchive.child import child_main


def _handle(request: dict, *, started, event) -> dict:
    started({"script": request["script"]})
    os.chdir(request["cwd"])
    sys.argv = [request["script"], *request["args"]]
    sys.path[0] = os.path.dirname(request["script"])
    try:
        runpy.run_path(request["script"], run_name="__main__")
    except SystemExit as exc:
        return {"code": exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)}
    except BaseException:  # noqa: BLE001 - the script's own failure: its traceback in the log
        traceback.print_exc()
        return {"code": 1}
    return {"code": 0}


if __name__ == "__main__":
    sys.exit(child_main(_handle, warm_imports=("torch._dynamo",)))
