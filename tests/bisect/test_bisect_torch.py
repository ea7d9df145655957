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
    # one replay each: how many replays the default measures is test_bisect_repeat.py's (stand-ins)
    result = invoke("bisect", "torch", archive, "--env", old, "--env", good, "--env", bad, "--json",
                    "--summary", summary, "--repeat", "1")
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
    assert document["flakiness"] is None
    assert verdicts[str(bad)]["replays"] == ["bad"] and verdicts[str(good)]["replays"] == ["good"]


def test_a_missing_interpreter_is_exit_4_with_a_json_error(tmp_path):
    archive = tmp_path / "a.tar.zst"
    archive.write_bytes(b"")
    result = invoke("bisect", "torch", archive, "--env", tmp_path / "no-python", "--json")
    assert result.exit_code == 4
    assert json.loads(result.stdout)["error"]["code"] == "E_SOURCE"


# -- nothing compared, no verdict, no reproarchive: never a culprit -------------------------------

#: what an environment without reproarchive is, in a venv that sees this one's packages: its
#: sitecustomize drops this environment's way to reproarchive (an editable install's finder, the
#: tree on its path), so only a copy given on PYTHONPATH can be imported
HIDE_REPROARCHIVE = '''
import sys

sys.meta_path[:] = [f for f in sys.meta_path if "reproarchive" not in (getattr(f, "__module__", "") or "")
                    and "reproarchive" not in type(f).__module__]
sys.path[:] = [p for p in sys.path if p != {root!r}]
'''


def relu_graph(x):
    return torch.relu(x) + 1


@pytest.fixture(scope="module")
def relu_archive(tmp_path_factory):
    return capture_failure(tmp_path_factory.mktemp("bisect-env") / "relu.tar.zst", relu_graph, [torch.randn(8)],
                           "relu_compile_error_TESTING_ONLY")


@pytest.mark.slow
def test_one_bad_environment_alone_names_no_culprit(relu_archive):
    import sys

    result = invoke("bisect", "torch", relu_archive, "--env", sys.executable, "--json")
    document = json.loads(result.stdout)
    assert [v["verdict"] for v in document["verdicts"]] == ["bad"]
    assert result.exit_code == 3 and document["status"] == "no good environment before the first bad one"
    assert document["last_good"] is None and document["commit_range"] is None
    # what the command prints without --json, from the same document (a second bisection would
    # replay the archive again for the same verdict)
    from reproarchive.bisect.results import TorchBisection
    from reproarchive.cli.bisect_text import torch_lines
    from reproarchive.format.plain import from_plain

    text = "\n".join(torch_lines(from_plain(TorchBisection, document)))
    assert "nothing was compared" in text and "the first bad environment is" not in text


def test_a_replay_that_dies_importing_its_reader_is_skipped_not_bad(relu_archive, tmp_path):
    import sys

    # exit 1 (what "reproduced" exits with), but no verdict: the reader could not even start
    broken = tmp_path / "python"
    broken.write_text(f'#!/bin/sh\nif [ "$1" = "-c" ]; then\n'
                      f'  echo "ModuleNotFoundError: No module named \'reproarchive.cli\'" >&2; exit 1\nfi\n'
                      f'exec {sys.executable} "$@"\n')
    broken.chmod(0o755)
    result = invoke("bisect", "torch", relu_archive, "--env", broken, "--json")
    (verdict,) = json.loads(result.stdout)["verdicts"]
    assert verdict["verdict"] == "skipped" and "ModuleNotFoundError" in verdict["reason"], verdict
    assert result.exit_code == 3 and json.loads(result.stdout)["status"] == "no bad environment"


@pytest.mark.slow
def test_an_environment_without_reproarchive_replays_with_a_copy_of_it(relu_archive, tmp_path):
    from support.torch_envs import ROOT

    bare = make_env(tmp_path, "bare", sitecustomize=HIDE_REPROARCHIVE.format(root=str(ROOT)))
    result = invoke("bisect", "torch", relu_archive, "--env", bare, "--json")
    (verdict,) = json.loads(result.stdout)["verdicts"]
    assert verdict["reader"].startswith("bundled"), verdict
    # the copy replays with that environment's torch, and gives a verdict
    assert verdict["verdict"] == "bad" and verdict["torch"] == torch.__version__, verdict
