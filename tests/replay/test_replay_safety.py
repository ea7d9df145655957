"""What an archive may *not* make a replay do: import modules, choose programs, set loaders.

A replay applies the archive's backend, config and environment, and the archive may come from
anyone; each of the three is an input that could otherwise run code of the archive's choosing.
"""

from __future__ import annotations

import operator
import sys

import pytest
import torch
import torch.fx as fx
from click.testing import CliRunner

import reproarchive
from reproarchive.cli import main
from reproarchive.context.config import applied_config, config_snapshot
from reproarchive.context.environment import child_environment, plan
from reproarchive.format.plain import from_plain, to_plain
from reproarchive.format.schema import ConfigRecord, EnvironmentRecord

MARKER_MODULE = "reproarchive_marker_for_tests"


@pytest.fixture
def marker_module(tmp_path, monkeypatch):
    """A module that leaves a file behind if anything imports it."""
    marker = tmp_path / "imported"
    (tmp_path / f"{MARKER_MODULE}.py").write_text(
        f"open({str(marker)!r}, 'w').write('x')\n"
        "def compile(gm, example_inputs):\n    return gm.forward\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, MARKER_MODULE, raising=False)
    return marker


def small_archive(path, **records):
    g = fx.Graph()
    x = g.placeholder("x")
    g.output((g.call_function(operator.add, (x, x)),))
    gm = fx.GraphModule(torch.nn.Module(), g)
    failure = {"stage": "compile", "exception_type": "RuntimeError", "message": "boom", "traceback": "",
               "signature": "compile|RuntimeError|boom", "backend": None, "accuracy": None}
    records.setdefault("failure", failure)
    return reproarchive.pack(gm, [torch.ones(2)], path, **records)


def test_recorded_custom_backend_is_not_imported_without_consent(tmp_path, marker_module):
    path = small_archive(tmp_path / "a.tar.zst", backend=f"{MARKER_MODULE}:compile")
    refused = CliRunner().invoke(main, ["run", str(path)])
    assert refused.exit_code == 125 and "--backend" in refused.output
    assert not marker_module.exists()
    allowed = CliRunner().invoke(main, ["run", str(path), "--backend", f"{MARKER_MODULE}:compile"])
    assert allowed.exit_code == 0, allowed.output  # add compiles and runs: passed
    assert marker_module.exists()


def test_recorded_config_never_imports_modules_or_sets_programs(marker_module):
    import torch._inductor.config as inductor_config

    plain = to_plain(config_snapshot())
    plain["modules"][MARKER_MODULE] = {"anything": 1}
    plain["changed"][MARKER_MODULE] = {"anything": 1}  # changed from its defaults: said as not applied
    plain["modules"]["torch._inductor.config"]["cpp.cxx"] = ["/bin/sh", "-c", "touch /tmp/pwned"]
    plain["changed"].setdefault("torch._inductor.config", {})["cpp.cxx"] = ["/bin/sh", "-c", "touch /tmp/pwned"]
    plain["modules"]["torch._inductor.config"]["cpp.inject_relu_bug_TESTING_ONLY"] = "compile_error"
    record = from_plain(ConfigRecord, plain)
    before = inductor_config.cpp.cxx
    with applied_config(record) as result:
        assert inductor_config.cpp.cxx == before
        assert inductor_config.cpp.inject_relu_bug_TESTING_ONLY == "compile_error"
    assert "torch._inductor.config.cpp.cxx" in result.unsafe
    assert MARKER_MODULE in result.missing_modules
    assert not marker_module.exists()
    assert inductor_config.cpp.inject_relu_bug_TESTING_ONLY is None


def test_recorded_environment_cannot_set_loaders_or_compilers(monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_FREEZING", raising=False)
    env = EnvironmentRecord(variables={"LD_PRELOAD": "/tmp/evil.so", "PYTHONPATH": "/tmp", "CXX": "sh",
                                       "TORCHINDUCTOR_FREEZING": "1", "TORCH_LOGS": "x;rm -rf /",
                                       "TORCHINDUCTOR_CXX_FLAGS": "-O0"})
    to_set, warnings = plan(env, config_applied=True)
    assert to_set == {"TORCHINDUCTOR_FREEZING": "1"}
    assert any("LD_PRELOAD" in w and "CXX" in w for w in warnings)
    child = child_environment(env)
    assert child.get("LD_PRELOAD") != "/tmp/evil.so" and child.get("TORCHINDUCTOR_FREEZING") == "1"
