"""``verify`` and ``run`` judge a call target by one rule.

A name this torch cannot resolve is either refused by the effect rule without being resolved
(``torch.utils.cpp_extension.load`` while that module is not imported: nothing under
``torch.utils`` is a tensor function), or, where a newer torch could hold a tensor function of
that name, "not replayable here". ``verify`` used to call the first "ok", and ``run`` then
refused it as "does not exist in this torch".
"""

from __future__ import annotations

import pytest

import reproarchive
from reproarchive.errors import NotReplayableHereError, UnsafeArchiveError
from support import content_attacks as ca
from support.cli import invoke

NODE_X = ca.NODE_X


@pytest.fixture(scope="module")
def parsed(tmp_path_factory):
    return ca.valid_parsed(tmp_path_factory.mktemp("valid"))


def _archive(parsed, tmp_path, target: str):
    path = tmp_path / "a.tar.zst"
    path.write_bytes(ca.with_call(parsed, "call_function", target, [NODE_X]))
    return path


@pytest.mark.parametrize("command", ["verify", "run", "load"])
def test_cpp_extension_load_is_refused_by_the_effect_rule_everywhere(parsed, tmp_path, command):
    path = _archive(parsed, tmp_path, "torch.utils.cpp_extension.load")
    with pytest.raises(UnsafeArchiveError, match="tensor API") as caught:
        getattr(reproarchive, command)(path)
    assert "does not exist" not in str(caught.value)


@pytest.mark.parametrize("command", ["run", "load"])
def test_a_tensor_function_this_torch_lacks_is_not_replayable_here(parsed, tmp_path, command):
    path = _archive(parsed, tmp_path, "torch.nn.functional.from_a_newer_torch")
    with pytest.raises(NotReplayableHereError, match="not replayable here"):
        getattr(reproarchive, command)(path)


@pytest.mark.parametrize("command", ["verify", "inspect"])
def test_what_runs_nothing_lists_what_is_not_replayable_here_and_passes(parsed, tmp_path, command):
    """The archive is intact and nothing in it is refused: a verifier says what this process
    lacks to replay it, instead of the answer it gives a damaged or unsafe file."""
    path = _archive(parsed, tmp_path, "torch.nn.functional.from_a_newer_torch")
    report = getattr(reproarchive, command)(path)
    (what,) = report.not_replayable_here
    assert "from_a_newer_torch" in what and "not replayable here" in what


def test_verify_cli_gives_the_real_reason(parsed, tmp_path):
    path = _archive(parsed, tmp_path, "torch.utils.cpp_extension.load")
    result = invoke("verify", str(path))
    assert result.exit_code == 2
    assert "not allowed" in result.stderr and "tensor API" in result.stderr
    op = _archive(parsed, tmp_path, "torch.ops.not_a_library.op.default")
    missing = invoke("verify", str(op))
    assert missing.exit_code == 0 and "warning: not replayable here" in missing.stderr
    assert "not_a_library" in missing.stderr
    ran = invoke("run", str(op))
    assert ran.exit_code == 125 and "not replayable here" in ran.stderr
