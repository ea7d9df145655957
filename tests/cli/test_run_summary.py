"""``run --summary``: a bug report whose command, pasted, replays to the same verdict, with the
versions, the config the failing run changed and the graph."""

from __future__ import annotations

import shlex

import torch

from support.captures import capture_failure
from support.cli import invoke


def _replayed(command: str) -> int:
    words = shlex.split(command)
    assert words[:2] == ["reproarchive", "run"], words
    return invoke(*words[1:], "--quiet").exit_code


def test_the_report_names_the_verdict_and_its_command_replays_it(tmp_path, fresh_dynamo):
    with torch._inductor.config.patch({"freezing": True}):
        path = capture_failure(tmp_path / "r b.tar.zst", lambda x: torch.relu(x.sin()) * 2, [torch.randn(8)],
                               "relu_compile_error_TESTING_ONLY")
    report = tmp_path / "bug.md"
    result = invoke("run", path, "--device", "cpu", "--no-accuracy", "--summary", report, "--json")
    assert result.exit_code == 1, result.output
    text = report.read_text()
    assert text.startswith("### reproarchive run\n\n```\nREPRODUCED (exit 1)")
    assert f"- torch {torch.__version__} when recorded, {torch.__version__} here" in text
    assert "- failure: compile: " in text and "ReluCompileError" in text
    # the command: the replay options given (in the order --help lists them), quoted for a shell,
    # and not the ones that only change what is printed
    command = text.split("- replay it: `")[1].split("`")[0]
    assert command == f"reproarchive run {shlex.quote(str(path))} --device cpu --no-accuracy"
    assert _replayed(command) == 1
    config = text.split("set it before compiling):\n\n```python\n")[1].split("```")[0]
    assert "torch._inductor.config.freezing = True" in config
    graph = text.split("The graph:\n\n```python\n")[1].split("```")[0]
    assert "torch.relu" in graph and "def forward" in graph

    # a replay that passes gets a report too, whose command passes
    fixed = tmp_path / "fixed.md"
    result = invoke("run", path, "--backend", "eager", "--summary", fixed)
    assert result.exit_code == 0, result.output
    command = fixed.read_text().split("- replay it: `")[1].split("`")[0]
    assert command.endswith("--backend eager") and "PASSED (exit 0)" in fixed.read_text()
    assert _replayed(command) == 0


def test_a_graph_too_long_for_a_report_is_left_to_export(tmp_path):
    from support.graphs import pack_chain

    path = pack_chain(tmp_path / "long.tar.zst", 130)
    report = tmp_path / "bug.md"
    result = invoke("run", path, "--backend", "eager", "--summary", report)
    assert result.exit_code == 0, result.output
    text = report.read_text()
    assert "too many for a report" in text and f"reproarchive export {path} DIR" in text
    assert "```python" not in text  # no config was changed, and no graph


def test_an_archive_that_cannot_be_read_gets_an_error_and_no_report(tmp_path):
    bad = tmp_path / "bad.tar.zst"
    bad.write_bytes(b"not an archive")
    report = tmp_path / "bug.md"
    result = invoke("run", bad, "--summary", report)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert not report.exists() and list(tmp_path.iterdir()) == [bad]


def test_a_stored_archive_is_reported_by_its_reference(tmp_path, monkeypatch):
    """``run STORE/NAME --summary``: read from the copy ``run`` pulled, named by the reference."""
    import reproarchive
    from support.graphs import pack_chain

    monkeypatch.chdir(tmp_path)
    (pushed,) = reproarchive.push(pack_chain(tmp_path / "c.tar.zst", 3), "team")
    reference = f"team/{pushed.name}"
    result = invoke("run", reference, "--backend", "eager", "--summary", "bug.md")
    assert result.exit_code == 0, result.output
    text = (tmp_path / "bug.md").read_text()
    assert f"- replay it: `reproarchive run {reference} --backend eager`" in text and "The graph:" in text
