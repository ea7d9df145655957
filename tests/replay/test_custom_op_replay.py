"""Custom ops as data (spec §8 ``custom_ops``): a graph calling an op of a library the replaying process does
not have replays from the op's recorded outputs (a stand-in), or with the real op the user
brings (``--import``); the minifier keeps the op where it is the culprit and cuts it where it is
not; an archive can never make a replay import or load what it names."""

from __future__ import annotations

import importlib
import itertools
import sys

import pytest
import torch

import reproarchive
from reproarchive.codec import custom_ops as co
from reproarchive.codec.recorded_calls import record_calls
from reproarchive.errors import UnsafeArchiveError
from reproarchive.replay.outcome import REPRODUCED
from support.captures import capture_failure

pytestmark = [pytest.mark.usefixtures("fresh_dynamo"),
              pytest.mark.filterwarnings("ignore:.*(stand-in|not the original data).*:UserWarning")]

_ids = itertools.count()
LIB = '''
import torch

@torch.library.custom_op("{ns}::scale", mutates_args=())
def scale(x: torch.Tensor, alpha: float) -> torch.Tensor:
    return x * alpha + 1

@scale.register_fake
def _(x, alpha):
    return torch.empty_like(x)
'''


@pytest.fixture
def op_library(tmp_path, monkeypatch):
    """A module defining a fresh custom op ``<ns>::scale``; ``forget()`` unregisters it, as on a
    machine that does not have the library."""
    ns = f"ratest{next(_ids)}_{tmp_path.name[-6:].replace('-', '_')}"
    name = f"{ns}_lib"
    (tmp_path / f"{name}.py").write_text(LIB.format(ns=ns))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)

    class Library:
        namespace, module_name = ns, name
        op_name = f"{ns}::scale.default"

        @staticmethod
        def forget():
            from torch._library.custom_ops import OPDEFS

            sys.modules[name].scale._lib._destroy()
            OPDEFS.pop(f"{ns}::scale", None)
            del sys.modules[name]

    yield Library
    sys.modules.pop(name, None)
    del module


def program(ns):
    def f(x):
        y = getattr(torch.ops, ns).scale(x, 2.0)
        return torch.relu(y - 3.0) * 2
    return f


def index_of(path):
    from reproarchive.format.reader import ContainerReader

    with ContainerReader(path) as reader:
        return reader.index


def targets(path) -> list[str]:
    return [n.target for n in index_of(path).graph.nodes if n.op == "call_function"]


def test_python_custom_op_recorded_replayed_with_and_without_its_library(op_library, tmp_path):
    x = torch.linspace(-3, 3, 12)
    path = capture_failure(tmp_path / "co.tar.zst", program(op_library.namespace), [x],
                           "relu_compile_error_TESTING_ONLY")
    (record,) = index_of(path).custom_ops
    assert record.name == op_library.op_name and record.fake
    assert record.schema == f"{op_library.namespace}::scale(Tensor x, float alpha) -> Tensor"
    assert record.provenance.kind == "python" and record.provenance.module == op_library.module_name
    assert record.provenance.digest.startswith("sha256:")
    (call,) = record.calls
    assert call.arguments[0] == co.tensor_key(x) and call.arguments[1] == 2.0
    op_library.forget()

    real = reproarchive.run(path, reproarchive.ReplaySettings(imports=(op_library.module_name,)), isolate=False)
    assert real.status == REPRODUCED and real.stand_ins == [], real.to_dict()
    brought = reproarchive.ReplaySettings(backend="eager", imports=(op_library.module_name,))
    passed = reproarchive.run(path, brought, isolate=False)
    assert (passed.status, passed.exit_code, passed.unfaithful) == ("passed", 0, []), passed.to_dict()
    op_library.forget()

    stood_in = reproarchive.run(path, isolate=False)
    assert stood_in.status == REPRODUCED, stood_in.to_dict()
    assert stood_in.stand_ins == [op_library.op_name]
    assert any("stand-in" in w for w in stood_in.warnings)

    # a pass with the op stood in is no evidence the bug is gone (its code never ran): 125, and
    # the verdict says which op (with the real op brought, the same pass was a pass, above)
    eager = reproarchive.ReplaySettings(backend="eager")
    unproven = reproarchive.run(path, eager, isolate=False)
    assert (unproven.status, unproven.exit_code) == ("inconclusive", 125), unproven.to_dict()
    assert any(op_library.op_name in why and "stood in" in why for why in unproven.unfaithful), unproven.unfaithful


def test_custom_op_not_the_culprit_minify_cuts_it(op_library, tmp_path):
    """The relu is the culprit: the custom op is cut, its recorded (real) output an input."""
    path = capture_failure(tmp_path / "co.tar.zst", program(op_library.namespace), [torch.linspace(-3, 3, 12)],
                           "relu_compile_error_TESTING_ONLY")
    op_library.forget()
    report = reproarchive.minify_archive(path, tmp_path / "min.tar.zst", isolate=False, shrink_inputs=False)
    assert targets(report.output) == ["torch.relu"], report.code
    assert all(entry["real"] for entry in report.stats["inputs"]), report.stats["inputs"]
    assert index_of(report.output).custom_ops is None


