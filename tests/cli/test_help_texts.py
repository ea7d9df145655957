"""Every command's ``--help``, word for word, against ``tests/data/help_texts.txt``: a change to
what a user reads (an option renamed, an exit code dropped, a command gone) shows in review as a
diff of that file, and moving code between modules cannot change it unnoticed.

After an intended change: ``python tests/cli/test_help_texts.py --write``."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from reproarchive.cli import main

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "help_texts.txt"
WIDTH = 100  # fixed, so the text does not depend on the terminal the test runs in


def _context(command: click.Command, name: str, parent: click.Context | None = None) -> click.Context:
    """The context ``--help`` prints in, as click makes it (the command's own settings: ``-h``)."""
    settings = {**command.context_settings, "terminal_width": WIDTH, "max_content_width": WIDTH}
    return click.Context(command, info_name=name, parent=parent, **settings)


def _commands(command: click.Command, ctx: click.Context):
    yield ctx, command
    if isinstance(command, click.Group):
        for name in sorted(command.commands):
            sub = command.commands[name]
            yield from _commands(sub, _context(sub, name, ctx))


def help_texts() -> str:
    """One document: each command's path as a heading, then its help as ``--help`` prints it."""
    root = _context(main, "reproarchive")
    parts = []
    for ctx, command in _commands(main, root):
        parts.append(f"===== {ctx.command_path}\n{command.get_help(ctx)}\n")
    return "\n".join(parts)


def test_every_commands_help_is_the_reviewed_text():
    assert GOLDEN.read_text() == help_texts(), \
        "a --help text changed: review it, then run python tests/cli/test_help_texts.py --write"


def test_every_command_is_covered():
    """A command added without its reviewed help, or one removed, fails here by name."""
    listed = {line.removeprefix("===== ") for line in GOLDEN.read_text().splitlines() if line.startswith("===== ")}
    root = _context(main, "reproarchive")
    assert listed == {ctx.command_path for ctx, _ in _commands(main, root)}


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/cli/test_help_texts.py --write")
    GOLDEN.write_text(help_texts())
    print(f"wrote {GOLDEN}")
