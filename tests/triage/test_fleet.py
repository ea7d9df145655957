"""``reproarchive triage``: tasks in fresh processes, a crash and a hang
reported as such, verdicts cached and resumed, ``--against`` another environment, the report.

Every task is a real replay or minify in a fresh process (a torch import each), so these tests
keep their fleets to a handful of archives; the 200-archive corpus is grouped in
test_grouping.py and triaged in benchmarks/triage_bench.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import reproarchive
from reproarchive.format.reader import ContainerReader
from support import fleet_corpus
from support.cli import invoke

TRUST = ["--trust-backend", fleet_corpus.NO_LOWERING]


def _cache_objects(folder: Path) -> list[Path]:
    return sorted((folder / ".reproarchive-triage" / "verdicts").rglob("replay.json"))


@pytest.fixture(scope="module")
def small_fleet(tmp_path_factory):
    """Six archives of three bugs (two machines each), triaged once (replay and minify), named
    as a user in their folder names them: relative (each task runs in a folder of its own)."""
    root = tmp_path_factory.mktemp("small-fleet")
    fleet_corpus.build(root, 6, bugs=("relu-runtime", "no-sigmoid", "no-tanh"))
    folder = root / "archives"
    here = os.getcwd()
    os.chdir(root)
    try:
        result = invoke("triage", "archives", "-j", "2", *TRUST, "--json", "--html", "fleet.html")
    finally:
        os.chdir(here)
    return folder, result


@pytest.mark.slow
def test_first_run_replays_and_minifies_one_per_group(small_fleet):
    folder, result = small_fleet
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["archives"] == 6 and len(report["groups"]) == 3
    for group in report["groups"]:
        assert group["count"] == 2
        assert group["verdicts"]["replay"]["status"] == "reproduced"
        minify = group["verdicts"]["minify"]
        assert minify["status"] == "minified" and minify["minified"]["ops"] == 1
        assert Path(minify["minified"]["location"]).is_file()
    # each representative replayed 4 times (stable: every replay reproduced), then minified
    assert report["tasks"] == {"run": 3 * 4 + 3, "cached": 0, "crashed": 0, "timed_out": 0, "error": 0}
    assert all(g["repeats"]["text"] == "stable: reproduced 4 of 4" for g in report["groups"])
    assert len(_cache_objects(folder)) == 3
    # progress went to stderr while it ran
    assert "[15/15]" in result.stderr


@pytest.mark.slow
def test_second_run_in_the_same_environment_replays_nothing(small_fleet):
    folder, _ = small_fleet
    start = time.perf_counter()
    result = invoke("triage", folder, "-j", "2", *TRUST, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["tasks"]["run"] == 0 and report["tasks"]["cached"] == 6
    assert all(set(g["cached"]) == {"replay", "minify"} for g in report["groups"])
    assert time.perf_counter() - start < 30  # no torch import per task: index reads only
    text = invoke("triage", folder, *TRUST).stdout
    assert "reproduced (cached)" in text and "1 ops" in text and "0 tasks run, 6 cached" in text


@pytest.mark.slow
def test_against_another_environment_says_fixed_still_fails_fails_differently(small_fleet, monkeypatch):
    """"Another torch": sigmoid now lowers, tanh's lowering is broken differently; relu's
    runtime bug is untouched."""
    folder, first = small_fleet
    before = json.loads(first.stdout)["environment"]["digest"]
    monkeypatch.setenv(fleet_corpus.FLEET_FIXED_ENV, "sigmoid")
    monkeypatch.setenv(fleet_corpus.FLEET_BROKEN_ENV, "tanh")
    # one replay a group: how many replays a verdict takes is test_recheck's question
    result = invoke("triage", folder, "--action", "replay", *TRUST, "--against", before[7:19], "--repeat", "1",
                    "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["environment"]["digest"] != before and report["against"]["digest"] == before
    by_target = {g["signature"]["target"]: g["against"]["status"] for g in report["groups"]}
    assert by_target == {"torch.relu": "still fails", "torch.sigmoid": "fixed", "torch.tanh": "fails differently"}
    # each group's life, read back from the cache: what its replay concluded in each environment
    # (one torch here, so in the order the verdicts were reached)
    seen = {g["signature"]["target"]: [s["status"] for s in g["seen"]] for g in report["groups"]}
    assert seen == {"torch.relu": ["reproduced", "reproduced"], "torch.sigmoid": ["reproduced", "passed"],
                    "torch.tanh": ["reproduced", "different failure"]}
    text = invoke("triage", folder, "--group-only", "--against", before[7:19]).stdout
    assert "fixed" in text and "fails differently" in text
    sigmoid = next(g for g in report["groups"] if g["signature"]["target"] == "torch.sigmoid")["seen"]
    first, then = (s["environment"][7:15] for s in sigmoid)
    assert f"{first}: reproduced, " in text and f"{then}: passed" in text
    unknown = invoke("triage", folder, "--group-only", "--against", "ffffffff", "--json")
    assert unknown.exit_code == 2 and json.loads(unknown.stdout)["error"]["message"].startswith("no environment")


@pytest.mark.slow
def test_another_thread_count_replays_only_what_a_thread_count_can_change(small_fleet, monkeypatch):
    """Ray's workers run with ``OMP_NUM_THREADS`` set to a task's CPUs, a laptop with its own:
    a compile error's verdict does not depend on it and is shared; a runtime failure's is not."""
    folder, first = small_fleet
    before = json.loads(first.stdout)["environment"]
    threads = int(before["variables"].get("OMP_NUM_THREADS", "1")) + 1
    monkeypatch.setenv("OMP_NUM_THREADS", str(threads))
    result = invoke("triage", folder, "--action", "replay", *TRUST, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["environment"]["digest"] != before["digest"]
    assert report["environment"]["variables"]["OMP_NUM_THREADS"] == str(threads)
    by_target = {g["signature"]["target"]: (g["signature"]["stage"], g["cached"], g["verdicts"]["replay"]["status"])
                 for g in report["groups"]}
    assert by_target == {"torch.relu": ("forward", [], "reproduced"),
                         "torch.sigmoid": ("compile", ["replay"], "reproduced"),
                         "torch.tanh": ("compile", ["replay"], "reproduced")}
    assert (report["tasks"]["run"], report["tasks"]["cached"]) == (4, 2)  # one group's 4 replays
    # the shared verdicts are stored once, under the environment without the thread counts
    digests = {g["verdicts"]["replay"]["environment"] for g in report["groups"] if g["signature"]["stage"] == "compile"}
    assert len(digests) == 1 and digests != {report["environment"]["digest"]}


@pytest.mark.slow
def test_report_page_in_a_real_browser(small_fleet):
    from support import browser

    folder, _ = small_fleet
    page_path = folder.parent / "fleet.html"
    html = page_path.read_text()
    assert "<script src" not in html and "http://" not in html.split("<script", 1)[0]
    if browser.unavailable() is not None:
        pytest.skip(str(browser.unavailable()))
    with browser.browser() as context:
        page, log = browser.open_page(context, page_path)
        page.wait_for_selector("body[data-ready='1']")
        assert page.locator("#groups-table tr").count() == 4  # a header and three groups
        # each group's replays measured: the mark under its verdict
        assert page.locator("#groups-table tr").nth(1).inner_text().count("stable: reproduced 4 of 4") == 1
        sections = page.locator("section[id^='group-']")
        assert sections.count() == 3
        first = sections.nth(0)
        assert "reproduced" in first.inner_text() and "def forward" in first.locator("pre.minified").inner_text()
        assert first.locator("table.members tr").count() == 3
        page.click("#groups-table a >> nth=1")
        assert log.errors == [] and all(r.startswith(("file:", "data:")) for r in log.requests)


@pytest.mark.slow
def test_a_segfault_and_a_hang_cost_one_task_each(tmp_path):
    """With two local workers: one task dies of SIGSEGV, one runs past --max-time; both are
    reported as such and the other tasks finish with their verdicts."""
    folder = tmp_path / "fleet"
    fleet_corpus.build(tmp_path, 2, bugs=("relu-compile", "relu-runtime"))
    (tmp_path / "archives").rename(folder)
    fleet_corpus.pack_with_backend(folder / "segfault.tar.zst", fleet_corpus.SEGFAULTING)
    fleet_corpus.pack_with_backend(folder / "hang.tar.zst", fleet_corpus.HANGING)
    start = time.perf_counter()
    result = invoke("triage", folder, "-j", "2", "--action", "replay", "--max-time", "15",
                    "--trust-backend", fleet_corpus.SEGFAULTING, "--trust-backend", fleet_corpus.HANGING, "--json")
    elapsed = time.perf_counter() - start
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    verdicts = {g["representative"]["name"]: g["verdicts"]["replay"] for g in report["groups"]}
    assert verdicts["segfault.tar.zst"]["status"] == "crashed" and verdicts["segfault.tar.zst"]["signal"] == "SIGSEGV"
    assert verdicts["hang.tar.zst"]["status"] == "timed out"
    others = [v["status"] for name, v in verdicts.items() if name not in ("segfault.tar.zst", "hang.tar.zst")]
    assert others == ["reproduced", "reproduced"]
    assert report["tasks"]["crashed"] == 1 and report["tasks"]["timed_out"] == 1
    assert elapsed < 120, elapsed
    # the hang is not cached (it depends on --max-time); the crash is: it is this environment's verdict
    text = invoke("triage", folder, "--group-only").stdout
    assert "crashed SIGSEGV" in text


@pytest.mark.slow
def test_a_run_killed_midway_is_finished_by_the_next(tmp_path):
    fleet_corpus.build(tmp_path, 3, bugs=("relu-compile", "relu-runtime", "relu-accuracy"))
    folder = tmp_path / "archives"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(fleet_corpus.__file__).parents[1]),
                                                       os.environ.get("PYTHONPATH", "")]))
    cli = [sys.executable, "-c", "from reproarchive.cli import main; main()"]
    proc = subprocess.Popen([*cli, "triage", str(folder), "-j", "1", "--action", "replay"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not _cache_objects(folder) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)  # the run and the task it was running
    finally:
        proc.wait()
    done_before = len(_cache_objects(folder))
    assert 1 <= done_before < 3
    result = invoke("triage", folder, "-j", "1", "--action", "replay", "--json")
    report = json.loads(result.stdout)
    assert result.exit_code == 0, result.output
    # a group's verdict is stored once its 4 replays are back: the killed one's are done again
    assert report["tasks"]["cached"] == done_before and report["tasks"]["run"] == 4 * (3 - done_before)
    assert len(_cache_objects(folder)) == 3


def test_group_only_reads_indexes_and_a_bad_source_is_one_line(tmp_path):
    fleet_corpus.build(tmp_path, 5)
    folder = tmp_path / "archives"
    (folder / "broken.tar.zst").write_bytes(b"not an archive")
    result = invoke("triage", folder, "--group-only", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["archives"] == 5 and len(report["groups"]) == 5 and report["tasks"]["run"] == 0
    assert [u["location"].endswith("broken.tar.zst") for u in report["unreadable"]] == [True]
    # a list of archives works as a source too
    listing = tmp_path / "fleet.txt"
    listing.write_text("# nightly failures\n" + "\n".join(f"archives/{p.name}" for p in sorted(folder.glob("0*"))))
    assert json.loads(invoke("triage", listing, "--group-only", "--json").stdout)["archives"] == 5
    missing = invoke("triage", tmp_path / "nowhere", "--json")
    assert missing.exit_code == 4 and "error" in json.loads(missing.stdout)
    one = invoke("triage", sorted(folder.glob("0*"))[0], "--json")
    assert one.exit_code == 2 and "one archive" in json.loads(one.stdout)["error"]["message"]


def test_verdict_cache_round_trip_and_damage(tmp_path):
    from reproarchive.store.location import open_location
    from reproarchive.triage.verdicts import VERDICT_FORMAT, Environment, Verdict, VerdictCache

    cache = VerdictCache(open_location(str(tmp_path / "cache")))
    env = Environment(torch="2.13.0", torch_git="abc", python="3.11", device="cpu", settings={}, variables={})
    digest = "sha256:" + "ab" * 32
    verdict = Verdict(format=VERDICT_FORMAT, action="replay", archive=digest, environment=env.digest,
                      status="reproduced", exit_code=1)
    assert cache.get(env.digest, digest, "replay") is None
    cache.record_environment(env)
    cache.put(verdict)
    assert cache.get(env.digest, digest, "replay") == verdict
    assert [e.digest for e in cache.environments()] == [env.digest]
    stored = next((tmp_path / "cache" / "verdicts").rglob("replay.json"))
    assert json.loads(stored.read_text())["status"] == "reproduced"
    stored.write_text('{"format": "9.0", "status": "passed"}')  # a newer major: never trusted
    assert cache.get(env.digest, digest, "replay") is None
    stored.write_text("{not json")
    assert cache.get(env.digest, digest, "replay") is None


def test_public_surface():
    assert reproarchive.triage_fleet and reproarchive.LocalExecutor and reproarchive.Verdict


def test_environment_digest_ignores_what_torch_sets_itself(monkeypatch):
    """Torch exports its default cache folder once it compiled; a run after that is still in the
    same environment. A cache folder the user chose is part of it."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from reproarchive.replay.settings import ReplaySettings
    from reproarchive.triage.verdicts import current_environment

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    before = current_environment(ReplaySettings()).digest
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    assert current_environment(ReplaySettings()).digest == before
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/scratch/inductor")
    assert current_environment(ReplaySettings()).digest != before
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    assert current_environment(ReplaySettings(device="cpu")).digest != before  # another replay setting


