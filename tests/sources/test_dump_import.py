"""Importing real PyTorch repro dumps: pack, delete the dump, move the archive, load, compare.

Dumps are made once per module by running small failing programs (tests/dump_programs.py) with
PyTorch's repro env vars in a subprocess. The after_aot ones need a real Inductor CPU compile
(several seconds each), so there are only two of them.
"""

from __future__ import annotations

import operator
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
import torch.fx as fx
import zstandard

import reproarchive
from reproarchive.cli.text import pack_summary
from reproarchive.errors import SourceError  # noqa: E402
from reproarchive.format.schema import DumpSource
from reproarchive.sources.dump.pack_dump import pack_dump  # noqa: E402
from reproarchive.sources.dump.scripts import discover, parse_dump_script
from reproarchive.sources.pack_report import PackReport
from reproarchive.testing.machine_paths import machine_paths_in
from reproarchive.testing.sources import Captured, SourceTests
from support import dump_programs as progs
from support.cli import invoke
from support.shared_fixture import built_once

# ---------------------------------------------------------------------------------------------
# dumps, made once


@pytest.fixture(scope="module")
def dynamo_dump(tmp_path_factory) -> Path:
    """after_dynamo, level 2, compile error: folder holding torch_compile_debug/ and inputs.pt.
    Made once for the whole run (``built_once``): tests copy it (``_copy``), never change it."""

    def build(folder: Path) -> Path:
        progs.make_dump(folder, progs.dynamo_program("compile_error"), after="dynamo", level=2)
        return folder

    return built_once(tmp_path_factory, "dump_import_dyn", build, dump=str, load=Path)


@pytest.fixture(scope="module")
def aot_accuracy_dump(tmp_path_factory) -> Path:
    """after_aot, level 4, inductor accuracy bug: real data (unstable hash), launcher + repro.py.
    Made once for the whole run (``built_once``): tests copy it (``_copy``), never change it."""

    def build(folder: Path) -> Path:
        progs.make_dump(folder, progs.aot_program("accuracy"), after="aot", level=4)
        return folder

    return built_once(tmp_path_factory, "dump_import_aotacc", build, dump=str, load=Path)


def _copy(folder: Path, dest: Path) -> Path:
    """A private copy of a dump, as if PyTorch had written it in ``dest`` (scripts re-pointed)."""
    shutil.copytree(folder, dest)
    for script in [*dest.glob("torch_compile_debug/run_*/minifier/*.py"), *dest.glob("repro*.py")]:
        script.write_text(script.read_text().replace(str(folder), str(dest)))
    return dest


def _storages(store: Path) -> dict[str, bytes]:
    """What the dump's content store holds, read the way PyTorch reads it."""
    out = {}
    for f in (store / "storages").iterdir():
        s = torch.load(f, weights_only=True)._untyped_storage
        out[f.name] = bytes(s)
    return out


def _decompressed(archive: Path) -> bytes:
    with open(archive, "rb") as fh:
        return zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=True).read()


def _pack_in(folder: Path, out: Path, **kw):
    """pack_dump with cwd=folder, checking that the caller's process is left as it was."""
    import torch._dynamo.config as dcfg
    import torch._inductor.config as icfg

    env_before = dict(os.environ)
    cwd_before = os.getcwd()
    dyn_before = dcfg.get_config_copy()
    ind_before = icfg.get_config_copy()
    result = pack_dump(kw.pop("source", None), out, cwd=folder, **kw)
    assert dict(os.environ) == env_before
    assert os.getcwd() == cwd_before
    assert dcfg.get_config_copy() == dyn_before
    assert icfg.get_config_copy() == ind_before
    return result


# ---------------------------------------------------------------------------------------------
# after_dynamo


