"""Config, environment and system snapshots: content, redaction, apply/restore and diffs."""

from __future__ import annotations

import importlib.metadata
import os
import re

import msgpack
import pytest
import torch
import torch._dynamo  # noqa: F401 - installs the dynamo config module
import torch._functorch.config  # noqa: F401
import torch._inductor.config as inductor_config

from reproarchive.context import config as snapshot
from reproarchive.context.config import applied_config, config_diff, config_snapshot, safe_to_apply
from reproarchive.context.environment import environment_diff, environment_snapshot
from reproarchive.context.redaction import redact_paths
from reproarchive.context.system import system_diff, system_snapshot
from reproarchive.format.plain import from_plain, to_plain

INJECT = "cpp.inject_relu_bug_TESTING_ONLY"


def msgpack_roundtrip(record):
    """The record as an archive stores and a reader gets it back."""
    return from_plain(type(record), msgpack.unpackb(msgpack.packb(to_plain(record)), strict_map_key=True))


def edited(record, edit):
    """A copy of ``record`` with ``edit`` applied to its plain form."""
    plain = to_plain(record)
    edit(plain)
    return from_plain(type(record), plain)


def _custom_pass(graph):  # a user's custom pass: code, so never storable
    return None


# ------------------------------------------------------------------------------------------
# config


def test_config_snapshot_records_every_module_in_full_as_plain_data():
    snap = config_snapshot()
    for mod in snapshot.CONFIG_MODULES:
        assert mod in snap.modules, mod
    inductor = snap.modules["torch._inductor.config"]
    # full values, defaults included, nested classes flattened with dotted keys
    assert inductor[INJECT] is None
    assert "triton.cudagraphs" in inductor
    assert len(inductor) > 100
    assert msgpack_roundtrip(snap) == snap
    # a tuple default is stored as a list with its container type recorded
    assert snap.types["torch._inductor.config"]["cpp.cxx"] == "tuple"
    assert inductor["cpp.cxx"] == list(inductor_config.cpp.cxx)


def test_changed_setting_shows_with_its_default():
    assert INJECT not in config_snapshot().changed.get("torch._inductor.config", {})
    with inductor_config.patch({INJECT: "accuracy", "max_autotune": True}):
        snap = config_snapshot()
    changed = snap.changed["torch._inductor.config"]
    assert changed[INJECT] == "accuracy"
    assert changed["max_autotune"] is True
    assert snap.defaults["torch._inductor.config"][INJECT] is None
    assert snap.modules["torch._inductor.config"][INJECT] == "accuracy"


def test_assigning_the_default_value_is_not_a_change():
    with inductor_config.patch({INJECT: None}):
        snap = config_snapshot()
    assert INJECT not in snap.changed.get("torch._inductor.config", {})


def test_custom_pass_is_listed_as_unrepresentable_never_dropped():
    with inductor_config.patch(post_grad_custom_post_pass=_custom_pass):
        snap = config_snapshot()
    entries = [u for u in snap.unrepresentable
               if (u.module, u.key) == ("torch._inductor.config", "post_grad_custom_post_pass")]
    assert len(entries) == 1
    entry = entries[0]
    assert "callable" in entry.reason and "_custom_pass" in entry.reason
    assert "_custom_pass" in entry.repr and " at 0x" not in entry.repr
    assert entry.changed is True
    assert "post_grad_custom_post_pass" not in snap.modules["torch._inductor.config"]
    assert msgpack_roundtrip(snap) == snap


def test_machine_specific_paths_are_flagged_and_redacted():
    home = os.path.expanduser("~")
    snap = config_snapshot()
    flagged = {(m.module, m.key) for m in snap.machine_specific}
    assert ("torch._dynamo.config", "debug_dir_root") in flagged
    for mod, key in flagged:
        value = str(snap.modules[mod][key])
        # the working folder as a path of its own, not as the prefix of a sibling's name
        assert not re.search(re.escape(os.getcwd()) + r"(/|$|')", value) or os.getcwd() == "/", value
        if home not in ("/", "~"):
            assert home + "/" not in value


