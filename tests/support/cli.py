"""Running the command line in-process, as a user would type it."""

from __future__ import annotations

from click.testing import CliRunner, Result

from reproarchive.cli import main


def invoke(*args, **kwargs) -> Result:
    """``reproarchive ARGS...``; arguments may be paths."""
    return CliRunner().invoke(main, [str(a) for a in args], **kwargs)
