"""Exit codes as documented: each command's ``--help`` lists the code it returns for a missing
input, every code a command lists is in the top-level help, and README's table has exactly the
top-level help's codes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from reproarchive.cli import main
from support.cli import invoke

ROOT = Path(__file__).resolve().parents[2]


def _codes(help_text: str) -> set[int]:
    block = help_text.split("Exit codes:", 1)[1]
    block = re.split(r"\n\s*\n", block, maxsplit=1)[0]
    return {int(m) for m in re.findall(r"^\s+(\d+)\s", block, flags=re.MULTILINE)}


def _missing_input_args(command: str, tmp: Path) -> list:
    missing = tmp / "missing.tar.zst"
    return {
        "diff": [missing, tmp / "missing2.tar.zst"],
        "export": [missing, "-o", tmp / "out"],
        "push": [missing, tmp / "store"],
        "pull": [f"{tmp / 'no-store'}/name", "-o", tmp / "out.tar.zst"],
        "capture": ["--", str(tmp / "no-such-program")],
        "demo": ["-C", tmp / "missing.tar.zst" / "under-a-file"],
        "bisect": ["compiler", missing],
    }.get(command, [missing])


@pytest.mark.parametrize("command", sorted(c for c in main.commands))
def test_help_lists_the_code_of_a_missing_input(command, tmp_path):
    if command == "demo":
        (tmp_path / "missing.tar.zst").write_text("a file, so the demo's folder cannot be made under it")
    result = invoke(command, *_missing_input_args(command, tmp_path))
    assert result.exit_code != 0, result.output
    listed = _codes(invoke(command, "--help").stdout)
    assert result.exit_code in listed, (f"`{command}` exits {result.exit_code} ({result.output.strip()}) "
                                        f"but its --help lists {sorted(listed)}")


def test_every_code_a_command_lists_is_in_the_top_level_help_and_the_readme():
    top = _codes(invoke("--help").stdout)
    for command in main.commands:
        assert _codes(invoke(command, "--help").stdout) <= top, command
    table = ROOT.joinpath("README.md").read_text().split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    readme = {int(c) for c in re.findall(r"^\| (\d+) \|", table, flags=re.MULTILINE)}
    assert readme == top


@pytest.mark.parametrize("args", [["--bogus"], ["--json", "inspect", "x"], ["no-such-command"]])
def test_a_usage_error_of_the_group_is_one_line_and_exit_2(args):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: ") and "reproarchive --help" in result.stderr


def test_no_arguments_prints_the_help():
    result = invoke()
    assert "Usage: " in result.output and "Exit codes:" in result.output and "error:" not in result.output