def test_after_dynamo_dump_round_trip(dynamo_dump, tmp_path):
    work = _copy(dynamo_dump, tmp_path / "work")
    launcher = progs.launcher_in(work)
    held = _storages(launcher.parent / "checkpoints")
    program_inputs = torch.load(work / "inputs.pt")

    save_dir = parse_dump_script(launcher).save_dir
    assert save_dir.startswith(str(work))  # PyTorch wrote an absolute path of this machine

    result = _pack_in(work, tmp_path / "out.tar.zst")
    assert result.script == launcher.resolve()
    assert result.kind == "after_dynamo"
    assert result.inputs["real"] == 4 and result.inputs["absent"] == 0
    assert result.failure["stage"] == "compile"
    assert result.failure["exception_type"].endswith("ReluCompileError")
    lines = pack_summary(result)
    assert len(lines) == 3 and lines[0].startswith("graph:") and "4 real / 0 absent" in lines[1]

    # no path of this machine in the archive's bytes (dump folder, save_dir, cwd, checkout, home)
    data = _decompressed(result.archive)
    for path in {str(tmp_path), str(tmp_path.resolve()), str(dynamo_dump), save_dir, os.getcwd(),
                 str(Path(reproarchive.__file__).resolve().parent.parent)}:
        assert path.encode() not in data, path
    home = os.path.expanduser("~")
    if home not in ("/", "~", ""):
        assert (home + "/").encode() not in data
    # nor in any record: site-packages, inductor's cache, the temporary folder, the user name
    assert machine_paths_in(result.archive, work, dynamo_dump) == []

    # the dump is gone and the archive lives elsewhere: it must stand on its own
    shutil.rmtree(work)
    moved = tmp_path / "elsewhere" / "x.tar.zst"
    moved.parent.mkdir()
    shutil.move(str(result.archive), moved)
    repro = reproarchive.load(moved)

    assert repro.fidelity == ["real"] * 4
    assert repro.records.backend == "relu_compile_error_TESTING_ONLY"
    assert not repro.records.accuracy
    assert repro.records.source.kind == "after_dynamo"
    assert repro.records.failure.stage == "compile"
    assert repro.records.failure.signature.startswith("compile|")
    assert repro.records.config and repro.records.system and repro.records.environment is not None

    # graph: the Dynamo graph, placeholders in load_args order
    nodes = [(n.op, n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target)))
             for n in repro.gm.graph.nodes]
    assert [t for op, t in nodes if op == "placeholder"] == [
        "L_self_modules_lin_parameters_weight_", "L_self_modules_lin_parameters_bias_", "L_x_", "L_y_"]
    assert [t for op, t in nodes if op in ("call_function", "call_method")] == ["linear", "add", "relu", "sum"]

    # inputs: bit-exact to the dump's storages, and to what the program passed
    w, b, x, y = repro.args
    for t in repro.args:
        assert bytes(t.untyped_storage()) in held.values()
    assert torch.equal(w, program_inputs["weight"]) and torch.equal(b, program_inputs["bias"])
    assert torch.equal(x, program_inputs["x"]) and x.requires_grad
    assert torch.equal(y, program_inputs["y"]) and y.stride() == (8, 2)
    assert bytes(y.untyped_storage()) == bytes(program_inputs["base"].untyped_storage())

    # and the graph computes what the program's model computed
    expected = torch.relu(torch.nn.functional.linear(x, w, b) + y).sum(1)
    assert torch.equal(repro.gm(*repro.args)[0], expected)

    # and replaying the moved archive here reproduces the failure PyTorch's dump had
    outcome = reproarchive.run(moved)
    assert (outcome.status, outcome.exit_code) == ("reproduced", 1), outcome.to_dict()


def test_missing_storage_is_reported_and_absent(dynamo_dump, tmp_path):
    work = _copy(dynamo_dump, tmp_path / "work")
    launcher = progs.launcher_in(work)
    x_hash = parse_x_hash(launcher)
    (launcher.parent / "checkpoints" / "storages" / x_hash).unlink()

    result = _pack_in(work, tmp_path / "out.tar.zst", replay=False)
    assert result.missing_storages == (f"storages/{x_hash}",)
    assert any(x_hash in w for w in result.warnings)
    assert result.inputs["real"] == 3 and result.inputs["absent"] == 1
    assert result.failure["stage"] == "unknown"

    repro = reproarchive.load(result.archive)
    assert repro.fidelity == ["real", "real", "absent", "real"]
    assert tuple(repro.args[2].shape) == (3, 4)
    assert repro.records.source.storages["missing"] == [f"storages/{x_hash}"]


