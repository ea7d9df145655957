"""``reproarchive run`` of a multi-rank job archive: the ranks launched by torch.distributed's
launcher (gloo), one verdict naming the rank, ``--rank`` against a fake process group, a hang
within the timeout, and a job over two launcher invocations on 127.0.0.1."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

import reproarchive
from support.cli import invoke
from support.job_archives import dtensor_input, rank_one_fails, rank_one_skips, spmd_accuracy
from support.real_jobs import inductor_job as real_inductor_job


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
    folder = tmp_path_factory.mktemp("jobs")
    return {"fails": rank_one_fails(folder), "skips": rank_one_skips(folder), "accuracy": spmd_accuracy(folder)}


@pytest.mark.slow
def test_run_says_reproduced_on_rank_one(archives):
    result = invoke("run", archives["fails"], "--json")
    assert result.exit_code == 1, result.output
    job = json.loads(result.stdout)
    assert (job["status"], job["rank"], job["recorded_rank"], job["world_size"]) == ("reproduced", 1, 1, 2)
    ranks = {r["rank"]: r for r in job["ranks"]}
    assert ranks[1]["outcome"]["observed"]["exception_type"].endswith("ReluCompileError")
    assert ranks[0]["status"] in ("stopped", "passed")  # ended by the launcher when rank 1 failed
    assert job["launcher"] == ["--standalone", "--nproc-per-node", "2"]


@pytest.mark.slow
def test_ranks_on_the_cpu_are_forked_warm_and_judged_as_fresh_ones(archives, tmp_path, monkeypatch):
    """The launcher forks CPU ranks from its own imports (``rank_server``); the verdict is the
    one ranks started fresh give."""
    from reproarchive.replay import launch
    from reproarchive.replay.run_job import run_job

    def verdict(job):
        one = next(r for r in job.ranks if r.rank == 1)
        return job.status, job.exit_code, job.rank, one.status, one.outcome.observed.exception_type

    warm = run_job(archives["fails"], reproarchive.ReplaySettings(), keep=tmp_path / "warm")
    assert json.loads((tmp_path / "warm" / "launch-0.json").read_text())["warm"] is True
    monkeypatch.setattr(launch, "on_cpu_only", lambda targets: False)
    fresh = run_job(archives["fails"], reproarchive.ReplaySettings(), keep=tmp_path / "fresh")
    assert json.loads((tmp_path / "fresh" / "launch-0.json").read_text())["warm"] is False
    assert verdict(warm) == verdict(fresh) and verdict(warm)[:3] == ("reproduced", 1, 1)


@pytest.mark.slow
def test_one_rank_alone_against_a_fake_process_group(archives, tmp_path):
    report = tmp_path / "bug.md"
    result = invoke("run", archives["fails"], "--rank", "1", "--summary", report)
    assert result.exit_code == 1, result.output
    assert result.stdout.startswith("REPRODUCED ON RANK 1 (exit 1)")
    assert "fake process group" in result.stdout
    # the report of a job's replay: its verdict as printed, and a command that replays the same rank
    text = report.read_text()
    assert result.stdout.strip() in text
    command = text.split("- replay it: `")[1].split("`")[0]
    assert command == f"reproarchive run {archives['fails']} --rank 1"
    assert invoke(*command.split()[1:], "--quiet").exit_code == 1
    bad = invoke("run", archives["fails"], "--rank", "5")
    assert bad.exit_code == 2 and "not a rank of this job" in bad.output
    # a compile reads no collective's value: its pass alone is evidence (the bug-free backend)
    fixed = json.loads(invoke("run", archives["fails"], "--rank", "1", "--backend", "eager", "--json").stdout)
    assert (fixed["status"], fixed["exit_code"]) == ("passed", 0), fixed
    # a failure in the numbers after the collectives: a pass on made-up values is no evidence
    unsure = invoke("run", archives["accuracy"], "--rank", "1", "--backend", "eager", "--json")
    report = json.loads(unsure.stdout)
    assert (report["status"], unsure.exit_code) == ("inconclusive", 125), report
    (why,) = report["ranks"][0]["outcome"]["unfaithful"]
    assert "fake process group" in why


@pytest.mark.slow
def test_a_dtensor_input_is_rebuilt_with_its_mesh_and_placements(tmp_path):
    # DTensor refuses to add a plain tensor: only a DTensor rebuilt from the record fails so
    result = invoke("run", dtensor_input(tmp_path), "--rank", "0", "--json")
    assert result.exit_code == 1, result.output
    observed = json.loads(result.stdout)["ranks"][0]["outcome"]["observed"]
    assert observed["message"].startswith("aten.add.Tensor got mixed")


@pytest.mark.slow
def test_a_hang_is_reproduced_within_the_timeout_and_the_diverging_rank_named(archives, tmp_path):
    result = invoke("run", archives["skips"], "--timeout", "5")
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "REPRODUCED ON RANK 0 (exit 1): reproduced on rank 0 of 2"
    assert any(ln.startswith("  rank 0") and "timed out in a collective" in ln for ln in lines)
    assert "diverged  rank 1 issued no collective #1 on group '0', where rank 0 issued all_reduce" in result.stdout
    # the exported script judges rank 0's timed-out collective as run does: the recorded hang
    assert invoke("export", archives["skips"], "-o", tmp_path / "script").exit_code == 0
    done = subprocess.run([sys.executable, "repro.py", "--timeout", "5"], cwd=tmp_path / "script",
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 1 and "job: reproduced on rank 0 (exit 1)" in done.stderr, done.stderr[-3000:]
    assert "reproduced: the recorded failure (timeout|" in done.stderr


def _reproarchive() -> list[str]:
    """The command line in a process of its own, under this interpreter (an environment of the
    torch matrix shares this one's packages but has no ``reproarchive`` script of its own)."""
    return [sys.executable, "-c", "from reproarchive.cli import main; main()"]


@pytest.mark.slow
def test_every_rank_in_one_process_judges_accuracy_with_real_collective_values(archives):
    # in this process: --single-process starts a fake process group and ends it
    result = invoke("run", archives["accuracy"], "--single-process", "--json")
    assert result.exit_code == 1, result.output
    job = json.loads(result.stdout)
    assert (job["status"], job["rank"], job["launcher"]) == ("reproduced", 1, [])
    assert {r["rank"]: r["outcome"]["observed"]["stage"] for r in job["ranks"]} == {0: "accuracy", 1: "accuracy"}
    refused = invoke("run", archives["fails"], "--single-process")  # ranks 0 and 1 compiled different graphs
    assert refused.exit_code == 2 and "runs one SPMD graph for every rank" in refused.output


@pytest.mark.slow
def test_the_exported_script_of_an_accuracy_job_judges_each_rank_as_run_does(archives, tmp_path):
    """Before, the job's script never compared with eager: it passed (0) where `run` reproduces
    rank 1's accuracy failure (1). Now each rank recorded in accuracy mode compares, and the job's
    verdict is run's: rank 1 reproduced, rank 0 (no failure recorded) a different failure."""
    assert invoke("export", archives["accuracy"], "-o", tmp_path / "script").exit_code == 0
    done = subprocess.run([sys.executable, "repro.py", "--timeout", "30"], cwd=tmp_path / "script",
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 1 and "job: reproduced on rank 1 (exit 1)" in done.stderr, done.stderr[-3000:]
    assert "rank 1: accuracy failure" in done.stderr and "reproduced: the recorded failure (accuracy|" in done.stderr


@pytest.mark.slow
def test_a_rank_that_passes_on_generated_inputs_is_no_evidence_however_the_job_is_replayed(tmp_path):
    """Rank 1's input was recorded without its data: a pass of its accuracy failure on values
    generated here says nothing of the failing run's, launched or in one process."""
    archive = spmd_accuracy(tmp_path, absent_on_rank_1=True)
    for how in ((), ("--single-process",)):
        result = invoke("run", archive, "--backend", "eager", *how, "--json")
        job = json.loads(result.stdout)
        assert (result.exit_code, job["status"]) == (125, "inconclusive"), result.output
        ranks = {r["rank"]: r["outcome"] for r in job["ranks"]}
        assert ranks[0]["status"] == "passed" and ranks[1]["status"] == "inconclusive", ranks
        assert any("held generated values" in u and "x" in u for u in ranks[1]["unfaithful"]), ranks[1]
    # the verdict for people says why under the rank (it said "rank 1   inconclusive" and no more)
    text = invoke("run", archive, "--backend", "eager", "--single-process").output
    said = text.split("  rank 1   inconclusive")[1].splitlines()[1]
    assert said.startswith("            not as recorded: ") and "held generated values" in said, text
    # the exported script judges each rank by the same rule, and the job as run does: 125 (under
    # torchrun, whose own exit is 1 for any rank's, only the rank's exit says so)
    exported = tmp_path / "export"
    assert invoke("export", archive, "-o", exported).exit_code == 0
    done = subprocess.run([sys.executable, "repro.py", "--backend", "eager", "--timeout", "30"], cwd=exported,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 125 and "input(s) held generated values" in done.stderr, done.stderr[-3000:]
    assert "job: inconclusive on rank 1 (exit 125)" in done.stderr
    assert "rank 0: no failure" in done.stdout and "rank 1: no failure" in done.stdout, done.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_launcher_invocations_on_one_host_replay_one_job(archives):
    endpoint = f"127.0.0.1:{_free_port()}"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([*_reproarchive(), "run", str(archives["fails"]), "--json",
                               "--timeout", "20", "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1",
                               "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "mr-test"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for node in (0, 1)]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        reports.append((proc.returncode, json.loads(out)))
    by_rank = {job["ranks"][0]["rank"]: (code, job) for code, job in reports}
    assert sorted(by_rank) == [0, 1], reports  # each launch ran one of the two ranks
    code, job = by_rank[1]
    assert (code, job["status"], job["rank"]) == (1, "reproduced", 1)
    code, job = by_rank[0]
    assert job["ranks"][0]["status"] in ("passed", "stopped")
    assert any("ran in another launch" in w for w in job["warnings"])


def _part_of(archive, rank: int, path):
    """Rank ``rank``'s part of the job at ``archive``, as that rank writes it while the job runs."""
    import dataclasses

    import reproarchive
    from reproarchive.archive.job_archive import rank_part_job
    from reproarchive.archive.packing import pack
    from reproarchive.format.reader import ContainerReader

    with ContainerReader(archive) as reader:
        index = reader.index
    record = next(r for r in index.job.ranks if r.rank == rank)
    loaded = reproarchive.load_job(archive).rank(rank)
    running = dataclasses.replace(record, outcome=dataclasses.replace(record.outcome, status="running"))
    part = rank_part_job(running, world_size=index.job.world_size, backend=index.job.backend, groups=index.job.groups)
    pack(loaded.gm, list(loaded.args), path, records=index.records, job=part)
    return path


@pytest.mark.slow
def test_a_part_written_while_the_job_ran_is_refused_as_a_job_and_replays_as_its_rank(archives, tmp_path):
    part = _part_of(archives["fails"], 1, tmp_path / "rank-1.tar.zst")
    refused = invoke("run", part)
    assert refused.exit_code == 2, refused.output
    [line] = refused.output.strip().splitlines()
    assert "holds rank 1 of a 2-rank job" in line and "reproarchive pack FOLDER" in line and "--rank 1" in line
    assert invoke("run", part, "--rank", "1").exit_code == 1
    other = invoke("run", part, "--rank", "0")
    assert other.exit_code == 2 and "records no rank 0" in other.output


@pytest.mark.slow
def test_a_launch_that_starts_no_rank_never_passes(archives):
    result = invoke("run", archives["fails"], "--master-port", "not-a-port", "--json")
    assert result.exit_code == 125, result.output
    assert json.loads(result.stdout)["error"]["code"] == "E_LAUNCH"


@pytest.fixture(scope="module")
def inductor_job(tmp_path_factory):
    """The real 2-rank inductor job (``support.real_jobs.inductor_job``), built once for the run."""
    return real_inductor_job(tmp_path_factory)


@pytest.mark.slow
def test_a_real_inductor_job_replays_each_rank_under_its_own_config(inductor_job, tmp_path):
    """Rank 1 alone set the bug injector (it breaks the relu in a cond's true branch): its records
    say so, rank 0's do not, and every way of replaying the job replays rank 0 without it (it
    passes; it was not a different failure), with its own generator states (the graph draws
    dropout) and symbolic shapes (dynamic=True), so the pass is a faithful one.
    The program's custom op is recorded with both ranks' calls, and every replay (whose ranks
    do not have the op) stands in for it on each rank with that rank's call."""
    import reproarchive

    job = reproarchive.load_job(inductor_job)
    [op] = job.index.custom_ops
    assert (op.name, len(op.calls)) == ("jobtest::shifted.default", 2)
    assert all(r.stand_ins == ["jobtest::shifted.default"] for r in job.ranks) or \
        all(r.stand_ins == [] for r in job.ranks)  # the op is registered here when a test imported it
    injector = "cpp.inject_relu_bug_TESTING_ONLY"
    assert job.rank(1).records.config.changed["torch._inductor.config"][injector] == "compile_error"
    assert injector not in job.rank(0).records.config.changed.get("torch._inductor.config", {})
    # inspect says so: rank 0 keeps records of its own, which differ from rank 1's (the primary's) there
    rows = {row.rank: row for row in reproarchive.inspect(inductor_job).job.ranks}
    assert f"torch._inductor.config.{injector}" in rows[0].own_records and rows[1].own_records == ()
    launched = json.loads(invoke("run", inductor_job, "--json").stdout)
    assert (launched["status"], launched["rank"], launched["exit_code"]) == ("reproduced", 1, 1)
    # rank 0 recorded losing its peer; replayed, it passes, loses its peer again or is stopped
    assert {r["rank"]: r["status"] for r in launched["ranks"]}[0] in ("passed", "reproduced", "stopped")
    for rank, status in ((1, "reproduced"), (0, "passed")):
        alone = json.loads(invoke("run", inductor_job, "--rank", str(rank), "--json").stdout)
        assert (alone["status"], alone["exit_code"]) == (status, 1 if status == "reproduced" else 0), alone
        # a faithful pass: the rank's own generator states restored and its symbolic policy compiled
        [replayed] = alone["ranks"]
        assert "the recorded RNG state (cpu) is restored" in replayed["outcome"]["randomness"], replayed
        assert replayed["outcome"]["shapes"]["policy"] == "recorded" and replayed["outcome"]["shapes"]["symbolic"]
        # each rank keeps the guards Dynamo made apart from its compile's; inductor is the recorded backend.
        # The size is still a symbol when the compile ended: reading the collectives' shapes for the
        # schedule took its hint, where int() had guarded on it and specialized the program's compile
        policy = job.rank(rank).records.shapes
        assert policy.entry is not None and any("L['x'].size()[0] <=" in g for g in policy.guards), policy
        assert replayed["outcome"]["shapes"]["guards_compared_at"] == "compile end"
    # rank 1 without inductor passes, but its custom op was stood in (the rank's process lacks it): no evidence
    eager = json.loads(invoke("run", inductor_job, "--rank", "1", "--backend", "eager", "--json").stdout)
    [replayed] = eager["ranks"]
    assert (eager["status"], eager["exit_code"]) == ("inconclusive", 125), eager
    assert any("jobtest::shifted.default was stood in" in u for u in replayed["outcome"]["unfaithful"]), replayed
    # judged on the guards Dynamo made, not on those inductor's compile added
    shapes = replayed["outcome"]["shapes"]
    assert (shapes["guards_compared_at"], shapes["guards_match"]) == ("backend entry", True), shapes
    one_process = json.loads(invoke("run", inductor_job, "--single-process", "--json").stdout)
    assert (one_process["status"], one_process["rank"], one_process["recorded_rank"]) == ("reproduced", 1, 1)
    assert {r["rank"]: r["status"] for r in one_process["ranks"]} == {0: "passed", 1: "reproduced"}
    exported = tmp_path / "export"
    assert invoke("export", inductor_job, "-o", exported).exit_code == 0
    script = (exported / "repro.py").read_text()
    body = script[script.index("def apply_config(rank):"):script.index("DEVICE = None")]
    blocks = {int(b[0]): b for b in body.split("if rank == ")[1:]}  # each rank's settings
    assert injector in blocks[1] and injector not in blocks.get(0, "")
    assert "_stand_in('jobtest::shifted.default'" in script  # the script's ranks lack the op too
    assert "_install(root, 'cond_true_0'" in script  # each rank's cond branches, rebuilt as submodules
    # each rank sets its own generator states before its call, as the single-graph script does
    import ast
    import re

    states = ast.literal_eval(re.search(r"^RANK_RNG_STATES = (.*)$", script, re.MULTILINE).group(1))
    for r in job.ranks:
        assert (exported / states[r.rank]["cpu"]).read_bytes() == r.rng_states["cpu"].numpy().tobytes()
    # and its own shape policy, planned as `run` plans it (the compile fixed the dynamic=True
    # size: static; the script compiled it as a fresh symbol, which the custom op's stand-in,
    # recorded at size 4, refused)
    from reproarchive.codec.shapes import dimension_plan

    shapes = ast.literal_eval(re.search(r"^RANK_SHAPES = (.*)$", script, re.MULTILINE).group(1))
    for r in job.ranks:
        assert shapes[r.rank][0] == dimension_plan(r.records.shapes)
    # started with python, the script launches both ranks and gives the job's verdict by run's rule
    done = subprocess.run([sys.executable, "repro.py", "--timeout", "30"], cwd=exported, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 1 and "[rank1]" in done.stderr and "CppCompileError" in done.stderr, done.stderr[-3000:]
    assert "job: reproduced on rank 1 (exit 1)" in done.stderr, done.stderr[-3000:]
    # rank 0 compiles and runs without the bug, then loses its peer, as recorded
    assert not [line for line in done.stderr.splitlines() if line.startswith("[rank0]") and "Compile" in line]
    assert "shape guards differ" not in done.stderr and "no call with inputs" not in done.stderr


@pytest.mark.slow
def test_the_real_inductor_job_s_torch_trace_logs_pack_into_a_job_that_reproduces_on_rank_1(inductor_job, tmp_path):
    """The same job's TORCH_TRACE folder (a log per rank; the graph holds a cond and a custom op
    next to its collectives, so the Dynamo graph is packed) makes one job archive whose `run`
    reproduces rank 1's failure. Before, the pack stopped at the program's custom op ("not
    supported from a log", a wrong hint); then the pack's replay of each rank's graph alone,
    which issues an all_reduce, recorded nothing true; and the log's unqualified CppCompileError
    was a DIFFERENT FAILURE from the replay's."""
    import reproarchive

    trace = inductor_job.parent.parent / "trace"
    assert len(list(trace.glob("dedicated_log_torch_trace_rank_*.log"))) == 2
    packed = invoke("pack", trace, "-o", tmp_path, "--json")
    assert packed.exit_code == 0, packed.output
    report = json.loads(packed.stdout)
    for written in report["archives"]:  # each rank's graph calls the op; its graph alone cannot replay
        # the Dynamo graph is packed, whose log gives the op's output shapes for its stand-in: torch 2.13
        # prints a cond's subgraphs as invalid Python in fx_graph_runnable; 2.15 prints them validly, but
        # a stand-in made from the runnable would answer no call (before, every rank's replay missed it: 125)
        assert any("the Dynamo graph is packed instead" in w for w in written["warnings"]), written["warnings"]
        assert any("jobtest::shifted.default, not registered here: stood in" in w for w in written["warnings"])
        assert written["replay"]["performed"] is False and "replays only as its job" in written["replay"]["reason"]
    # read, not loaded: loading installs a stand-in, and this process has one from the capture's archive
    assert [op.name for op in reproarchive.inspect(report["job"]["archive"]).custom_ops] == ["jobtest::shifted.default"]
    launched = json.loads(invoke("run", report["job"]["archive"], "--json").stdout)
    assert (launched["status"], launched["rank"], launched["exit_code"]) == ("reproduced", 1, 1), launched
    [one] = [r for r in launched["ranks"] if r["rank"] == 1]
    assert one["outcome"]["observed"]["exception_type"].endswith("CppCompileError")
    # its exported script judges by run's rule too: the log's unqualified type is the recorded failure
    # (a long timeout: rank 0 waits in its all_reduce while rank 1 compiles, slow on a loaded machine).
    # Exported in a process of its own, as a user runs it: this one may hold a stand-in for the op
    # made from another archive's schema (the capture's), which a load here refuses to replace
    exported = subprocess.run([*_reproarchive(), "export", report["job"]["archive"], "-o", tmp_path / "script"],
                              capture_output=True, text=True, timeout=300)
    assert exported.returncode == 0, exported.stderr[-2000:]
    done = subprocess.run([sys.executable, "repro.py", "--timeout", "120"], cwd=tmp_path / "script",
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 1 and "job: reproduced on rank 1 (exit 1)" in done.stderr, done.stderr[-3000:]
    assert "reproduced: the recorded failure (compile|torch._inductor.exc.CppCompileError|" in done.stderr


@pytest.mark.slow
def test_a_real_inductor_job_with_a_custom_op_minifies_to_the_culprit_on_every_rank(inductor_job, tmp_path):
    """The candidates keep the job's custom-op calls (the ranks stand in for the op) and each
    rank's own records (config, generator states, shape policy): the minifier starts from a job
    that reproduces, and ends at the relu the injected bug breaks inside a cond's branch, cut the
    same way on both ranks."""
    import reproarchive

    result = invoke("run", "--minify", inductor_job, "-o", tmp_path / "min.tar.zst", "--timeout", "30", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["status"] == "minified" and report["stats"]["final_ops"] == 1, report
    assert "torch.relu" in report["code"] and "shifted" not in report["code"]
    job = reproarchive.load_job(tmp_path / "min.tar.zst")
    injector = "cpp.inject_relu_bug_TESTING_ONLY"
    assert job.rank(1).records.config.changed["torch._inductor.config"][injector] == "compile_error"
    assert injector not in job.rank(0).records.config.changed.get("torch._inductor.config", {})
    assert job.failing_rank == 1 and job.records.parent == report["parent"]
    assert all(r.records.rng is not None and r.records.rng.generators for r in job.ranks)  # each rank's kept
    # the relu sits in a cond's branch, which the search inlined on rank 1: rank 0's graph was inlined
    # alike and cut the same way (before, its cut was empty and kept no input)
    assert all("torch.relu" in r.gm.code and "cond" not in r.gm.code and len(r.args) == 1 for r in job.ranks)
    # that input, cut from inside the branch, keeps the symbol its size had (it was static)
    for r in job.ranks:
        (cut,) = r.records.shapes.inputs
        assert [(d.kind, d.origin, d.source) for d in cut.dims] == [("backed", "dynamic=True", None)], cut
    # the exported script: rank 0 passes and waits for its peers, which rank 1 leaves by failing;
    # rank 0's verdict stands (before, it was counted as failed: "job: failed on rank 1, 0")
    assert invoke("export", tmp_path / "min.tar.zst", "-o", tmp_path / "script").exit_code == 0
    done = subprocess.run([sys.executable, "repro.py", "--timeout", "30"], cwd=tmp_path / "script",
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 1 and "job: reproduced on rank 1 (exit 1)" in done.stderr, done.stderr[-3000:]
    assert "rank 0: no failure" in done.stdout


_SHIFTED_OP = '''import torch


@torch.library.custom_op("jobtest::shifted", mutates_args=())
def shifted(x: torch.Tensor) -> torch.Tensor:
    return x - 0.5


shifted.register_fake(lambda x: torch.empty_like(x))
'''


@pytest.mark.slow
def test_a_job_s_ranks_run_the_op_the_user_brings_with_import(inductor_job, tmp_path):
    """``--import`` reaches every rank: each rank's process prepares its replay as ``run`` does
    one graph, so the module the user names defines the job's custom op there and nothing is
    stood in (before, the ranks stood in for it and the verdict asked for the very --import
    given). The commands run in a process of their own, so this test process never registers
    the op the other tests see stood in."""
    (tmp_path / "shiftedop.py").write_text(_SHIFTED_OP)

    def cli(*args):
        done = subprocess.run([sys.executable, "-c", "from reproarchive.cli import main; main()", *map(str, args)],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        return done.returncode, done.stdout, done.stderr

    # rank 1 under eager: the recorded compile failure is inductor's, and the real op ran, so a pass
    code, out, err = cli("run", inductor_job, "--rank", "1", "--backend", "eager", "--import", "shiftedop", "--json")
    [rank] = json.loads(out)["ranks"]
    assert (code, rank["status"], rank["outcome"]["unfaithful"]) == (0, "passed", []), (out, err)
    # every rank launched: none stands in, and the recorded failure is reproduced with the real op
    code, out, err = cli("run", inductor_job, "--import", "shiftedop", "--json")
    job = json.loads(out)
    assert (code, job["status"], job["rank"]) == (1, "reproduced", 1), (out, err)
    assert not any("stood in" in u for r in job["ranks"] if r["outcome"] for u in r["outcome"]["unfaithful"]), job
    # the exported script brings the module before standing in for what is still missing
    code, out, err = cli("export", inductor_job, "-o", "script", "--import", "shiftedop")
    script = (tmp_path / "script" / "repro.py").read_text()
    assert code == 0 and "importlib.import_module('shiftedop')" in script, err
    assert script.index("import_module('shiftedop')") < script.index("_stand_in('jobtest::shifted.default'")


@pytest.mark.slow
def test_a_job_s_compile_error_is_bisected_on_its_failing_rank_alone(inductor_job):
    """``bisect compiler`` of a real job whose rank 1 failed to compile: each replay compiles rank
    1's graph alone against a fake process group (a compile reads no collective's value, as
    ``run --rank`` and PyTorch's own way), under rank 1's records, so it names the bug injector
    rank 1 alone set. Before, every replay was refused: the graph's collectives need the job."""
    result = invoke("bisect", "compiler", inductor_job, "--config-only", "--no-sidecar", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [s["verdict"] for s in report["steps"]] == ["bad", "good"], report["steps"]
    assert "CppCompileError" in report["steps"][0]["observed"]
    assert [n["setting"] for n in report["config_flags"]["needed"]] == \
        ["torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY"]


def test_a_rank_the_job_does_not_record_is_refused_in_one_line(archives):
    """Preparing a rank's replay (what each rank worker does) for a rank the job does not hold:
    one line that names the ranks it has, exit 2, before anything is loaded."""
    from reproarchive.errors import ReproArchiveError
    from reproarchive.replay.prepared import prepared

    with pytest.raises(ReproArchiveError) as caught:
        prepared(archives["fails"], reproarchive.ReplaySettings(), rank=7)
    assert str(caught.value).splitlines()[0].startswith("the archive records no rank 7 (it has [0, 1])")
    assert caught.value.exit_code == 2 and "\n" not in caught.value.what
