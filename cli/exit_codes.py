"""The "Exit codes:" block of each command's ``--help``, built from shared lines so that the
same code reads the same everywhere. ``tests/cli/test_exit_codes.py`` checks that every
command lists the codes it returns and that README's table names every code listed."""

from __future__ import annotations

import textwrap

USAGE = (2, "usage error, or the archive is invalid, damaged, unsafe or too new (one line says what)")
ARCHIVE_MISSING = (4, "the archive file is missing or cannot be read")
STORE_MISSING = (4, "a store reference (STORE/NAME): the store, or the name asked for in it, does not exist")
STORE_UNREACHABLE = (5, "a store reference: the store cannot be reached or answered an error")
INTERNAL = (70, "internal error (a bug in reproarchive; --debug shows the traceback)")
INTERRUPTED = (130, "interrupted (Ctrl-C)")


def exit_codes(*rows: tuple[int, str]) -> str:
    """``\\b``-protected lines ``  CODE  meaning``, a meaning longer than one line wrapped under
    itself; several rows of one code are joined into one."""
    merged: dict[int, list[str]] = {}
    for code, meaning in rows:
        merged.setdefault(code, []).append(meaning)
    lines = ["\b", "Exit codes:"]
    for code in sorted(merged):
        lines.append(textwrap.fill("; ".join(merged[code]), width=92, initial_indent=f"  {code:<5}",
                                   subsequent_indent=" " * 7))
    return "\n".join(lines) + "\n"