def parse_x_hash(launcher: Path) -> str:
    """The storage digest load_args gives the input L_x_ (the third reader.storage call)."""
    import ast

    tree = ast.parse(launcher.read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "load_args")
    calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "storage"]
    calls.sort(key=lambda c: c.lineno)
    return ast.literal_eval(calls[2].args[0])


# ---------------------------------------------------------------------------------------------
# after_aot


def test_after_aot_accuracy_dump(aot_accuracy_dump, tmp_path):
    """Slow-ish: two real Inductor CPU compiles (making the dump, and the replay)."""
    work = _copy(aot_accuracy_dump, tmp_path / "work")
    program_inputs = torch.load(work / "inputs.pt")
    launcher = progs.launcher_in(work)
    # PyTorch wrote two scripts for this failure: pack must say which it took and why
    found = discover(None, work)
    assert len(found.candidates) == 2 and "newest" in found.reason

    result = _pack_in(work, tmp_path / "out.tar.zst")
    assert result.script == max(found.candidates, key=lambda p: p.stat().st_mtime)
    assert result.kind == "after_aot" and result.backend == "inductor" and result.accuracy == "accuracy"
    assert result.failure["stage"] == "accuracy", result.failure

    shutil.rmtree(work)
    repro = reproarchive.load(result.archive)
    assert repro.fidelity == ["real", "real"]
    assert repro.records.accuracy is True
    assert torch.equal(repro.args[0], program_inputs["a"]) and torch.equal(repro.args[1], program_inputs["b"])
    targets = [str(n.target) for n in repro.gm.graph.nodes if n.op == "call_function"]
    assert targets == ["aten.mm.default", "aten.add.Tensor", "aten.relu.default", "aten.sum.dim_IntList"]
    assert repro.records.failure.accuracy.outputs, "per-output error figures are recorded"
    assert launcher  # the launcher existed before deletion
    # the whole pipeline: PyTorch's dump -> pack -> replay here reproduces the recorded failure
    outcome = reproarchive.run(result.archive)
    assert (outcome.status, outcome.exit_code) == ("reproduced", 1), outcome.to_dict()


def test_after_aot_storages_without_data(aot_accuracy_dump, tmp_path):
    """What PyTorch writes for compile-time and runtime failures after AOT: ``reader.storage(None,
    n)`` (it only had fake tensors). Made from the real launcher by that one edit, because a real
    Inductor compile error costs another ~20 s of C++ compiling here."""
    work = _copy(aot_accuracy_dump, tmp_path / "work")
    (work / "repro.py").unlink()
    launcher = progs.launcher_in(work)
    text = launcher.read_text()
    text, n = re.subn(r"reader\.storage\('[0-9a-f]+', ", "reader.storage(None, ", text)
    assert n == 2
    launcher.write_text(text)
    result = _pack_in(work, tmp_path / "out.tar.zst", replay=False)
    assert result.kind == "after_aot"
    assert result.inputs["real"] == 0 and result.inputs["absent"] == 2
    assert any("without data" in w for w in result.warnings)
    assert result.failure["stage"] == "unknown"
    repro = reproarchive.load(result.archive)
    assert repro.fidelity == ["absent", "absent"]
    assert [tuple(a.shape) for a in repro.args] == [(3, 4), (4, 5)]
    assert [i["data"] for i in repro.records.source.inputs] == ["no_data", "no_data"]
    assert repro.records.source.torch_version == torch.__version__


EMBEDDING_AFTER_ARITHMETIC = """
import torch
torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY = "compile_error"
emb = torch.nn.Embedding(4, 8)

@torch.compile
def f(ids):
    return torch.relu(emb(ids + 1))

f(torch.tensor([0, 1, 2]))
"""