def test_custom_op_is_the_culprit_minify_keeps_it(op_library, tmp_path):
    backend = "support.custom_op_backends:fails_on_custom_op"
    from support.custom_op_backends import fails_on_custom_op

    path = capture_failure(tmp_path / "co.tar.zst", program(op_library.namespace), [torch.randn(8)],
                           fails_on_custom_op)
    op_library.forget()
    settings = reproarchive.ReplaySettings(backend=backend)
    outcome = reproarchive.run(path, settings, isolate=False)
    assert outcome.status == REPRODUCED and outcome.stand_ins == [op_library.op_name], outcome.to_dict()
    report = reproarchive.minify_archive(path, tmp_path / "min.tar.zst", settings, isolate=False)
    assert targets(report.output) == [f"torch.ops.{op_library.namespace}.scale"], report.code
    (record,) = index_of(report.output).custom_ops
    assert record.name == op_library.op_name and len(record.calls) == 1
    again = reproarchive.run(report.output, settings, isolate=False)
    assert again.status == REPRODUCED and again.stand_ins == [op_library.op_name]


def test_stand_in_refuses_inputs_it_has_no_record_of(op_library, tmp_path):
    path = capture_failure(tmp_path / "co.tar.zst", program(op_library.namespace), [torch.ones(4)],
                           "relu_compile_error_TESTING_ONLY")
    op_library.forget()
    repro = reproarchive.load(path)
    assert repro.stand_ins == [op_library.op_name]
    op = getattr(torch.ops, op_library.namespace).scale
    assert torch.equal(op(torch.ones(4), 2.0), torch.full((4,), 3.0))  # the recorded output
    with pytest.raises(RuntimeError, match="no call with these inputs was recorded"):
        op(torch.zeros(4), 2.0)


# -- hostile archives --------------------------------------------------------------------------


def _archive_with_record(op_library, tmp_path, **changes):
    """An archive whose custom-op record says what an attacker wants, packed while the op exists."""
    import dataclasses

    from support.custom_op_backends import fails_on_custom_op

    gm = torch.fx.symbolic_trace(program(op_library.namespace))
    x = torch.ones(4)
    (live,) = record_calls(gm, [x])
    live.record = dataclasses.replace(live.record, **changes)
    path = tmp_path / "hostile.tar.zst"
    with pytest.raises(RuntimeError) as failed:
        fails_on_custom_op(gm, [x])
    reproarchive.pack(gm, [x], path, backend="support.custom_op_backends:fails_on_custom_op", failure=failed.value,
                      custom_ops=[live], snapshot=False)
    op_library.forget()
    return path


def test_archive_cannot_make_replay_import_or_load_what_it_names(op_library, tmp_path, monkeypatch):
    from reproarchive.format.schema import OpProvenance

    marker = tmp_path / "imported"
    (tmp_path / "evil_module.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    path = _archive_with_record(op_library, tmp_path, provenance=OpProvenance(
        kind="library", module="evil_module", library=str(tmp_path / "evil.so"), digest="sha256:" + "0" * 64))
    loaded = list(getattr(torch.ops, "loaded_libraries", ()))
    settings = reproarchive.ReplaySettings(backend="support.custom_op_backends:fails_on_custom_op")
    outcome = reproarchive.run(path, settings, isolate=False)
    assert outcome.status == REPRODUCED and outcome.stand_ins == [op_library.op_name], outcome.to_dict()
    reproarchive.minify_archive(path, tmp_path / "min.tar.zst", settings, isolate=False)
    report = reproarchive.export(path, tmp_path / "export")
    script = (tmp_path / "export" / "repro.py").read_text()
    assert "evil" not in script and "load_library(" not in script.split("def _custom_ops")[1].split("\n\n")[0]
    assert report.script
    assert not marker.exists() and "evil_module" not in sys.modules
    assert list(getattr(torch.ops, "loaded_libraries", ())) == loaded


@pytest.mark.parametrize("schema, why", [
    ("{ns}::scale(Tensor(a!) x, float alpha) -> Tensor(a!)", "writes or aliases"),
    ("{ns}::scale(Tensor x, str path) -> Tensor", "string argument"),
    ("{ns}::other(Tensor x, float alpha) -> Tensor", "its schema names"),
    ("{ns}::scale(Tensor x, float alpha -> Tensor", "does not parse"),
])
def test_schema_a_stand_in_cannot_honour_is_refused(op_library, tmp_path, schema, why):
    path = _archive_with_record(op_library, tmp_path, schema=schema.format(ns=op_library.namespace))
    with pytest.raises(UnsafeArchiveError, match=why):
        reproarchive.load(path)


