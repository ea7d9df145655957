"""Compile-stage failures of GPU graphs replay on a machine without the GPU (``--compile-only``).

The archives start from real captures on this machine's CPU: a small model compiled by Inductor
with PyTorch's bug injector, static and ``dynamic=True``, and an accuracy bug. Each is then
recorded as a capture on an H200 records it (``support.devices.recorded_on_gpu``: storages on
``cuda:0``, the system record's GPU, and Inductor's Triton injector in place of the C++ one).
Their failure is the one the injected Triton compile gives for ``sm_90``: the first compile-only
replay observes it, and the archive records it, as the H200 itself fails ("Failed to import ...
SyntaxError" from the generated kernel).

Compiling for an absent GPU needs a CUDA build of torch with Triton (CI's torch 2.15 matrix
leg; ``.ci/matrix-tests``); on a CPU-only build those tests skip, and the build's own answer is
tested instead: 125 with the build that is needed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import reproarchive
from reproarchive.codec.device_runtime import runtime
from reproarchive.codec.gpu_description import NotDescribed, describe
from reproarchive.compat.absent_gpu import unavailable_reason
from reproarchive.errors import DeviceUnavailableError, ReproArchiveError
from reproarchive.format.reader import ContainerReader
from reproarchive.format.schema import CudaInfo, GpuInfo, SystemRecord
from support.captures import capture_failure
from support.cli import invoke
from support.devices import H200, recorded_on_gpu

pytestmark = pytest.mark.skipif(runtime("cuda").available(), reason="needs a machine without a GPU")
CANNOT = unavailable_reason()
needs_cuda_build = pytest.mark.skipif(CANNOT is not None, reason=f"compiling for an absent GPU: {CANNOT}")
TRITON_BUG = {"triton.inject_relu_bug_TESTING_ONLY": "compile_error"}


def model(x, w):
    return torch.nn.functional.layer_norm(torch.relu(x @ w), (8,)).sum(1) * 2


def _args(rows: int = 6):
    gen = torch.Generator().manual_seed(0)
    return torch.randn(rows, 8, generator=gen), torch.randn(8, 8, generator=gen)


def _inductor_capture(path: Path, *, dynamic: bool = False) -> Path:
    """A real Inductor compile error on this CPU (the C++ relu injector)."""
    torch._dynamo.reset()
    with torch._inductor.config.patch({"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"}):
        compiled = torch.compile(model, dynamic=dynamic, backend=reproarchive.capture("inductor", path=path))
        with pytest.raises(Exception, match="CppCompileError"):
            compiled(*_args())
    torch._dynamo.reset()
    return path


def _with_gpu_failure(cpu: Path, folder: Path, name: str) -> Path:
    """``cpu`` as recorded on an H200 with the Triton injector, and the failure that compile has."""
    draft = recorded_on_gpu(cpu, folder / f"{name}-draft.tar.zst", changed=TRITON_BUG)
    found = reproarchive.run(draft, isolate=True)
    assert found.observed is not None and found.observed.stage == "compile", found.to_dict()
    return recorded_on_gpu(cpu, folder / f"{name}.tar.zst", changed=TRITON_BUG, failure=found.observed)


@pytest.fixture(scope="module")
def captures(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("compile-only")
    return {"static": _inductor_capture(folder / "static.tar.zst"),
            "dynamic": _inductor_capture(folder / "dynamic.tar.zst", dynamic=True)}


@pytest.fixture(scope="module")
def gpu_archives(captures, tmp_path_factory) -> dict[str, Path]:
    if CANNOT is not None:
        pytest.skip(f"compiling for an absent GPU: {CANNOT}")
    folder = tmp_path_factory.mktemp("gpu")
    return {name: _with_gpu_failure(path, folder, name) for name, path in captures.items()}


# ---------------------------------------------------------------------------------------------
# on a CUDA build of torch, without a GPU


@needs_cuda_build
def test_a_triton_compile_error_reproduces_without_the_gpu(gpu_archives):
    result = invoke("run", gpu_archives["static"])
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("REPRODUCED (COMPILE ONLY)") and lines[0].endswith("(exit 1)")
    assert any(line.startswith("  compiled  for cuda:0 sm_90 (NVIDIA H200) without the device") for line in lines)
    assert "observed  compile error: RuntimeError: Failed to import" in result.output
    data = json.loads(invoke("run", gpu_archives["static"], "--json").stdout)
    assert (data["status"], data["exit_code"], data["device"]) == ("reproduced", 1, "cuda:0")
    assert "SyntaxError" in data["observed"]["message"]  # the generated Triton kernel, as on the H200
    assert data["compile_only"].startswith("for cuda:0 sm_90 (NVIDIA H200)")
    # the H200's warp size, registers, threads and shared memory were not recorded: said so
    assert "warp_size" in data["compile_only"] and "not recorded" in data["compile_only"]


@needs_cuda_build
def test_a_bug_of_the_cpu_backend_compiles_for_the_gpu_and_passes_compile_only(captures, tmp_path):
    """The C++ injector does not touch Triton's code: the compile for sm_90 passes, and that is
    exit 6 (compiled, nothing ran), never 0."""
    archive = recorded_on_gpu(captures["static"], tmp_path / "cpp-bug.tar.zst")
    result = invoke("run", archive)
    assert result.exit_code == 6, result.output
    assert result.output.startswith("PASSED (COMPILE ONLY)")
    outcome = reproarchive.run(archive, isolate=True)
    assert (outcome.status, outcome.exit_code, outcome.observed) == ("passed", 6, None)


@needs_cuda_build
def test_a_dynamic_graph_compiles_symbolically_for_the_gpu(gpu_archives):
    outcome = reproarchive.run(gpu_archives["dynamic"], isolate=True)
    assert (outcome.status, outcome.exit_code) == ("reproduced", 1), outcome.to_dict()
    assert outcome.shapes["policy"] == "recorded" and outcome.shapes["symbolic"]
    # the replay's own ShapeEnv ran: its guards over the recorded sources
    assert any("L['x'].size()[0]" in g for g in outcome.shapes["guards_replayed"])


@needs_cuda_build
def test_minify_finds_the_relu_and_bisect_names_inductor(gpu_archives, tmp_path):
    small = tmp_path / "min.tar.zst"
    result = invoke("run", "--minify", gpu_archives["static"], "-o", small)
    assert result.exit_code == 0, result.output
    with ContainerReader(small) as archive:
        ops = [n.target for n in archive.index.graph.nodes if n.op == "call_function"]
    assert len(ops) == 1 and "relu" in str(ops[0]), ops
    again = invoke("run", small)
    assert again.exit_code == 1 and "REPRODUCED (COMPILE ONLY)" in again.output, again.output
    found = invoke("bisect", "compiler", small, "--json")
    data = json.loads(found.stdout)
    assert found.exit_code == 0, found.output
    assert (data["backend"], data["subsystem"]) == ("inductor", "lowerings") and data["bisect_number"] is not None
    assert data["debug_info"] is None or "relu" in data["debug_info"]  # torch 2.11's bisector names no op


@needs_cuda_build
def test_a_training_graph_needs_the_runtime_or_only_fwd(captures, tmp_path):
    """Inputs that require grad, compiled with grad on: AOTAutograd's joint trace asks the
    device's runtime for its stream, which a machine without a driver lacks: 125 with the hint;
    ``--only-fwd`` compiles the forward graph instead and says so."""
    import dataclasses

    from support.devices import rewritten_records

    draft = recorded_on_gpu(captures["static"], tmp_path / "draft.tar.zst", changed=TRITON_BUG)
    training = rewritten_records(draft, tmp_path / "train.tar.zst", lambda r: dataclasses.replace(
        r, execution=dataclasses.replace(r.execution, grad_enabled=True)), requires_grad=True)
    result = invoke("run", training)
    assert result.exit_code == 125 and "--only-fwd" in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1
    forward = invoke("run", training, "--only-fwd")
    assert forward.exit_code in (1, 3) and "forward (inference) graph only" in forward.output, forward.output


@pytest.fixture(scope="module")
def h100_log_archive(tmp_path_factory) -> Path:
    """tlparse's own test log, recorded on H100s (``tests/data/tlparse``), packed here."""
    import zstandard

    from reproarchive.sources.trace.pack_trace import pack_trace

    folder = tmp_path_factory.mktemp("h100")
    log = folder / "simple.log"
    log.write_bytes(zstandard.ZstdDecompressor().decompress(
        (Path(__file__).resolve().parents[1] / "data" / "tlparse" / "simple.log.zst").read_bytes()))
    (report,) = pack_trace(log, folder / "out", all_compiles=True).packed
    return Path(report.archive)