@pytest.mark.slow
def test_generated_ids_follow_the_arithmetic_before_the_embedding(tmp_path):
    """A real after_aot dump of ``relu(emb(ids + 1))`` (Inductor's C++ relu bug): PyTorch kept no
    data, and ids generated in [0, 4) make ``ids + 1`` index past the 4-row table. The pack's
    replay must meet the program's own failure, not an IndexError of its own making."""
    launcher = progs.make_dump(tmp_path / "prog", EMBEDDING_AFTER_ARITHMETIC, after="aot", level=2)
    result = _pack_in(launcher.parent.parent.parent.parent, tmp_path / "emb.tar.zst", source=launcher)
    assert result.inputs["absent"] == 2
    failure = result.failure
    assert failure["exception_type"].endswith("CppCompileError"), failure
    assert "IndexError" not in failure["message"]
    repro = reproarchive.load(result.archive)
    ids = repro.args[[tuple(a.shape) for a in repro.args].index((3,))]
    assert int(ids.min()) >= -1 and int(ids.max()) + 1 < 4  # ids + 1 is a row of the table


# ---------------------------------------------------------------------------------------------
# level 1: repro.py in the cwd, with the save_dir moved away


def test_level1_repro_py_after_folder_moved(tmp_path_factory, tmp_path):
    folder = tmp_path_factory.mktemp("lvl1")
    repro_py = progs.make_dump(folder, progs.dynamo_program("runtime_error"), after="dynamo", level=1)
    assert parse_dump_script(repro_py).save_dir == str(folder / "checkpoints")
    moved = tmp_path / "moved"
    shutil.move(str(folder), moved)  # the absolute save_dir in repro.py no longer exists

    result = _pack_in(tmp_path, tmp_path / "out.tar.zst", source="moved")
    assert result.script == (moved / "repro.py").resolve()
    assert result.inputs["real"] == 4
    assert result.failure["stage"] == "forward"
    assert "ReluRuntimeError" in result.failure["message"]
    repro = reproarchive.load(result.archive)
    assert "beside the script" in repro.records.source.content_store


# ---------------------------------------------------------------------------------------------
# discovery (no torch run needed: the scripts only have to look like PyTorch's)

_FAKE = """
import torch
def load_args(reader):
    buf0 = reader.storage(None, 16)
    reader.tensor(buf0, (4,))  # x
load_args._version = 0
if __name__ == '__main__':
    from torch._dynamo.repro.after_dynamo import run_repro
    run_repro(mod, load_args, accuracy=False, command='minify', save_dir=None, autocast=False, backend='eager')
"""


def _fake_launcher(root: Path, run: str, mtime: float) -> Path:
    p = root / "torch_compile_debug" / run / "minifier" / "minifier_launcher.py"
    p.parent.mkdir(parents=True)
    p.write_text(_FAKE)
    os.utime(p, (mtime, mtime))
    return p


def test_discovery_takes_newest_and_says_why(tmp_path):
    old = _fake_launcher(tmp_path, "run_1", 1_000_000)
    new = _fake_launcher(tmp_path / "sub", "run_2", 2_000_000)
    repro = tmp_path / "repro.py"
    repro.write_text(_FAKE.replace("after_dynamo", "after_aot"))
    os.utime(repro, (1_500_000, 1_500_000))
    (tmp_path / "repro_notes.py").write_text("print('not a repro')\n")

    found = discover(None, tmp_path)
    assert found.chosen == new.resolve()
    assert found.candidates == [new.resolve(), repro.resolve(), old.resolve()]
    assert "newest of 3" in found.reason and "modification time" in found.reason
    # a folder as SOURCE searches only there
    assert discover(tmp_path / "torch_compile_debug", tmp_path).chosen == old.resolve()
    # a file as SOURCE is taken as named
    assert discover("repro.py", tmp_path).chosen == repro.resolve()


def test_discovery_errors_exit_4(tmp_path):
    with pytest.raises(SourceError) as info:
        discover(None, tmp_path)
    assert info.value.exit_code == 4 and "no PyTorch repro dump found" in str(info.value)
    (tmp_path / "repro.py").write_text("print('hello')\n")
    with pytest.raises(SourceError, match="not a PyTorch repro dump"):
        discover("repro.py", tmp_path)
    with pytest.raises(SourceError, match="does not exist"):
        discover("nope.py", tmp_path)
    aoti = tmp_path / "aoti.py"
    aoti.write_text(_FAKE.replace("after_dynamo", "aoti"))
    with pytest.raises(SourceError, match="AOTInductor"):
        discover(aoti, tmp_path)


