"""``bisect compiler`` finds a bug planted the way PyTorch's own bisector tests plant them, the
settings it prints make the failure appear and go, and nothing of the bisection stays behind:
not in the user's inductor cache, not in the bisector's class state, not in a later compile."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import torch
from torch._inductor import compiler_bisector as pt

import reproarchive
from reproarchive import documents
from reproarchive.bisect.compiler import state_folders
from support import bisect_bugs
from support.captures import capture_failure
from support.cli import invoke


@pytest.fixture
def private_inductor_cache(tmp_path, monkeypatch) -> Path:
    """A user's inductor cache of the test's own, for the test to look into afterwards."""
    cache = tmp_path / "inductor-cache"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    return cache


@pytest.fixture
def user_inductor_cache() -> Path:
    """The inductor cache this machine's compiles use (warm: a cold one would compile every
    kernel of every replay again); it must hold no bisector state before the test."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    cache = Path(cache_dir())
    if (cache / "bisect").exists():
        pytest.skip(f"{cache / 'bisect'} holds a PyTorch bisection of someone else's")
    return cache


def _bisector_at_rest() -> None:
    assert pt.CompilerBisector.in_process_cache is None
    assert pt.CompilerBisector.bisection_enabled is False
    assert pt.CompilerBisector.get_backend() is None
    assert [s.name for s in pt.BACKENDS["inductor"]][0] == "pre_grad_passes"


def _validate(document: dict) -> None:
    schema = json.loads(documents.SCHEMA_FILE.read_text())
    jsonschema.validate(document, {"$ref": "#/$defs/command.bisect.compiler", "$defs": schema["$defs"]})


def _run_printed(command: str, archive: Path) -> int:
    """Run a line ``bisect compiler`` printed (``VAR=value ... reproarchive run ARCHIVE ...``)."""
    words = shlex.split(command)
    env = dict(os.environ)
    while "=" in words[0]:
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    assert words[:3] == ["reproarchive", "run", str(archive)], words
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    code = "import sys; from reproarchive.cli import main; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, *words[1:], "--quiet"], env=env,
                          capture_output=True, timeout=300).returncode


@pytest.mark.slow
def test_a_post_grad_pass_bug_is_named_and_its_settings_make_it_appear_and_go(tmp_path, user_inductor_cache,
                                                                            fresh_dynamo):
    archive = capture_failure(tmp_path / "pg.tar.zst", bisect_bugs.scaled_sin, [torch.randn(8)],
                              bisect_bugs.post_grad_bug, accuracy=True)
    before = set(state_folders(os.getpid()))
    summary = tmp_path / "bug.md"
    # --from inductor: the four stages before it are taken as good without a replay (the
    # decomposition test below replays them), which keeps the suite inside its time
    result = invoke("bisect", "compiler", archive, "--backend", bisect_bugs.POST_GRAD_BACKEND, "--json",
                    "--summary", summary, "--from", "inductor")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    _validate(document)
    assert (document["backend"], document["subsystem"]) == ("inductor", "post_grad_passes")
    assert isinstance(document["bisect_number"], int) and document["bisect_number"] >= 0
    assert "post_grad_custom_post_pass" in document["debug_info"]
    verdicts = [s["verdict"] for s in document["steps"]]
    assert verdicts[:4] == ["good"] * 4 and verdicts[4] == "bad"  # eager ... crossref pass, inductor fails
    assert [s.get("replayed", True) for s in document["steps"][:4]] == [False] * 4
    # the typed record next to the archive is what was printed
    stored = reproarchive.read_bisection(archive)
    assert stored.to_plain() == document
    text = summary.read_text()
    assert "post_grad_passes" in text and "TORCH_BISECT_MAX" in text and "def forward" in text

    # nothing stays behind: no state folder, nothing in the user's cache, the bisector at rest,
    # and a normal compile in this process compiles (and caches) as before
    assert set(state_folders(os.getpid())) == before
    assert not (user_inductor_cache / "bisect").exists()
    _bisector_at_rest()
    torch._dynamo.reset()
    x = torch.randn(8)
    torch.testing.assert_close(torch.compile(bisect_bugs.scaled_sin)(x), bisect_bugs.scaled_sin(x))
    assert not (user_inductor_cache / "bisect").exists()

    # the printed settings: the failure appears (exit 1, reproduced) and disappears (exit 0)
    stored_appear, stored_disappear = stored.appear.command(str(archive)), stored.disappear.command(str(archive))
    assert stored_appear in text and stored_disappear in text
    assert _run_printed(stored_appear, archive) == 1
    assert _run_printed(stored_disappear, archive) == 0
    assert not (user_inductor_cache / "bisect").exists()


def test_ctrl_c_removes_the_state_folder_and_restores_the_bisector(tmp_path, private_inductor_cache):
    """Interrupted at its first step (the stages before --from are not replayed, so no compile is
    needed to get there): the state folder goes, the bisector's class state is as before, and
    PyTorch's own cleanup did not touch the user's cache."""
    archive = tmp_path / "a.tar.zst"
    reproarchive.pack(torch.fx.symbolic_trace(torch.nn.ReLU()), [torch.ones(3)], archive, backend="inductor")
    (private_inductor_cache / "bisect").mkdir(parents=True)
    (private_inductor_cache / "bisect" / "bisect_status.txt").write_text("a bisection of the user's own\n")
    before = set(state_folders(os.getpid()))

    def interrupt(step):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        reproarchive.bisect_compiler(archive, first_backend="inductor", on_step=interrupt)
    assert set(state_folders(os.getpid())) == before
    _bisector_at_rest()
    assert (private_inductor_cache / "bisect" / "bisect_status.txt").read_text() == "a bisection of the user's own\n"


