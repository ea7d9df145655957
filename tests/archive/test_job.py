"""A multi-rank job in one archive (spec §8 ``job``): packing, merging, loading every rank, and
what single-process readers make of it. Nothing here launches ranks (``tests/sources`` does)."""

from __future__ import annotations

import json
import operator
from pathlib import Path

import pytest
import torch
import torch.fx as fx

import reproarchive
from reproarchive._internal import first_divergence, merge_parts
from reproarchive.archive.job_archive import RankCapture
from reproarchive.format.reader import ContainerReader
from reproarchive.format.schema import CollectiveRecord, ProcessGroupRecord, RankOutcome, RankRecord
from support.cli import invoke

GROUPS = [ProcessGroupRecord(name="0", ranks=(0, 1, 2), backend="gloo", index=0)]


def _graph(group: str = "0", extra: bool = False) -> fx.GraphModule:
    g = fx.Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    y = g.call_function(torch.ops._c10d_functional.all_reduce, (x, "sum", group))
    y = g.call_function(torch.ops._c10d_functional.wait_tensor, (y,))
    y = g.call_function(operator.mul, (y, w))
    if extra:
        y = g.call_function(torch.relu, (y,))
    g.output((y,))
    return fx.GraphModule(torch.nn.Module(), g)


def _rank(r: int, status: str = "passed", **kw) -> RankCapture:
    schedule = (CollectiveRecord(op="all_reduce", group="0", shapes=((4,),), dtypes=("float32",)),)
    record = RankRecord(rank=r, local_rank=r, device="cpu", schedule=schedule, outcome=RankOutcome(status=status))
    return RankCapture(kw.pop("gm", None) or _graph(), [torch.full((4,), float(r)), torch.linspace(0, 1, 4)], record)


@pytest.fixture
def job(tmp_path):
    ranks = [_rank(0), _rank(1, "failed"), _rank(2, gm=_graph(extra=True))]
    return reproarchive.pack_job(ranks, tmp_path / "job.tar.zst", world_size=3, backend="gloo", groups=GROUPS)


def test_every_rank_comes_back_with_its_own_inputs_and_the_failing_rank_is_primary(job):
    loaded = reproarchive.load_job(job)
    assert (loaded.world_size, loaded.backend, loaded.failing_rank, loaded.primary_rank) == (3, "gloo", 1, 1)
    assert [r.rank for r in loaded.ranks] == [0, 1, 2]
    for r in loaded.ranks:
        torch.testing.assert_close(r.args[0], torch.full((4,), float(r.rank)))
        assert r.fidelity == ["real", "real"] and r.schedule[0].op == "all_reduce"
    assert loaded.groups == tuple(GROUPS)
    assert "relu" in loaded.rank(2).gm.code and "relu" not in loaded.rank(0).gm.code


def test_identical_graphs_and_storages_are_stored_once(job):
    with ContainerReader(job) as reader:
        index = reader.index
        blobs = [m for m in reader.members if m.startswith("blobs/")]
    # ranks 0 and 1 run the same graph: only rank 2's differs and is stored in job.graphs
    assert len(index.job.graphs) == 1
    assert [r.graph for r in sorted(index.job.ranks, key=lambda r: r.rank)] == [None, None, 0]
    # the shared weight is one storage record and one blob; rank 0's zeros need no blob
    weights = {r.rank: (r.inputs or index.inputs)[1].storage for r in index.job.ranks}
    assert len(set(weights.values())) == 1
    assert len(blobs) == 3  # weight, rank 1's ones, rank 2's twos


def test_a_single_process_reader_sees_the_failing_rank_and_refuses_only_to_run_it(job, tmp_path):
    reproarchive.verify(job)
    facts = reproarchive.inspect(job)
    assert facts is not None
    with pytest.raises(reproarchive.errors.NotReplayableHereError, match="reproarchive run") as err:
        reproarchive.load(job)
    assert err.value.exit_code == 125 and "all 3 ranks" in str(err.value)
    # the one-process replay of one graph refuses; ``run`` launches the job (tests/replay/test_job_run.py),
    # where the one-process choice is a mistake said in one line
    from reproarchive.replay import runner

    with pytest.raises(reproarchive.errors.NotReplayableHereError, match="collective all_reduce on process group '0'"):
        runner.run(job, reproarchive.ReplaySettings(backend="eager"), isolate=False)
    with pytest.raises(reproarchive.ReproArchiveError, match="do not apply to a multi-rank job"):
        reproarchive.run(job, isolate=False)
    assert invoke("verify", job).exit_code == 0
    assert invoke("inspect", job).exit_code == 0


def test_a_group_name_that_is_not_a_name_is_refused(tmp_path):
    path = reproarchive.pack(_graph(group="../../etc"), [torch.ones(4), torch.ones(4)], tmp_path / "bad.tar.zst")
    with pytest.raises(reproarchive.errors.UnsafeArchiveError, match="group_name"):
        reproarchive.verify(path)


