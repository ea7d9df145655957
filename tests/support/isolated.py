"""Running an exported ``repro.py`` in a child Python where only torch is importable.

The child is started with ``-I`` (no PYTHONPATH, no cwd on sys.path) and ``reproarchive`` is
blocked in ``sys.modules``, so a script that imported reproarchive would fail.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap


def run_isolated(script, *argvs, cwd):
    """Run ``script`` once per argv in one child Python where only torch is importable.

    Returns one (outcome, detail) per run: ("ok", stdout text), or for a failure the script judged
    against the recorded one ("reproduced", exit 1, or "different", exit 3) the failure's "Type:
    message", or ("raised", "Type: message") for any other exception.
    One child for several runs keeps the cost of importing torch to once per test.
    """
    code = textwrap.dedent(f"""
        import contextlib, io, json, runpy, sys, traceback
        sys.modules["reproarchive"] = None
        results = []
        for argv in {[list(a) for a in argvs]!r}:
            sys.argv = [{str(script)!r}, *argv]
            out = io.StringIO()
            try:
                with contextlib.redirect_stdout(out):
                    runpy.run_path({str(script)!r}, run_name="__main__")
                results.append(["ok", out.getvalue()])
            except BaseException as exc:
                judged = isinstance(exc, SystemExit) and exc.code in (1, 3) and exc.__context__ is not None
                cause = exc.__context__ if judged else exc  # the failure the script judged, and its verdict
                verdict = {{1: "reproduced", 3: "different"}}.get(exc.code) if judged else "raised"
                results.append([verdict, type(cause).__name__ + ": " + str(cause) + "\\n" + traceback.format_exc()])
            import torch._dynamo
            torch._dynamo.reset()
        print("RESULTS" + json.dumps(results))
    """)
    proc = subprocess.run([sys.executable, "-I", "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300)
    marker = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS")]
    assert proc.returncode == 0 and marker, proc.stderr[-3000:]
    return json.loads(marker[-1][len("RESULTS"):])
