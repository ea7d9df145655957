"""User Triton kernels (spec §8 ``triton_kernels``): recorded as data, replayed through a stand-in
or through the user's own kernel, never through anything the archive names.

The kernels run on CPU tensors through Triton's own interpreter (``support.triton_on_cpu``); the
same paths on a GPU are ``support/triton_gpu_check.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

import reproarchive  # noqa: E402
from reproarchive.codec import stand_ins  # noqa: E402
from reproarchive.errors import NotReplayableHereError  # noqa: E402
from reproarchive.format.reader import ContainerReader  # noqa: E402
from reproarchive.format.triton_rules import source_digest  # noqa: E402
from support.hostile_corpus import parse, rebuild  # noqa: E402
from support.triton_kernels import add_kernel, scale_kernel  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, OMP_NUM_THREADS="1")
pytestmark = pytest.mark.slow


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from reproarchive.cli import main; main()", *args], cwd=ROOT,
                          env=ENV, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> Path:
    """A compiled step launching both kernels whose forward fails after them (a relu)."""
    folder = tmp_path_factory.mktemp("triton")
    proc = subprocess.run([sys.executable, "-m", "tests.support.triton_program", "relu_runtime_error_TESTING_ONLY",
                           str(folder)], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    (path,) = folder.glob("*.tar.zst")
    return path


@pytest.fixture
def brought():
    """Modules brought by the user in this test only (``--import`` is process-wide)."""
    saved = list(stand_ins.BROUGHT_MODULES)
    stand_ins.BROUGHT_MODULES.clear()
    yield stand_ins.BROUGHT_MODULES
    stand_ins.BROUGHT_MODULES[:] = saved


def test_capture_records_each_kernel_and_what_its_launches_wrote(archive):
    with ContainerReader(archive) as reader:
        index = reader.index
    kernels = {k.name: k for k in index.triton_kernels}
    assert set(kernels) == {"add_kernel", "scale_kernel"}
    add, scale = kernels["add_kernel"], kernels["scale_kernel"]
    assert add.digest == source_digest(add_kernel.fn.src) and scale.digest == source_digest(scale_kernel.src)
    assert add.source == add_kernel.fn.src and add.module == "tests.support.triton_kernels"
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


def test_stand_ins_write_the_recorded_results_and_refuse_other_inputs(archive, brought):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        repro = reproarchive.load(archive)
    assert repro.stand_ins == ["triton:add_kernel", "triton:scale_kernel"]
    assert sum("Triton kernel" in str(w.message) for w in caught) == 2
    x, y = repro.args
    expected = (torch.relu((x + y) * 3.0) * 2,)
    torch.testing.assert_close(repro.gm(x, y), expected)  # what the real kernels computed
    torch.testing.assert_close(torch.compile(repro.gm, backend="aot_eager")(x, y), expected)
    with pytest.raises(RuntimeError, match="stand-in for Triton kernel add_kernel: no launch with these inputs"):
        repro.gm(x + 1, y)


def test_run_reproduces_with_stand_ins_and_with_the_users_kernels(archive):
    alone = _cli("run", "--json", str(archive))
    assert alone.returncode == 1, alone.stderr[-1500:]
    assert json.loads(alone.stdout)["stand_ins"] == ["triton:add_kernel", "triton:scale_kernel"]
    real = _cli("run", "--json", str(archive), "--import", "tests.support.triton_on_cpu",
               "--import", "tests.support.triton_kernels")
    assert real.returncode == 1, real.stderr[-1500:]
    assert json.loads(real.stdout)["status"] == "reproduced" and json.loads(real.stdout)["stand_ins"] == []


def test_doctor_tells_missing_from_another_version(archive, brought):
    rows = {r["name"]: r["current"] for r in reproarchive.doctor(archive).differences if r["what"] == "triton kernel"}
    assert set(rows) == {"add_kernel", "scale_kernel"} and all(v.startswith("not here") for v in rows.values())
    rows = {r["name"]: r["current"] for r in reproarchive.doctor(archive, imports=["support.triton_kernels_v2"])
            .differences if r["what"] == "triton kernel"}
    assert rows["add_kernel"].startswith("another version here")
    brought.clear()
    rows = [r for r in reproarchive.doctor(archive, imports=["support.triton_kernels"]).differences
            if r["what"] == "triton kernel"]
    assert rows == []


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


def test_an_archive_cannot_make_replay_import_or_launch_what_it_names(archive, tmp_path, monkeypatch, brought):
    marker = tmp_path / "imported"
    monkeypatch.setenv("REPROARCHIVE_TEST_MARKER", str(marker))
    parsed = parse(archive.read_bytes())

    def name_a_module(index):
        for k in index["triton_kernels"]:
            k["module"] = "support.triton_marker"
    hostile = tmp_path / "hostile.tar.zst"
    hostile.write_bytes(rebuild(parsed, name_a_module))
    repro = reproarchive.load(hostile)
    repro.gm(*repro.args)
    reproarchive.doctor(hostile)
    assert not marker.exists() and "support.triton_marker" not in sys.modules
    assert repro.stand_ins == ["triton:add_kernel", "triton:scale_kernel"]

    def source_of_another_kernel(index):  # the digest follows the source, so it cannot claim the user's kernel
        for k in index["triton_kernels"]:
            if k["name"] == "add_kernel":
                k["source"] = k["source"].replace("+ tl.load", "- tl.load")
    brought.append("support.triton_kernels")
    import support.triton_kernels  # noqa: F401 - the user's own module, brought
    forged = tmp_path / "forged.tar.zst"
    forged.write_bytes(rebuild(parsed, source_of_another_kernel))
    with pytest.raises(reproarchive.errors.ReproArchiveError, match="R8-7|sha256 of the kernel's source"):
        reproarchive.load(forged)

    def launch_functional(index):  # the functional form needs the kernel itself
        for node in index["graph"]["nodes"]:
            if "triton_kernel_wrapper" in node["target"]:
                node["target"] = "torch.ops.higher_order.triton_kernel_wrapper_functional"
    brought.clear()
    functional = tmp_path / "functional.tar.zst"
    functional.write_bytes(rebuild(parsed, launch_functional))
    with pytest.raises(NotReplayableHereError, match="functional form"):
        reproarchive.load(functional)


def test_export_refuses_with_one_line(archive, tmp_path):
    proc = _cli("export", str(archive), "-o", str(tmp_path / "bug"))
    assert proc.returncode == 2 and not (tmp_path / "bug").exists()
    assert proc.stderr.strip().splitlines()[-1].startswith("error: the graph launches user Triton kernels")