def test_parts_of_one_rank_twice_or_of_two_jobs_are_refused(tmp_path):
    one = reproarchive.pack_job([_rank(0)], tmp_path / "a.tar.zst", world_size=3, groups=GROUPS)
    with pytest.raises(reproarchive.errors.PackError, match="rank 0 is in both"):
        merge_parts([one, one], tmp_path / "out.tar.zst")
    other = reproarchive.pack_job([_rank(1)], tmp_path / "b.tar.zst", world_size=2,
                                  groups=[ProcessGroupRecord(name="0", ranks=(0, 1))])
    with pytest.raises(reproarchive.errors.PackError, match="different world sizes"):
        merge_parts([one, other], tmp_path / "out.tar.zst")
    assert not (tmp_path / "out.tar.zst").exists()


def test_a_single_process_archive_loads_as_a_job_of_one_rank(tmp_path):
    g = fx.symbolic_trace(lambda x: x + 1)
    path = reproarchive.pack(g, [torch.ones(2)], tmp_path / "one.tar.zst")
    loaded = reproarchive.load_job(path)
    assert loaded.world_size == 1 and [r.rank for r in loaded.ranks] == [0]


def test_module_state_of_two_ranks_is_renumbered_and_shared(tmp_path):
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 2)
    ranks = [RankCapture(fx.symbolic_trace(lin), [torch.full((3, 4), float(r))],
                         RankRecord(rank=r, outcome=RankOutcome(status="passed"))) for r in range(2)]
    path = reproarchive.pack_job(ranks, tmp_path / "lin.tar.zst", world_size=2)
    loaded = reproarchive.load_job(path)
    assert loaded.index.job.graphs == () and len(loaded.index.storages) == 4  # weight, bias, two inputs
    for r in loaded.ranks:
        torch.testing.assert_close(r.gm(*r.args), lin(torch.full((3, 4), float(r.rank))))


# -- hangs explained without running: the schedules side by side (spec §8 job, informative) ------

VECTOR = Path(__file__).resolve().parents[2] / "spec" / "vectors" / "job-1.3.tar.zst"


def _schedule_job(*schedules, groups=(("0", (0, 1, 2)),)):
    from reproarchive.format.schema import JobRecord

    def coll(text):
        op, group = text.split("@")
        return CollectiveRecord(op=op, group=group, shapes=((4,),), dtypes=("float32",))

    ranks = tuple(RankRecord(rank=r, schedule=tuple(coll(t) for t in s)) for r, s in enumerate(schedules))
    return JobRecord(world_size=len(schedules), primary_rank=0, ranks=ranks,
                     groups=tuple(ProcessGroupRecord(name=n, ranks=m) for n, m in groups))


def test_the_rank_that_skipped_a_collective_is_named_even_between_two_ranks():
    d = first_divergence(_schedule_job(["all_reduce@0", "all_reduce@0"], ["all_reduce@0"],
                                                    groups=(("0", (0, 1)),)))
    assert (d.rank, d.index, d.got) == (1, 1, None) and "rank 1 skipped it" in d.summary


def test_the_minority_diverges_and_agreeing_ranks_report_nothing():
    d = first_divergence(_schedule_job(["all_reduce@0"], ["broadcast@0"], ["all_reduce@0"]))
    assert (d.rank, d.ranks, d.expected) == (1, (1,), "all_reduce on group '0' float32[4]")
    assert first_divergence(_schedule_job(["all_reduce@0"], ["all_reduce@0"], ["all_reduce@0"])) is None


def test_sub_groups_are_matched_among_their_own_members():
    groups = (("0", (0, 1, 2, 3)), ("1", (0, 1)), ("2", (2, 3)))
    agree = _schedule_job(["all_reduce@0", "all_gather@1"], ["all_reduce@0", "all_gather@1"],
                          ["all_reduce@0", "all_gather@2"], ["all_reduce@0", "all_gather@2"], groups=groups)
    assert first_divergence(agree) is None
    skipped = _schedule_job(["all_reduce@0", "all_gather@1"], ["all_reduce@0", "all_gather@1"],
                            ["all_reduce@0"], ["all_reduce@0", "all_gather@2"], groups=groups)
    d = first_divergence(skipped)
    assert (d.group, d.rank) == ("2", 2)


