"""User Triton kernels in an archive (spec §8 ``triton_kernels``), read where Triton is not even
installed: each launch runs on a stand-in that writes what the recorded launch wrote, and nothing
the archive names is imported, compiled or launched. Starts from the current version's golden
vector ``triton-<version>`` (a graph launching ``support.triton_kernels.scale_kernel`` in place); capture and
the user's own kernels are ``tests/sources/test_triton_capture.py``."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch

import reproarchive
from reproarchive.codec import stand_ins
from reproarchive.errors import ExportError, IndexSchemaError, NotReplayableHereError
from reproarchive.format.schema import FORMAT_VERSION
from support.hostile_corpus import parse, rebuild

# the current version's: the hostile variants re-assemble it, and the assembler writes this version
VECTOR = Path(__file__).resolve().parents[2] / "spec" / "vectors" / f"triton-{FORMAT_VERSION}.tar.zst"


@pytest.fixture
def brought():
    """Modules brought by the user in this test only (``--import`` is process-wide)."""
    saved = list(stand_ins.BROUGHT_MODULES)
    stand_ins.BROUGHT_MODULES.clear()
    yield stand_ins.BROUGHT_MODULES
    stand_ins.BROUGHT_MODULES[:] = saved


def _load(path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        repro = reproarchive.load(path)
    return repro, [str(w.message) for w in caught]


def test_a_stand_in_writes_what_the_launch_wrote_and_refuses_other_inputs(brought):
    repro, said = _load(VECTOR)
    assert repro.stand_ins == ["triton:scale_kernel"]
    assert any(m.startswith("Triton kernel scale_kernel is not here: a stand-in writes its 1 recorded") for m in said)
    (x,) = repro.args
    expected = (x * 3.0 + 1.0,)  # what Triton's interpreter computed when the vector was made
    torch.testing.assert_close(repro.gm(x), expected)
    torch.testing.assert_close(x, torch.arange(8, dtype=torch.float32))  # the launch wrote its clone only
    torch.testing.assert_close(torch.compile(repro.gm, backend="aot_eager")(x), expected)  # functionalized
    with pytest.raises(RuntimeError, match="stand-in for Triton kernel scale_kernel: no launch with these inputs"):
        repro.gm(x + 1)


def test_doctor_names_a_kernel_that_is_not_here(brought):
    rows = [r for r in reproarchive.doctor(VECTOR).differences if r["what"] == "triton kernel"]
    assert [r["name"] for r in rows] == ["scale_kernel"] and rows[0]["important"]
    assert rows[0]["current"].startswith("not here: `run` stands in for it from its 1 recorded launch(es)")


def test_export_refuses_in_one_line(tmp_path):
    with pytest.raises(ExportError, match="launches user Triton kernels \\(scale_kernel\\)"):
        reproarchive.export(VECTOR, tmp_path / "bug")
    assert not (tmp_path / "bug").exists()


def _variant(tmp_path, name: str, edit) -> Path:
    path = tmp_path / f"{name}.tar.zst"
    path.write_bytes(rebuild(parse(VECTOR.read_bytes()), edit))
    return path


def test_an_archive_cannot_make_replay_import_or_launch_what_it_names(tmp_path, monkeypatch, brought):
    marker = tmp_path / "imported"
    monkeypatch.setenv("REPROARCHIVE_TEST_MARKER", str(marker))

    def name_a_module(index):
        index["triton_kernels"][0]["module"] = "support.triton_marker"
    hostile = _variant(tmp_path, "module", name_a_module)
    repro, _ = _load(hostile)
    repro.gm(*repro.args)
    reproarchive.doctor(hostile)
    assert not marker.exists() and "support.triton_marker" not in sys.modules
    assert repro.stand_ins == ["triton:scale_kernel"]

    def other_source(index):  # the digest follows the source: an archive cannot claim the user's kernel
        index["triton_kernels"][0]["source"] = index["triton_kernels"][0]["source"].replace("* s", "* s * s")
    with pytest.raises(IndexSchemaError, match="R8-7"):
        reproarchive.load(_variant(tmp_path, "source", other_source))

    def launch_another_index(index):  # the side table of this process is never reached
        for node in index["graph"]["nodes"]:
            if "triton_kernel_wrapper" in node["target"]:
                node["kwargs"]["kernel_idx"] = 0 if index["triton_kernels"][0]["index"] else 1
    with pytest.raises(IndexSchemaError, match="does not record"):
        reproarchive.load(_variant(tmp_path, "index", launch_another_index))

    def launch_functional(index):  # the functional form needs the kernel itself
        for node in index["graph"]["nodes"]:
            if "triton_kernel_wrapper" in node["target"]:
                node["target"] = "torch.ops.higher_order.triton_kernel_wrapper_functional"
    with pytest.raises(NotReplayableHereError, match="functional form"):
        reproarchive.load(_variant(tmp_path, "functional", launch_functional))


def test_a_launch_this_process_cannot_describe_is_not_packed(tmp_path):
    """A graph from a dump (``capture --``, ``pack`` of PyTorch's repro) names a kernel of another
    process's side table: packing it says so in one line and writes nothing."""
    from torch._higher_order_ops.triton_kernel_wrap import triton_kernel_wrapper_mutation

    from reproarchive.errors import PackError

    g = torch.fx.Graph()
    x = g.placeholder("x")
    y = g.call_function(torch.clone, (x,))
    g.call_function(triton_kernel_wrapper_mutation, (), {"kernel_idx": 10**6, "constant_args_idx": 10**6,
                                                         "grid": [(1, 1, 1)], "tma_descriptor_metadata": {},
                                                         "kwargs": {"x_ptr": y}})
    g.output((y,))
    out = tmp_path / "a.tar.zst"
    with pytest.raises(PackError) as raised:
        reproarchive.pack(torch.fx.GraphModule(torch.nn.Module(), g), [torch.ones(4)], out, backend="eager",
                          snapshot=False)
    assert "side table does not hold" in str(raised.value) and "\n" not in str(raised.value)
    assert not out.exists() and not list(tmp_path.iterdir())


def test_inspect_shows_the_kernel_where_triton_is_not_installed():
    info = reproarchive.inspect(VECTOR)
    (row,) = info.triton_kernels
    assert row.name == "scale_kernel" and row.launches == 1 and row.digest.startswith("sha256:")
    assert row.here.startswith("not here: `run` stands in for it") and info.not_replayable_here == ()