@needs_cuda_build
def test_a_real_h100_log_compiles_for_sm_90_here(h100_log_archive):
    """The job compiled this graph on an H100 without failing: compiled for that GPU here, from
    the description its log holds, it passes, and says it only compiled (exit 6)."""
    result = invoke("run", h100_log_archive, "--compile-only")
    assert result.exit_code == 6, result.output
    assert result.output.startswith("PASSED (COMPILE ONLY)")
    assert "  compiled  for cuda:0 sm_90 (NVIDIA H100) without the device" in result.output


# ---------------------------------------------------------------------------------------------
# on any build


def test_a_gpu_log_records_the_gpu_its_output_code_names(h100_log_archive):
    """Inductor's output code in the log names the device it compiled for
    (``DeviceProperties(type='cuda', index=0, cc=90, ...)``): the archive's system record keeps
    it, so a compile for that GPU without it needs nothing the log does not say."""
    with ContainerReader(h100_log_archive) as archive:
        (gpu,) = archive.index.records.system.cuda.devices
    assert (gpu.index, gpu.name, gpu.capability, gpu.multi_processor_count) == (0, "NVIDIA H100", "9.0", 132)
    assert {k: gpu.extra[k] for k in ("warp_size", "regs_per_multiprocessor", "max_threads_per_multi_processor")} \
        == {"warp_size": 32, "regs_per_multiprocessor": 65536, "max_threads_per_multi_processor": 2048}
    (described,) = describe(archive.index.records.system, ["cuda:0"])
    assert set(described.derived) == {"shared_memory_per_block", "shared_memory_per_block_optin"}