def test_inspect_diff_and_view_show_the_ranks_side_by_side(tmp_path):
    result = invoke("inspect", VECTOR, "--json")
    assert result.exit_code == 0, result.output
    job = json.loads(result.stdout)["job"]
    assert job["failing_rank"] == 1
    assert [r["status"] for r in job["ranks"]] == ["passed", "failed", "timeout", "crashed"]
    assert job["divergence"]["rank"] == 2 and job["divergence"]["group"] == "2"
    text = invoke("inspect", VECTOR).output
    assert "rank 3: crashed [SIGABRT]" in text and "diverged: rank 2 issued no collective #1 on group '2'" in text
    same = invoke("diff", VECTOR, VECTOR)
    assert same.exit_code == 0 and "A job: 4 ranks (gloo), failing rank 1" in same.output
    page = tmp_path / "job.html"
    assert invoke("view", VECTOR, "-o", page).exit_code == 0
    html = page.read_text()
    assert "Ranks of the job" in html and "rank 2 issued no collective #1 on group" in html


def test_merged_parts_keep_the_failing_ranks_generator_states(tmp_path):
    """Each rank's part records the generator states its call started from; the merged job
    archive's own records (the failing rank's) point at them in the merged storage table (they
    pointed into the part's, and the merge refused: "storage 1 does not exist")."""
    from reproarchive.archive.job_archive import rank_part_job
    from reproarchive.archive.job_merge import merge_parts
    from reproarchive.archive.packing import pack
    from reproarchive.format.schema import Records

    def dropout(x):
        return torch.nn.functional.dropout(x, 0.5, True) * 2

    gm = fx.symbolic_trace(dropout)
    states, parts = {}, []
    for rank in (0, 1):
        torch.manual_seed(100 + rank)
        states[rank] = torch.get_rng_state()
        outcome = RankOutcome(status="failed" if rank == 1 else "passed")
        job = rank_part_job(RankRecord(rank=rank, outcome=outcome), world_size=2, backend="gloo")
        part = tmp_path / f"rank-{rank}.tar.zst"
        pack(gm, [torch.randn(64) + rank], part, records=Records(backend="eager"), job=job,
             rng_states={"cpu": states[rank]})
        parts.append(part)
    merged = merge_parts(parts, tmp_path / "job.tar.zst")
    reproarchive.verify(merged)
    loaded = reproarchive.load(merged)
    assert torch.equal(loaded.rng_states["cpu"], states[1])  # the failing rank's, rank 1
    assert loaded.records.rng.random_ops
    # a minified job is packed from the loaded job's ranks (``job_minify.pack_parts``): it keeps them
    from reproarchive.minifier.job_minify import pack_parts

    job = reproarchive.load_job(merged)
    assert torch.equal(job.rng_states["cpu"], states[1])
    again = pack_parts(job, {r.rank: (r.gm, list(r.args)) for r in job.ranks}, tmp_path / "again.tar.zst",
                       records=job.records)
    assert torch.equal(reproarchive.load(again).rng_states["cpu"], states[1])


def test_the_ranks_custom_ops_and_triton_kernels_join_into_the_jobs_tables():
    """Each operator and kernel once, with every rank's calls (a call both ranks made, once);
    two ranks that disagree on what a name or a kernel number means are refused in one line."""
    from types import SimpleNamespace

    from reproarchive.archive.job_merge import _custom_ops, _Storages, _triton_kernels
    from reproarchive.format.schema import CustomOpCall, CustomOpRecord, TritonCall, TritonKernelRecord

    def part(ops=(), kernels=()):
        return SimpleNamespace(custom_ops=tuple(ops), triton_kernels=tuple(kernels), storages=())

    def op(*keys, schema="t::f(Tensor x) -> Tensor"):
        return CustomOpRecord(name="t::f.default", schema=schema,
                              calls=tuple(CustomOpCall(arguments=(f"float32[4] sha256:{k}",)) for k in keys))

    parts = [part([op("aa")]), part([op("bb", "aa")])]
    [merged] = _custom_ops(parts, _Storages(parts))
    assert [c.arguments[0][-2:] for c in merged.calls] == ["aa", "bb"]
    other = [part([op("aa")]), part([op("bb", schema="t::f(Tensor x, int n) -> Tensor")])]
    with pytest.raises(reproarchive.errors.PackError, match="custom op t::f.default with two schemas"):
        _custom_ops(other, _Storages(other))

    def kernel(key, *, digest="sha256:" + "1" * 64, n=4):
        return TritonKernelRecord(index=0, name="add", source="...", digest=digest, arg_names=("x", "n"),
                                  constants=({"n": n},), calls=(TritonCall(constants=0, arguments={"x": key}),))

    parts = [part(kernels=[kernel("a")]), part(kernels=[kernel("b")])]
    [joined] = _triton_kernels(parts, _Storages(parts))
    assert [c.arguments["x"] for c in joined.calls] == ["a", "b"]
    for odd in (kernel("b", digest="sha256:" + "2" * 64), kernel("b", n=8)):
        other = [part(kernels=[kernel("a")]), part(kernels=[odd])]
        with pytest.raises(reproarchive.errors.PackError, match="numbered their Triton kernels differently"):
            _triton_kernels(other, _Storages(other))