def test_stand_in_never_goes_into_torchs_own_namespace():
    from reproarchive.codec.stand_ins import install
    from reproarchive.format.schema import CustomOpRecord

    with pytest.raises(UnsafeArchiveError, match="torch's own"):
        install([CustomOpRecord(name="aten::not_an_aten_op.default",
                                schema="aten::not_an_aten_op(Tensor x) -> Tensor")])
    with pytest.raises(UnsafeArchiveError, match="torch's own or not a plain name"):  # torch.ops.load_library
        install([CustomOpRecord(name="load_library::x.default", schema="load_library::x(Tensor a) -> Tensor")])
    with pytest.raises(UnsafeArchiveError, match="plain ns::op.overload"):
        install([CustomOpRecord(name="os::system.default; import os", schema="x")])


def test_doctor_lists_missing_and_changed_custom_ops(op_library, tmp_path):
    path = capture_failure(tmp_path / "co.tar.zst", program(op_library.namespace), [torch.ones(4)],
                           "relu_compile_error_TESTING_ONLY")
    assert reproarchive.doctor(path).differences == ()  # the same op is registered here
    op_library.forget()
    (missing,) = reproarchive.doctor(path).differences
    assert missing["what"] == "custom op" and missing["important"] and "not registered here" in missing["current"]
    # the library changed: the same op, another source
    changed = tmp_path / f"{op_library.module_name}.py"
    changed.write_text(changed.read_text().replace("x * alpha + 1", "x * alpha + 1.0"))
    (row,) = reproarchive.doctor(path, imports=(op_library.module_name,)).differences
    assert row["name"] == op_library.op_name and "another implementation here" in row["current"], row


def test_recording_the_calls_changes_nothing_of_the_program(op_library):
    """The run that records a graph's custom-op calls puts the generators back and stops before the
    graph's first collective: a capture in a rank of a job never issues one (its peers would meet
    it in place of the program's next), so only the calls before it are recorded."""
    from torch.utils._python_dispatch import TorchDispatchMode

    op = getattr(torch.ops, op_library.namespace).scale
    c10d = torch.ops._c10d_functional

    def f(x):
        y = op(x + torch.rand_like(x), 2.0)
        z = c10d.wait_tensor(c10d.all_reduce(y, "sum", "0"))
        return op(z, 3.0)

    class Issued(TorchDispatchMode):
        seen: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(str(func))
            return func(*args, **(kwargs or {}))

    gm = torch.fx.symbolic_trace(f)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    with Issued() as issued:
        (live,) = record_calls(gm, [torch.ones(4)])
    assert torch.equal(torch.get_rng_state(), before)
    assert not [name for name in issued.seen if "c10d" in name]
    assert [call.arguments[1] for call in live.calls] == [2.0]  # the call after the collective: not run


def test_a_jobs_custom_op_records_are_judged_as_one_graphs_are(op_library, tmp_path):
    """A job archive's custom ops go through the same stand-in rules when its ranks are loaded
    and when it is exported: the module it names is never imported, and a schema a stand-in
    cannot honour is refused in one line (before, a job's loader never looked at them)."""
    import dataclasses

    from reproarchive.format.schema import OpProvenance, RankOutcome, RankRecord
    from support.cli import invoke

    marker = tmp_path / "imported"
    (tmp_path / "evil_module.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    gm = torch.fx.symbolic_trace(program(op_library.namespace))

    def job(path, **changes):
        ranks = []
        for r in range(2):
            x = torch.full((4,), float(r))
            (live,) = record_calls(gm, [x])
            live.record = dataclasses.replace(live.record, **changes)
            ranks.append(reproarchive.RankCapture(gm, [x], RankRecord(rank=r, outcome=RankOutcome(status="passed")),
                                                  custom_ops=[live]))
        return reproarchive.pack_job(ranks, path, world_size=2, backend="gloo")

    named = job(tmp_path / "named.tar.zst", provenance=OpProvenance(kind="python", module="evil_module"))
    refused = job(tmp_path / "refused.tar.zst",
                  schema=f"{op_library.namespace}::scale(Tensor(a!) x, float alpha) -> Tensor(a!)")
    op_library.forget()
    loaded = reproarchive.load_job(named)
    assert [r.stand_ins for r in loaded.ranks] == [[op_library.op_name]] * 2
    assert invoke("export", named, "-o", tmp_path / "export").exit_code == 0
    assert "evil" not in (tmp_path / "export" / "repro.py").read_text()
    assert not marker.exists() and "evil_module" not in sys.modules
    with pytest.raises(UnsafeArchiveError, match="writes or aliases"):
        reproarchive.load_job(refused)
    result = invoke("export", refused, "-o", tmp_path / "refused-export")
    assert result.exit_code != 0 and "writes or aliases" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "refused-export").exists()