def test_max_time_stops_before_a_replay_and_json_says_so(tmp_path):
    archive = tmp_path / "a.tar.zst"
    reproarchive.pack(torch.fx.symbolic_trace(torch.nn.ReLU()), [torch.ones(3)], archive, backend="inductor")
    result = invoke("bisect", "compiler", archive, "--max-time", "0.000001", "--json")
    assert result.exit_code == 3, result.output
    document = json.loads(result.stdout)
    _validate(document)
    assert document["status"] == "incomplete" and document["replays"] == 0
    assert not Path(str(archive) + ".bisect.json").exists()  # an unfinished search stores nothing
    _bisector_at_rest()


def test_a_missing_archive_or_backend_is_one_line_and_a_json_error(tmp_path):
    missing = invoke("bisect", "compiler", tmp_path / "missing.tar.zst", "--json")
    assert missing.exit_code == 4 and json.loads(missing.stdout)["error"]["code"] == "E_IO"
    archive = tmp_path / "a.tar.zst"
    reproarchive.pack(torch.fx.symbolic_trace(torch.nn.ReLU()), [torch.ones(3)], archive, backend="inductor")
    unknown = invoke("bisect", "compiler", archive, "--backend", "no_such_backend", "--json")
    assert unknown.exit_code == 125 and json.loads(unknown.stdout)["error"]["code"] == "E_BACKEND"
    bad_stage = invoke("bisect", "compiler", archive, "--from", "nowhere")
    assert bad_stage.exit_code == 2 and "one of PyTorch's bisection backends" in bad_stage.stderr


@pytest.mark.slow
def test_a_decomposition_bug_is_named_in_aot_eager_decomp_partition(tmp_path, monkeypatch, fresh_dynamo):
    """The bug lives in the torch environment (a sitecustomize patches a decomposition, as
    PyTorch's test_bad_decomp does), so every replay's process has it; the archive records the
    inductor backend. No inductor compile runs: the search ends at aot_eager_decomp_partition."""
    from support.torch_envs import SILU_BUG, planted_silu

    with planted_silu():
        archive = capture_failure(tmp_path / "silu.tar.zst", lambda x: torch.nn.functional.silu(x) * 2,
                                  [torch.randn(16)], "aot_eager_decomp_partition", accuracy=True)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SILU_BUG)
    monkeypatch.setenv("PYTHONPATH", str(site))
    result = reproarchive.bisect_compiler(archive, reproarchive.ReplaySettings(backend="inductor"))
    assert (result.status, result.backend, result.subsystem) == ("found", "aot_eager_decomp_partition",
                                                                  "decomposition")
    assert "aten.silu" in result.debug_info
    assert [s.verdict for s in result.steps][:3] == ["good", "good", "bad"]
    _bisector_at_rest()


def test_the_summary_carries_the_recorded_config_a_pasted_report_needs(tmp_path, fresh_dynamo):
    """A bug that a config flag makes (the archive records it): the summary says the flag as
    code to paste before compiling, or upstream the graph alone would not fail."""
    with torch._inductor.config.patch({"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"}):
        archive = capture_failure(tmp_path / "relu.tar.zst", bisect_bugs.negated_relu, [torch.randn(8)], "inductor")
    summary = tmp_path / "bug.md"
    # a bisection cut short still writes its summary (status incomplete, exit 3)
    result = invoke("bisect", "compiler", archive, "--summary", summary, "--from", "inductor", "--max-time", "0.01")
    assert result.exit_code in (0, 3), result.output
    text = summary.read_text()
    block = text[text.index("set it before compiling"):]
    code = block[block.index("```python") + len("```python"):block.index("```", block.index("```python") + 9)]
    assert "import torch._inductor.config" in code
    assert "torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY = 'compile_error'" in code
    compile(code, "summary", "exec")  # pastes as Python

    # which recorded setting the failure needs: as recorded it fails, with the flag at its default
    # it does not (the stage search is left out: --config-only)
    result = invoke("bisect", "compiler", archive, "--config-only", "--json", "--summary", summary)
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    _validate(document)
    flags = document["config_flags"]
    assert document["status"] == "found" and document["backend"] is None and flags["status"] == "needed", flags
    (needed,) = flags["needed"]
    assert needed == {"setting": "torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY",
                      "recorded": "'compile_error'", "default": "None"}
    steps = [(s["state"], s["verdict"]) for s in document["steps"]]
    assert steps[:2] == [("as recorded", "bad"), (f"{len(flags['searched'])} at their defaults", "good")], steps
    assert document["summary"] == ("the failure needs torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY = "
                                   "'compile_error' (default None)")
    assert "the recorded settings it needs" in summary.read_text()
    assert not Path(str(archive) + ".bisect.json").exists()  # a search of the settings alone stores nothing
