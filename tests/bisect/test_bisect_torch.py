"""``bisect torch`` replays one archive under several environments: it names the one with the
planted bug, and an environment whose reproarchive cannot read the archive is skipped, not bad."""

from __future__ import annotations

import json

import pytest
import torch

from support.captures import capture_failure
from support.cli import invoke
from support.torch_envs import SILU_BUG, install_old_reader, make_env, planted_silu


def silu_graph(x):
    return torch.nn.functional.silu(x) * 2


@pytest.mark.slow
def test_the_environment_with_the_planted_bug_is_named_and_an_old_reader_is_skipped(tmp_path, fresh_dynamo):
    with planted_silu():
        archive = capture_failure(tmp_path / "silu.tar.zst", silu_graph, [torch.randn(16)],
                                  "aot_eager_decomp_partition", accuracy=True)
    old = make_env(tmp_path, "old-reader")
    install_old_reader(old.parents[1])
    good = make_env(tmp_path, "good")
    bad = make_env(tmp_path, "bad", sitecustomize=SILU_BUG)
    summary = tmp_path / "bug.html"
    result = invoke("bisect", "torch", archive, "--env", old, "--env", good, "--env", bad, "--json",
                    "--summary", summary)
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    verdicts = {v["python"]: v for v in document["verdicts"]}
    assert verdicts[str(old)]["verdict"] == "skipped"
    assert "cannot load here" in verdicts[str(old)]["reason"] and "format" in verdicts[str(old)]["reason"]
    assert verdicts[str(good)]["verdict"] == "good"
    assert verdicts[str(bad)]["verdict"] == "bad"
    assert document["first_bad"] == str(bad) and document["last_good"] == str(good)
    assert all(v["git_version"] == torch.version.git_version for v in document["verdicts"])
    assert "installed reproarchive" in verdicts[str(good)]["reader"]
    assert "first bad environment" in summary.read_text()


def test_a_missing_interpreter_is_exit_4_with_a_json_error(tmp_path):
    archive = tmp_path / "a.tar.zst"
    archive.write_bytes(b"")
    result = invoke("bisect", "torch", archive, "--env", tmp_path / "no-python", "--json")
    assert result.exit_code == 4
    assert json.loads(result.stdout)["error"]["code"] == "E_SOURCE"