@pytest.mark.slow
def test_a_store_source_keeps_verdicts_and_minified_archives_in_the_store(tmp_path):
    """From a team store: indexes read without pulling a blob, the minified archive pushed back
    as a ref, verdicts under verdicts/, and a second run (a teammate's) does nothing."""
    members = fleet_corpus.build(tmp_path, 2, bugs=("relu-compile",))
    store = tmp_path / "store"
    reproarchive.push([m.path for m in members], str(store))
    result = invoke("triage", store, "-j", "2", "--json")
    assert result.exit_code == 0, result.output
    (group,) = json.loads(result.stdout)["groups"]
    assert group["count"] == 2 and group["verdicts"]["replay"]["status"] == "reproduced"
    location = group["verdicts"]["minify"]["minified"]["location"]
    assert location.startswith(str(store)) and (store / "refs" / location.rsplit("/", 1)[1]).is_file()
    # the culprit is read from the minified archive in the store (its inline bytes)
    relu_error = "torch._dynamo.backends.debugging.ReluCompileError"
    culprit = group["culprit"]
    assert {k: culprit[k] for k in ("stage", "exception_type", "ops")} == {
        "stage": "compile", "exception_type": relu_error, "ops": ["relu"]}
    # the model lines it names are never torch's own frames (FX's tracer, this corpus's, records its own)
    assert not [w for w in culprit["where"] if w.startswith("<site-packages>/torch/")], culprit["where"]
    assert len(list((store / "verdicts").rglob("*.json"))) == 3  # the environment and two verdicts
    again = json.loads(invoke("triage", store, "--json").stdout)
    assert again["archives"] == 2 and again["tasks"]["run"] == 0 and again["tasks"]["cached"] == 2