@pytest.mark.parametrize("index", [0, -1, (0, 1), slice(1, None), (Ellipsis, 1), (None, 0), (0, None, slice(0, 2)),
                                   (slice(None), [2, 0]), ([1, 0], slice(None), [0, 3]), (1, Ellipsis, slice(1, 3)),
                                   (slice(None, None, 2),), (0, [1, 2], 1)], ids=str)
def test_indexing_without_the_device_guard_is_torchs_indexing(index):
    """A fake CUDA tensor is indexed through the aten operators the binding dispatches to
    (``compat.device_guards``): the same values as torch's own indexing, shown on real tensors."""
    from reproarchive.compat.device_guards import _indexed

    t = torch.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
    index = tuple(torch.tensor(p) if isinstance(p, list) else p for p in index) if isinstance(index, tuple) else index
    assert torch.equal(_indexed(t, index), t[index])


def test_a_cpu_only_build_says_which_build_is_needed(captures, tmp_path):
    if CANNOT is None:
        pytest.skip("this torch can compile for an absent GPU")
    archive = recorded_on_gpu(captures["static"], tmp_path / "gpu.tar.zst", changed=TRITON_BUG)
    result = invoke("run", archive)
    assert result.exit_code == 125, result.output
    line = result.output.strip()
    assert "\n" not in line and "CUDA build of torch" in line and "--device cpu" in line
    with pytest.raises(DeviceUnavailableError, match="CPU-only build"):
        reproarchive.run(archive, isolate=False)


