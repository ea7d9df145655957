"""User Triton kernels captured from a real compile (spec §8 ``triton_kernels``) and replayed
with stand-ins and with the user's own kernels (``run --import``).

Needs the ``triton`` package, in child processes only: the kernels run on CPU tensors through
Triton's own interpreter (``support.triton_on_cpu``). CI installs it beside the environment
(``.ci/run``: ``pip install --target .triton-site``) rather than into it, because torch imports an
installed Triton in every process that imports Dynamo (0.1-0.3 s each, hundreds of processes in
the suite); an installed ``triton`` is used as it is. The same paths on a GPU:
``support/triton_gpu_check.py``."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reproarchive.format.reader import ContainerReader
from support.shared_fixture import built_once

ROOT = Path(__file__).resolve().parents[2]
KERNELS = (ROOT / "tests" / "support" / "triton_kernels.py").read_text()
SITE = ROOT / ".triton-site"


def _environment() -> dict[str, str] | None:
    """The children's environment: with Triton importable, or None where it is nowhere."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if importlib.util.find_spec("triton") is not None:
        return env
    if (SITE / "triton" / "__init__.py").is_file():
        return dict(env, PYTHONPATH=os.pathsep.join(p for p in (str(SITE), env.get("PYTHONPATH")) if p))
    return None


ENV = _environment()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(ENV is None, reason="needs the triton package "
                                                   "(pip install triton, or .ci/run's .triton-site)")]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from reproarchive.cli import main; main()", *args], cwd=ROOT,
                          env=ENV, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="session")
def archive(tmp_path_factory) -> Path:
    """A compiled step launching two kernels whose forward fails after them (a relu); captured
    once for the run (``built_once``), read-only."""
    def build(folder: Path) -> Path:
        proc = subprocess.run([sys.executable, "-m", "tests.support.triton_program", "relu_runtime_error_TESTING_ONLY",
                               str(folder)], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 1, proc.stderr[-2000:]
        (path,) = folder.glob("*.tar.zst")
        return path

    return built_once(tmp_path_factory, "triton_capture", build, str, Path)


def test_capture_records_each_kernel_and_what_its_launches_wrote(archive):
    with ContainerReader(archive) as reader:
        index = reader.index
    kernels = {k.name: k for k in index.triton_kernels}
    assert set(kernels) == {"add_kernel", "scale_kernel"}
    add, scale = kernels["add_kernel"], kernels["scale_kernel"]
    assert add.source.startswith("def add_kernel(") and add.source in KERNELS  # decorators are not the kernel's
    assert scale.source.startswith("def scale_kernel(") and scale.source in KERNELS
    assert add.module == "tests.support.triton_kernels"
    assert add.arg_names == ("x_ptr", "y_ptr", "out_ptr", "n", "BLOCK") and add.constexprs == ("BLOCK",)
    assert [c.kwargs for c in add.configs] == [{"BLOCK": 16}] and add.configs[0].num_warps == 1
    assert add.autotune_key == ("n",) and add.constants == ({"n": 40},)
    assert scale.constants == ({"n": 40, "s": 3.0, "BLOCK": 16},) and not scale.configs
    (call,) = add.calls
    assert call.arguments["out_ptr"] == "float32[40] uninitialized"  # an output buffer: its garbage is no key
    assert call.arguments["x_ptr"].startswith("float32[40] sha256:") and set(call.written) == {"out_ptr"}
    (call,) = scale.calls
    assert call.arguments["x_ptr"].startswith("float32[40] sha256:") and set(call.written) == {"x_ptr"}
    launches = [n for n in index.graph.nodes if "triton_kernel_wrapper" in n.target]
    assert sorted(n.kwargs["kernel_idx"] for n in launches) == sorted(k.index for k in index.triton_kernels)


def test_run_reproduces_with_stand_ins_and_with_the_users_kernels(archive):
    alone = _cli("run", "--json", str(archive))
    assert alone.returncode == 1, alone.stderr[-1500:]
    assert json.loads(alone.stdout)["stand_ins"] == ["triton:add_kernel", "triton:scale_kernel"]
    real = _cli("run", "--json", str(archive), "--import", "tests.support.triton_on_cpu",
                "--import", "tests.support.triton_kernels")
    assert real.returncode == 1, real.stderr[-1500:]
    assert json.loads(real.stdout)["status"] == "reproduced" and json.loads(real.stdout)["stand_ins"] == []


def test_doctor_tells_a_kernel_brought_from_another_version(archive):
    proc = _cli("doctor", "--json", str(archive), "--import", "tests.support.triton_kernels_v2")
    rows = {r["name"]: r["current"] for r in json.loads(proc.stdout)["differences"] if r["what"] == "triton kernel"}
    assert rows["add_kernel"].startswith("another version here") and rows["scale_kernel"].startswith("not here")
    proc = _cli("doctor", "--json", str(archive), "--import", "tests.support.triton_kernels")
    assert [r for r in json.loads(proc.stdout)["differences"] if r["what"] == "triton kernel"] == []


def test_minify_keeps_the_launches_it_needs_and_the_result_replays(archive, tmp_path):
    out = tmp_path / "min.tar.zst"
    proc = _cli("run", "--minify", str(archive), "-o", str(out))
    assert proc.returncode == 0, proc.stderr[-1500:]
    with ContainerReader(out) as reader:
        index = reader.index
    launched = {n.kwargs["kernel_idx"] for n in index.graph.nodes if "triton_kernel_wrapper" in n.target}
    assert launched == {k.index for k in index.triton_kernels or ()}  # each kept launch keeps its record
    assert all(k.calls for k in index.triton_kernels or ())
    again = _cli("run", "--json", str(out))
    assert again.returncode == 1 and json.loads(again.stdout)["status"] == "reproduced", again.stdout[-800:]


def test_inspect_shows_each_kernel_and_calls_the_archive_replayable(archive):
    proc = _cli("inspect", "--json", str(archive))
    assert proc.returncode == 0, proc.stderr[-1500:]
    info = json.loads(proc.stdout)
    assert info["not_replayable_here"] == []
    rows = {k["name"]: k for k in info["triton_kernels"]}
    assert set(rows) == {"add_kernel", "scale_kernel"}
    with ContainerReader(archive) as reader:
        digests = {k.name: k.digest for k in reader.index.triton_kernels}
    add = rows["add_kernel"]
    assert add["digest"] == digests["add_kernel"] and add["module"] == "tests.support.triton_kernels"
    assert add["launches"] == 1 and add["configs"] == 1 and rows["scale_kernel"]["configs"] == 0
    assert add["here"].startswith("not here: `run` stands in for it from its 1 recorded launch(es)")
    text = _cli("inspect", str(archive)).stdout
    assert "triton kernel: tests.support.triton_kernels.add_kernel  sha256:" in text, text