#: The lines PyTorch 2.13 writes (after_aot, minifier_launcher.py) for a graph whose ``cond``
#: branches it cannot print: no code for the subgraphs, so not Python at all.
_UNPRINTED_SUBGRAPHS = """
import torch
from torch.nn import *
class Repro(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.true_graph_0 = <lambda>()
        self.false_graph_0 = <lambda>()

    def forward(self, arg0_1):
        sum_1 = torch.ops.aten.sum.default(arg0_1)
        gt = torch.ops.aten.gt.Scalar(sum_1, 0);  sum_1 = None
        cond = torch.ops.higher_order.cond(gt, self.true_graph_0, self.false_graph_0, (arg0_1,))
        return (cond[0],)

def load_args(reader):
    buf0 = reader.storage(None, 512)
    reader.tensor(buf0, (8, 16), is_leaf=True)  # arg0_1
"""


def test_a_dump_without_its_subgraphs_code_says_so_and_names_the_routes_that_work(tmp_path):
    """``pack`` said "not valid Python (line 62): not a PyTorch repro dump" of PyTorch's own
    dump; ``capture --after aot`` stopped on it with an unexpected SyntaxError (exit 70)."""
    from reproarchive.sources.dump.scripts import holds_no_data

    dump = tmp_path / "minifier_launcher.py"
    dump.write_text(_UNPRINTED_SUBGRAPHS)
    result = invoke("pack", dump, "-o", tmp_path / "a.tar.zst")
    assert result.exit_code == 4 and result.output.count("\n") == 1, result.output
    assert "lacks the code of the subgraph true_graph_0 (line 7: self.true_graph_0 = <lambda>())" in result.output
    assert "reproarchive capture --" in result.output and "TORCH_TRACE" in result.output
    assert holds_no_data(dump)  # data-less, read by its lines: superseded by the door's archive
    dump.write_text(_UNPRINTED_SUBGRAPHS.replace("storage(None, 512)", "storage('a1b2', 512)"))
    assert not holds_no_data(dump)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["minifier_launcher.py"]


def test_run_repro_arguments_read_with_ast(tmp_path):
    p = tmp_path / "repro.py"
    p.write_text(_FAKE.replace("save_dir=None", "save_dir='/x/it''s, odd'").replace(
        "accuracy=False", "accuracy=True"))
    d = parse_dump_script(p)
    assert d.save_dir == "/x/its, odd"
    assert d.accuracy_mode == "accuracy" and d.backend == "eager" and d.kind == "after_dynamo"


# ---------------------------------------------------------------------------------------------
# module state PyTorch replaced by random data (NNModuleToString's output), in-process