def test_a_failure_after_compiling_still_needs_the_device(tmp_path):
    """An accuracy failure shows only when the graph runs: 125, as before, whatever the build."""
    gen = torch.Generator().manual_seed(0)
    cpu = capture_failure(tmp_path / "acc.tar.zst", lambda x: torch.relu(x) + 1, (torch.randn(8, generator=gen),),
                          "relu_accuracy_error_TESTING_ONLY", accuracy=True)
    archive = recorded_on_gpu(cpu, tmp_path / "acc-gpu.tar.zst")
    result = invoke("run", archive)
    assert result.exit_code == 125, result.output
    assert "accuracy failure, which only running the graph shows" in result.output
    forced = invoke("run", archive, "--compile-only")
    assert forced.exit_code == 125 and "only running the graph shows" in forced.output


def test_compile_only_and_device_do_not_mix(captures, tmp_path):
    archive = recorded_on_gpu(captures["static"], tmp_path / "gpu.tar.zst", changed=TRITON_BUG)
    result = invoke("run", archive, "--compile-only", "--device", "cpu")
    assert result.exit_code == 2 and "--compile-only" in result.output
    with pytest.raises(ReproArchiveError):
        reproarchive.run(archive, compile_only=True, device="cpu")


def test_compile_only_on_this_machines_device_compiles_and_runs_nothing(captures):
    """``--compile-only`` on a CPU archive: the recorded C++ compile error reproduces from fake
    tensors of the CPU, and nothing is run."""
    outcome = reproarchive.run(captures["static"], compile_only=True, isolate=False)
    assert (outcome.status, outcome.exit_code) == ("reproduced", 1), outcome.to_dict()
    assert outcome.compile_only == "on this machine's devices"


# ---------------------------------------------------------------------------------------------
# the recorded description


def _system(**gpu) -> SystemRecord:
    return SystemRecord(cuda=CudaInfo(available=True, devices=(GpuInfo(**gpu),)))


def test_properties_not_recorded_come_from_the_capability_and_are_named():
    (gpu,) = describe(_system(**H200), ["cuda:0"])
    assert gpu.properties["warp_size"] == 32 and gpu.properties["shared_memory_per_block_optin"] == 232448
    assert set(gpu.derived) == {"warp_size", "regs_per_multiprocessor", "max_threads_per_multi_processor",
                                "shared_memory_per_block", "shared_memory_per_block_optin"}
    assert gpu.said() == "cuda:0 sm_90 (NVIDIA H200)"
    recorded = {**H200, "extra": {"warp_size": 32, "max_threads_per_multi_processor": 2048}}
    (gpu,) = describe(_system(**recorded), ["cuda:0"])
    assert "warp_size" not in gpu.derived and "regs_per_multiprocessor" in gpu.derived


def test_an_undescribed_device_cannot_be_compiled_for():
    with pytest.raises(NotDescribed, match="does not describe cuda:1"):
        describe(_system(**H200), ["cuda:1"])
    with pytest.raises(NotDescribed, match="capability 6.1"):
        describe(_system(**{**H200, "capability": "6.1"}), ["cuda:0"])
    with pytest.raises(NotDescribed, match="does not describe"):
        describe(SystemRecord(), ["cuda:0"])


def test_a_job_compiles_every_rank_alone_and_a_pass_is_never_0(tmp_path):
    """``--compile-only`` of a job on this machine's devices: each rank's graph compiled in a
    child of its own against a fake process group, judged against its own recorded failure
    (rank 1's compile error comes back, rank 0 compiles); a rank alone that compiles is exit 6.
    Running the graphs (``--single-process``) and compiling only do not mix."""
    from support.job_archives import rank_one_fails

    job = rank_one_fails(tmp_path)
    data = json.loads(invoke("run", job, "--compile-only", "--json").stdout)
    assert (data["status"], data["exit_code"], data["rank"]) == ("reproduced", 1, 1), data
    assert [(r["rank"], r["status"]) for r in data["ranks"]] == [(0, "passed"), (1, "reproduced")]
    assert data["compile_only"] == "on this machine's devices"
    alone = invoke("run", job, "--compile-only", "--rank", "0")
    assert alone.exit_code == 6 and alone.output.startswith("PASSED (COMPILE ONLY) (exit 6): passed on rank 0 of 2")
    mixed = invoke("run", job, "--compile-only", "--single-process")
    assert mixed.exit_code == 2 and "drop one of the two" in mixed.output