def test_applied_config_applies_and_restores_exactly():
    with inductor_config.patch({INJECT: "runtime_error", "max_autotune": True}):
        recorded = msgpack_roundtrip(config_snapshot())
    before = inductor_config._is_default(INJECT), inductor_config._is_default("max_autotune")
    assert inductor_config.cpp.inject_relu_bug_TESTING_ONLY is None
    with applied_config(recorded) as result:
        assert inductor_config.cpp.inject_relu_bug_TESTING_ONLY == "runtime_error"
        assert inductor_config.max_autotune is True
        assert isinstance(inductor_config.cpp.cxx, tuple)  # container type restored
        assert f"torch._inductor.config.{INJECT}" in result.applied
        assert result.missing == []
    assert inductor_config.cpp.inject_relu_bug_TESTING_ONLY is None
    assert inductor_config.max_autotune is False
    # "not set by the user" comes back too, not merely the default value
    assert (inductor_config._is_default(INJECT), inductor_config._is_default("max_autotune")) == before
    assert config_snapshot().changed == config_snapshot().changed  # stable
    assert "torch._inductor.config" not in config_snapshot().changed


def test_applied_config_restores_after_an_exception_and_only_changed():
    with inductor_config.patch({INJECT: "compile_error"}):
        recorded = config_snapshot()
    with pytest.raises(RuntimeError):
        with applied_config(recorded, only_changed=True) as result:
            assert inductor_config.cpp.inject_relu_bug_TESTING_ONLY == "compile_error"
            assert result.applied == [f"torch._inductor.config.{INJECT}"]
            raise RuntimeError("boom")
    assert inductor_config.cpp.inject_relu_bug_TESTING_ONLY is None


def test_applied_config_skips_missing_and_never_touches_unrepresentable():
    with inductor_config.patch(post_grad_custom_post_pass=_custom_pass):
        recorded = config_snapshot()

    def add_unknown(plain):
        plain["modules"]["torch._inductor.config"]["no_such_setting_in_this_torch"] = 1
        plain["modules"]["torch._not_a_config_module"] = {"x": 1}
        plain["changed"]["torch._not_a_config_module"] = {"x": 1}
        plain["modules"]["torch._left_at_its_defaults"] = {"x": 1}  # nothing of it is lost: not said

    recorded = edited(recorded, add_unknown)

    def live_pass(graph):
        return None

    with inductor_config.patch(post_grad_custom_post_pass=live_pass):
        with applied_config(recorded) as result:
            assert inductor_config.post_grad_custom_post_pass is live_pass
        assert "torch._inductor.config.no_such_setting_in_this_torch" in result.missing
        assert "torch._not_a_config_module" in result.missing_modules
        assert "torch._left_at_its_defaults" not in result.missing_modules
        assert "torch._inductor.config.post_grad_custom_post_pass" in result.unrepresentable
        assert inductor_config.post_grad_custom_post_pass is live_pass


def test_config_diff_reports_changed_missing_and_unrepresentable():
    base = config_snapshot()
    with inductor_config.patch({INJECT: "accuracy", "post_grad_custom_post_pass": _custom_pass}):
        current = config_snapshot()
    base = edited(base, lambda plain: plain["modules"]["torch._inductor.config"].update(removed_in_this_torch=True))
    diff = {(d["module"], d["key"]): d for d in config_diff(base, current)}
    assert diff[("torch._inductor.config", INJECT)]["status"] == "differs"
    assert diff[("torch._inductor.config", INJECT)]["recorded"] is None
    assert diff[("torch._inductor.config", INJECT)]["current"] == "accuracy"
    assert diff[("torch._inductor.config", "removed_in_this_torch")]["status"] == "missing_here"
    assert diff[("torch._inductor.config", "post_grad_custom_post_pass")]["status"] == "unrepresentable"
    assert config_diff(base, base) == []


def test_backend_lists_in_config_are_applied():
    assert safe_to_apply("max_autotune_gemm_backends", "ATEN,CPP")
    assert not safe_to_apply("cpp.cxx", ["/bin/sh", "-c"])


# ------------------------------------------------------------------------------------------
# environment


