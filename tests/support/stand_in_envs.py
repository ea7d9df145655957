"""Stand-in interpreters for ``bisect torch`` and ``triage --against``: an executable script that
answers the environment probe as a torch release would and answers each ``run --json`` with the
next document of its script, so the rules built on verdicts are checked exactly and in seconds
(the real replays in real environments are in test_bisect_torch.py and test_fleet.py)."""

from __future__ import annotations

import sys
from pathlib import Path

#: an interpreter whose ``run --json`` answers, call after call, the next document of its script
STAND_IN = '''#!{python}
import json, sys
from pathlib import Path
here = Path(__file__).with_suffix("")
if sys.argv[1].endswith("env_probe.py"):
    print(json.dumps({{"python": "3.11", "torch": "{torch}", "git_version": "{torch}-commit",
                      "reproarchive": "/stand-in/reproarchive/__init__.py", "reproarchive_version": "0"}}))
    sys.exit(0)
calls = here.with_name(here.name + ".calls")
n = int(calls.read_text()) if calls.exists() else 0
calls.write_text(str(n + 1))
code, status = {script!r}[n]
print(json.dumps({{"status": status, "observed": {{"signature": "RuntimeError: other"}}}}))
sys.exit(code)
'''
PASSED, REPRODUCED, OTHER = (0, "passed"), (1, "reproduced"), (3, "different failure")


def stand_in(folder: Path, name: str, torch: str, script: list[tuple[int, str]]) -> Path:
    """An interpreter at ``folder/name`` with ``torch`` whose replays answer ``script`` in turn."""
    path = folder / name
    path.write_text(STAND_IN.format(python=sys.executable, torch=torch, script=script))
    path.chmod(0o755)
    return path


def calls(env: Path) -> int:
    """How many replays the stand-in ``env`` has answered."""
    calls = env.with_name(env.name + ".calls")
    return int(calls.read_text()) if calls.exists() else 0