def test_a_job_compiled_only_refuses_what_would_compile_another_program(tmp_path):
    """Each refusal is one line and exit 2: DTensor inputs (their local shards are another
    program), a minify in isolated workers (the rank's groups are joined in this process), and a
    process that already belongs to a process group."""
    from reproarchive.replay.ranks import as_a_rank_alone, init_fake
    from support.job_archives import dtensor_input, rank_one_fails

    shards = invoke("run", dtensor_input(tmp_path), "--compile-only", "--json")
    assert shards.exit_code == 2 and "DTensors" in json.loads(shards.stdout)["error"]["message"], shards.output
    isolated = invoke("run", "--minify", rank_one_fails(tmp_path), "--compile-only", "--isolate",
                      "-o", tmp_path / "min.tar.zst")
    assert isolated.exit_code == 2 and isolated.output.strip().endswith("leave --isolate out"), isolated.output
    assert not (tmp_path / "min.tar.zst").exists()
    with ContainerReader(rank_one_fails(tmp_path)) as reader:
        job = reader.index.job
    init_fake(0, 2)
    try:
        with pytest.raises(ReproArchiveError, match="already belongs to a process group"):
            with as_a_rank_alone(job, 1):
                pass
    finally:
        torch.distributed.destroy_process_group()


def test_ranks_that_compile_alike_are_compiled_once(tmp_path):
    """Two ranks with one graph, inputs of one geometry, one record set and one failure: one
    compile stands for both, and the verdict says so (a job of hundreds of ranks compiles each
    distinct graph once, not once per rank)."""
    from support.job_archives import every_rank_fails

    data = json.loads(invoke("run", every_rank_fails(tmp_path), "--compile-only", "--json").stdout)
    assert (data["status"], data["exit_code"]) == ("reproduced", 1), data
    assert [(r["rank"], r["status"], r["note"]) for r in data["ranks"]] == [
        (0, "reproduced", ""),
        (1, "reproduced", "compiled once with rank 0, whose graph, inputs' shapes and records are this rank's")]


@pytest.mark.skipif(CANNOT is None, reason="this torch can compile for an absent GPU")
def test_a_gpu_job_on_a_cpu_only_build_says_which_build_is_needed(tmp_path):
    from support.devices import job_recorded_on_gpu
    from support.job_archives import rank_one_fails

    job = job_recorded_on_gpu(rank_one_fails(tmp_path), tmp_path / "gpu-job.tar.zst", changed={})
    result = invoke("run", job, "--json")
    assert result.exit_code == 125, result.output
    assert "CUDA build of torch" in json.loads(result.stdout)["error"]["hint"], result.output