@pytest.mark.slow
def test_the_bisect_action_names_each_groups_compiler_stage(tmp_path):
    """``--action bisect``: once the replay reproduced, ``bisect compiler`` runs on the group's
    representative; its verdict names the stage, is cached, and the table shows it. The
    archives' compiler is PyTorch's relu_compile_error_TESTING_ONLY backend, which replays at
    the bisector's last stage: the failure is in it (it passes with every backend before), not
    in Inductor."""
    fleet_corpus.build(tmp_path, 2, bugs=("relu-compile",))
    folder = tmp_path / "archives"
    result = invoke("triage", folder, "--action", "replay", "--action", "bisect", "--repeat", "1", "--json")
    assert result.exit_code == 0, result.output
    (group,) = json.loads(result.stdout)["groups"]
    bisect = group["verdicts"]["bisect"]
    relu = "relu_compile_error_TESTING_ONLY"
    assert (bisect["status"], bisect["kind"]) == ("found", relu), bisect
    assert bisect["message"].startswith(f"the failure is in backend {relu}")
    again = invoke("triage", folder, "--action", "replay", "--action", "bisect", "--repeat", "1")
    assert "0 tasks run, 2 cached" in again.stdout and f"culprit: the failure is in backend {relu}" in again.stdout


def test_a_group_is_represented_by_a_member_that_needs_no_stand_in(tmp_path, fresh_dynamo):
    """Two captures of one bug: the smaller graph calls the program's own custom op, which a
    replay elsewhere stands in for from its recorded calls (and can only call inconclusive where
    a call was not recorded, as for a first call kept from the spool); the other calls nothing
    from outside torch. The group was represented by the smaller one and so judged through a
    stand-in; it is represented by the member that needs none."""

    @torch.library.custom_op("ratriage::twice", mutates_args=())
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    twice.register_fake(lambda x: torch.empty_like(x))
    backend = reproarchive.capture("relu_runtime_error_TESTING_ONLY", path=tmp_path / "fleet")
    for name, fn in (("with-op", lambda x: torch.relu(twice(x))), ("plain", lambda x: torch.relu(x * 2) + 1)):
        with pytest.raises(AssertionError, match="ReluRuntimeError"):
            torch.compile(fn, backend=backend)(torch.ones(4))
        (new,) = [p for p in (tmp_path / "fleet").glob("repro-*.tar.zst")]
        new.rename(tmp_path / "fleet" / f"{name}.tar.zst")
    with ContainerReader(tmp_path / "fleet" / "with-op.tar.zst") as reader:
        assert reader.index.graph.op_count() == 2 and reader.index.custom_ops  # the smaller graph
    result = invoke("triage", tmp_path / "fleet", "--by", "failure", "--group-only", "--json")
    (group,) = json.loads(result.stdout)["groups"]
    assert group["count"] == 2 and group["representative"]["name"] == "plain.tar.zst", group
    assert group["representative"]["outside"] == 0


def test_a_real_job_archive_is_triaged_by_the_rank_that_failed(tmp_path, tmp_path_factory):
    """A fleet holding a real 2-rank torchrun job's archive (the C++ relu bug on rank 1 alone):
    its replay launches the ranks, and the verdict, kind and signature are rank 1's (a job's
    outcome was read as one graph's: the task failed with an AttributeError)."""
    from support.real_jobs import inductor_job

    folder = tmp_path / "fleet"
    folder.mkdir()
    (folder / "job.tar.zst").write_bytes(inductor_job(tmp_path_factory).read_bytes())
    result = invoke("triage", folder, "--action", "replay", "--repeat", "1", "--json")
    data = json.loads(result.stdout)
    (group,) = data["groups"]
    verdict = group["verdicts"]["replay"]
    assert (verdict["status"], verdict["exit_code"], verdict["kind"]) == ("reproduced", 1, "compile error"), verdict
    assert verdict["signature"].startswith("compile|torch._inductor.exc.CppCompileError|"), verdict
    assert result.exit_code == 0, result.output