def test_environment_selection_and_secret_redaction(monkeypatch, tmp_path):
    home = tmp_path / "home" / "ann"
    home.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    environ = {
        "TORCHINDUCTOR_CACHE_DIR": f"{home}/cache/inductor",
        "TORCH_HUB_TOKEN": "hf_abc123",
        "TRITON_API_KEY": "k",
        "NCCL_SECRET": "s",
        "torch_password": "p",
        "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR": "139869695953952",
        "OMP_NUM_THREADS": "4",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "MKL_NUM_THREADS": "2",
        "MY_DYNAMO_FLAG": "1",
        "PATH": "/usr/bin",
        "GITHUB_TOKEN": "ghp_x",
    }
    env = environment_snapshot(environ)
    v = env.variables
    assert v["TORCHINDUCTOR_CACHE_DIR"] == "~/cache/inductor"
    for name in ("TORCH_HUB_TOKEN", "TRITON_API_KEY", "NCCL_SECRET", "torch_password"):
        assert v[name] == "<redacted>" and name in env.redacted
    assert v["_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR"] == "<process-specific>"
    assert "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR" in env.redacted
    assert v["OMP_NUM_THREADS"] == "4" and v["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert v["MKL_NUM_THREADS"] == "2" and v["MY_DYNAMO_FLAG"] == "1"
    assert "PATH" not in v and "GITHUB_TOKEN" not in v  # not selected at all
    packed = msgpack.packb(to_plain(env))
    for secret in (b"hf_abc123", b"139869695953952", str(home).encode()):
        assert secret not in packed


def test_environment_snapshot_reads_os_environ(monkeypatch):
    monkeypatch.setenv("TORCH_REPROARCHIVE_TEST_VAR", "x")
    assert environment_snapshot().variables["TORCH_REPROARCHIVE_TEST_VAR"] == "x"


def test_redact_paths_respects_component_boundaries(monkeypatch, tmp_path):
    home = tmp_path / "ann"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    work = home / "proj"
    text = f"{home}/a {home}x/b {work}/c:{home}"
    out = redact_paths(text, {str(work): "<cwd>"})
    assert out == f"~/a {home}x/b <cwd>/c:~"
    assert redact_paths(f"see {tmp_path}/z", [tmp_path]) == "see <path>/z"


# ------------------------------------------------------------------------------------------
# system


def test_system_snapshot_content():
    system = system_snapshot()
    assert msgpack_roundtrip(system) == system
    assert system.torch.version == torch.__version__
    assert system.torch.git_version == torch.version.git_version
    assert system.python.version.count(".") == 2
    try:
        numpy_version = importlib.metadata.version("numpy")
    except importlib.metadata.PackageNotFoundError:  # torch does not require numpy
        numpy_version = None
    assert system.packages["numpy"] == numpy_version
    assert "triton" in system.packages  # None when absent, never missing
    assert system.cpu.count == os.cpu_count()
    if not torch.cuda.is_available():
        assert system.cuda.available is False
        assert system.cuda.reason
    else:  # pragma: no cover - GPU machines
        assert system.cuda.device_count == torch.cuda.device_count()
        assert system.cuda.devices[0].capability


def test_environment_diff_highlights_torch_and_gpu_changes():
    system = system_snapshot()
    env = environment_snapshot({"TORCH_LOGS": "+dynamo"})
    def older_machine(plain):
        plain["torch"]["version"] = "2.0.0"
        plain["torch"]["git_version"] = "0" * 40
        plain["cuda"] = {"available": True, "version": "12.4",
                         "devices": [{"name": "NVIDIA H100", "capability": "9.0"}]}
        plain["packages"]["numpy"] = "1.0.0"

    recorded = edited(system, older_machine)
    recorded_env = environment_snapshot({"TORCH_LOGS": "+inductor"})
    diff = system_diff(recorded, system) + environment_diff(recorded_env, env)
    whats = [d["what"] for d in diff]
    assert {"torch version", "torch git hash", "GPUs"} <= set(whats)
    system_rows = system_diff(recorded, system)
    important = [d for d in system_rows if d["important"]]
    assert system_rows[: len(important)] == important  # most consequential first
    assert any(d["what"] == "package numpy" and d["recorded"] == "1.0.0" for d in diff)
    assert any(d["what"] == "env TORCH_LOGS" for d in diff)
    assert system_diff(system, system) == [] and environment_diff(env, env) == []


def test_a_config_override_is_read_and_restored_whatever_torch_keeps_it_in():
    """torch 2.12 made a config entry's user override a ContextVar; earlier torches (2.11 on the
    GPU machines checked) keep a plain attribute, and replay applied config through ``.get()``."""
    import contextvars

    from reproarchive.context.config_apply import _set_user_override, _user_override

    class PlainEntry:  # what torch <= 2.11 has
        user_override = object()

    old = PlainEntry()
    _set_user_override(old, 3)
    assert _user_override(old) == 3 and old.user_override == 3

    class VarEntry:  # what torch >= 2.12 has
        user_override = contextvars.ContextVar("x", default=None)

    new = VarEntry()
    _set_user_override(new, 4)
    assert _user_override(new) == 4 and isinstance(new.user_override, contextvars.ContextVar)