@needs_cuda_build
def test_a_real_job_s_gpu_compile_error_on_one_rank_reproduces_without_the_gpu(tmp_path_factory, tmp_path):
    """A real 2-rank torchrun job (inductor, a custom op, dropout, a cond, dynamic shapes) as
    recorded on H200s with Inductor's Triton injector on rank 1 alone: without the GPU, each rank
    compiles for sm_90; rank 1's Triton compile error comes back and rank 0 compiles, under its
    own config; rank 0 alone is a compile-only pass (6), never 0."""
    from support.devices import job_recorded_on_gpu
    from support.real_jobs import inductor_job

    source = inductor_job(tmp_path_factory)
    draft = job_recorded_on_gpu(source, tmp_path / "draft.tar.zst", changed={1: TRITON_BUG})
    found = {r.rank: r.outcome for r in reproarchive.run(draft).ranks}
    assert found[0].observed is None and found[1].observed.stage == "compile", {r: o.to_dict()
                                                                               for r, o in found.items()}
    # as the H200 records it: the Triton compile's failure and the shape guards it ended with
    job = job_recorded_on_gpu(source, tmp_path / "job.tar.zst", changed={1: TRITON_BUG},
                              failures={1: found[1].observed},
                              guards={r: o.shapes["guards_replayed"] for r, o in found.items()})
    result = invoke("run", job)
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("REPRODUCED (COMPILE ONLY) ON RANK 1 (exit 1)"), result.output
    assert any(line.startswith("  compiled  for cuda:0 sm_90 (NVIDIA H200) without the device") for line in lines)
    data = json.loads(invoke("run", job, "--json").stdout)
    ranks = {r["rank"]: r for r in data["ranks"]}
    assert (ranks[0]["status"], ranks[1]["status"]) == ("passed", "reproduced"), data
    assert "SyntaxError" in ranks[1]["outcome"]["observed"]["message"]  # the generated Triton kernel, as on an H200
    assert all(r["outcome"]["compile_only"].startswith("for cuda:0 sm_90") for r in ranks.values())
    alone = invoke("run", job, "--rank", "0", "--json")
    assert alone.exit_code == 6 and json.loads(alone.stdout)["status"] == "passed", alone.output
    # minified without the GPU: rank 1's graph, cut inside the cond's branch (its predicate reads a
    # value, so the minifier's one run is on fake tensors) to the relu, the model's line with it
    minified = invoke("run", "--minify", job, "-o", tmp_path / "min.tar.zst", "--json")
    assert minified.exit_code == 0, minified.output
    report = json.loads(minified.stdout)
    assert report["stats"]["final_ops"] == 1 and "torch.relu" in report["code"], report["code"]
    assert "job_program.py" in report["code"] and "all_reduce" not in report["code"]
    replayed = invoke("run", tmp_path / "min.tar.zst")
    assert replayed.exit_code == 1 and replayed.output.startswith("REPRODUCED (COMPILE ONLY)"), replayed.output
    # and the compiler stage is named without the GPU: Inductor's lowering, and the setting rank 1 alone had
    found = json.loads(invoke("bisect", "compiler", job, "--json").stdout)
    assert (found["status"], found["backend"], found["subsystem"]) == ("found", "inductor", "lowerings"), found
    needs = [f["setting"] for f in found["config_flags"]["needed"]]
    assert needs == ["torch._inductor.config.triton.inject_relu_bug_TESTING_ONLY"], found["config_flags"]


@needs_cuda_build
def test_a_gpu_job_s_compile_error_minifies_on_its_failing_rank_without_the_gpu(tmp_path):
    """A job recorded on H200s whose rank 1 fails to compile (PyTorch's relu compile-error
    injector): without the GPU its failing rank's graph is shrunk as one graph, compiled for
    sm_90 with the job's groups on a fake process group; the result, still recorded on the GPU,
    is the relu alone and reproduces compiled only."""
    from support.devices import job_recorded_on_gpu
    from support.job_archives import rank_one_fails

    job = job_recorded_on_gpu(rank_one_fails(tmp_path), tmp_path / "gpu-job.tar.zst", changed={})
    result = invoke("run", "--minify", job, "-o", tmp_path / "min.tar.zst", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["status"] == "minified" and "relu" in report["code"] and "all_reduce" not in report["code"]
    replayed = invoke("run", tmp_path / "min.tar.zst")
    assert replayed.exit_code == 1 and replayed.output.startswith("REPRODUCED (COMPILE ONLY)"), replayed.output
    with ContainerReader(tmp_path / "min.tar.zst") as reader:
        assert {s.device for s in reader.index.storages} == {"cuda:0"}


@needs_cuda_build
def test_a_recorded_setting_that_benchmarks_on_the_device_is_refused(captures, tmp_path):
    tuned = {**TRITON_BUG, "max_autotune": True}
    archive = recorded_on_gpu(captures["static"], tmp_path / "tuned.tar.zst", changed=tuned)
    result = invoke("run", archive)
    assert result.exit_code == 125 and "max_autotune" in result.output and "benchmarks kernels" in result.output