class _DumpedRepro(torch.nn.Module):
    """What NNModuleToString writes for a graph that kept module state (older Dynamo configs,
    AOT constants): a submodule by constructor, a top-level parameter and a large buffer by
    torch.randn, a small buffer as a printed literal."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("_tensor_constant0", torch.randn([8], dtype=torch.float32))
        self.register_buffer("small", torch.tensor([1, 2], dtype=torch.int64))
        self.scale = torch.nn.Parameter(torch.randn([4], dtype=torch.float32))

    def forward(self, x, n):
        _tensor_constant0 = self._tensor_constant0
        y = self.lin(x) * self.scale + _tensor_constant0[:4]
        return (y.sum() + self.small.sum() * n,)


def test_random_module_state_is_lifted_to_absent_inputs(tmp_path):
    from reproarchive.sources.repro_module import lift_state, module_state_origin, trace_repro

    mod = _DumpedRepro()
    origin = module_state_origin(mod)
    assert origin == {"lin.weight": "defaults", "lin.bias": "defaults", "scale": "random",
                      "_tensor_constant0": "random", "small": "real"}
    gm, notes = trace_repro(mod)
    assert notes == []
    x = torch.randn(2, 4)
    gm2, inputs, lifted = lift_state(gm, origin, [x, 3])
    # lifted in the order the graph first uses them, ahead of the dump's own inputs (as Dynamo does)
    assert [d["attribute"] for d in lifted] == ["_tensor_constant0", "lin.weight", "lin.bias", "scale"]
    names = [n.target for n in gm2.graph.nodes if n.op == "placeholder"]
    assert names == ["state__tensor_constant0", "state_lin_weight", "state_lin_bias", "state_scale", "x", "n"]
    assert [type(a).__name__ for a in inputs[:4]] == ["AbsentTensor"] * 4
    assert inputs[4] is x and inputs[5] == 3
    # the real (printed, integer) buffer stays module state; nothing random does
    assert set(dict(gm2.named_buffers())) == {"small"} and not list(gm2.parameters())
    # same computation once the lifted values are fed back in
    state = [mod._tensor_constant0, mod.lin.weight, mod.lin.bias, mod.scale]
    assert torch.equal(gm2(*state, x, 3)[0], mod(x, 3)[0])

    path = reproarchive.pack(gm2, inputs, tmp_path / "s.tar.zst")
    with pytest.warns(UserWarning):
        repro = reproarchive.load(path)
    assert repro.fidelity == ["absent"] * 4 + ["real", "value"]


def test_pack_time_replay_generates_absent_inputs_like_load(tmp_path):
    """The failure recorded when packing a dump must be the one `run` sees later."""
    from reproarchive.sources.import_replay import _concrete

    g = fx.Graph()
    x, idx = g.placeholder("x"), g.placeholder("idx")
    g.output((g.call_function(operator.getitem, (x, idx)),))
    gm = fx.GraphModule(torch.nn.Module(), g)
    args = [torch.arange(20.0), reproarchive.AbsentTensor((3,), torch.int64)]
    path = reproarchive.pack(gm, args, tmp_path / "a.tar.zst")
    replayed, generated = _concrete(gm, args)
    loaded = reproarchive.load(path).args
    assert generated == 1 and torch.equal(replayed[1], loaded[1])


# ---------------------------------------------------------------------------------------------
# the contract of every source


class TestDumpSource(SourceTests):
    """``pack`` of an after_dynamo dump whose graph fails to compile (PyTorch's bug injector)."""

    source_record = DumpSource
    stage = "compile"

    @pytest.fixture(scope="module")
    def captured(self, dynamo_dump, tmp_path_factory) -> Captured:
        """Packed once for the whole run (``built_once``): the archive is read-only."""

        def build(root: Path) -> tuple[PackReport, Path]:
            work = _copy(dynamo_dump, root / "work")
            return _pack_in(work, root / "out.tar.zst"), work

        report, work = built_once(tmp_path_factory, "dump_import_source", build,
                                  dump=lambda v: [v[0].to_plain(), str(v[1])],
                                  load=lambda v: (PackReport.from_plain(v[0]), Path(v[1])))
        return Captured(archives=[report.archive], reports=[report], folders=(work, dynamo_dump))


@pytest.mark.slow  # a real Inductor CPU compile makes the dump
def test_a_dynamic_after_aot_dump_records_its_symbolic_sizes(tmp_path):
    """``load_args`` of a dynamic-shape after_aot dump writes sizes as symbols: the archive's
    shape policy says so (spec §8 shapes, ``recorded_from: dump``), and a replay with
    inductor's inner compiler compiles on those symbols (it said "not applied" and compiled
    static shapes)."""
    folder = tmp_path / "dump"
    progs.make_dump(folder, progs.aot_program("compile_error", dynamic=True), after="aot", level=2)
    result = _pack_in(folder, tmp_path / "out.tar.zst")
    shapes = reproarchive.inspect(result.archive).to_plain()["shapes"]
    assert shapes["recorded_from"] == "dump"
    dims = [d for r in shapes["inputs"] if r["kind"] == "tensor" for d in r["dims"]]
    assert any(d["kind"] == "backed" and d["expr"].startswith("s") for d in dims), shapes
    outcome = reproarchive.run(result.archive)
    assert outcome.status == "reproduced", outcome.to_dict()
    assert not [w for w in outcome.warnings if "shape" in w], outcome.warnings
    assert outcome.to_dict()["shapes"]["symbolic"] and not outcome.to_dict()["shapes"]["problems"]
