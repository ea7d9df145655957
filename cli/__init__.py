"""The ``reproarchive`` command line: a thin click layer over the library's public functions.

Each command lives in its own module and registers itself on ``main``; the library never
imports this package. Errors become one line on stderr and a documented exit code.
"""

from __future__ import annotations

# Importing a command module registers its commands on ``main``.
from . import (  # noqa: E402,F401
    archive_cmds,
    bisect_cmds,
    capture_cmds,
    demo_cmd,
    fleet_cmd,
    ls_cmd,
    replay_cmds,
    store_cmds,
    triage_cmds,
)
from .app import main

__all__ = ["main"]
