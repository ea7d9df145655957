"""The effect rule's verdict on every function of torch's public tensor surface, against a
reviewed table per torch release.

``support.effect_surface`` judges every public callable of torch's tensor namespaces, every
Tensor method a graph can call, and every dispatcher overload. Each refusal, with its reason, is
listed in ``effect_refusals/torch-<major.minor>.tsv`` beside this file, one table per torch
release, which a person has read: a torch (or a rule) that changes a verdict fails here and shows
which function moved and why. After reviewing the change, rewrite the running release's table
with ``REPROARCHIVE_WRITE_EFFECT_TABLE=1 pytest tests/codec/test_effect_surface.py`` and read its
``git diff`` (for a new release, against the newest table there is).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

TABLE = Path(__file__).with_name("effect_refusals") / f"torch-{'.'.join(torch.__version__.split('.')[:2])}.tsv"
ROOT = Path(__file__).resolve().parents[2]

#: Pure tensor functions of torch.nn.functional that torch.overrides does not list as
#: overridable, and that the rule once refused (a real model's call target).
ONCE_REFUSED = ("hardswish", "hardsigmoid", "sigmoid", "tanh", "upsample", "upsample_bilinear", "upsample_nearest",
                "scaled_mm", "grouped_mm", "scaled_grouped_mm")


@pytest.fixture(scope="module")
def verdicts() -> dict[str, str | None]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "support.effect_surface"], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300, check=True)
    return json.loads(done.stdout)


def _read_table() -> dict[str, str]:
    rows = {}
    for line in TABLE.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, reason = line.partition("\t")
            rows[name] = reason
    return rows


def _write_table(refused: dict[str, str]) -> None:
    lines = [f"# Every refusal of the effect rule over torch {torch.__version__}'s public tensor surface, reviewed.",
             "# name<TAB>reason; rewrite: REPROARCHIVE_WRITE_EFFECT_TABLE=1 pytest tests/codec/test_effect_surface.py"]
    lines += [f"{name}\t{reason}" for name, reason in sorted(refused.items())]
    TABLE.write_text("\n".join(lines) + "\n")


def test_every_refusal_over_the_public_surface_is_reviewed(verdicts):
    assert len(verdicts) > 5000, len(verdicts)  # torch 2.13 CPU: about 6,200 callables and overloads
    refused = {name: reason for name, reason in verdicts.items() if reason is not None}
    assert all("\t" not in r and "\n" not in r for r in refused.values())
    if os.environ.get("REPROARCHIVE_WRITE_EFFECT_TABLE"):
        _write_table(refused)
        pytest.skip(f"wrote {TABLE.name}: review its git diff")
    assert TABLE.exists(), f"no reviewed table for torch {torch.__version__}: write {TABLE.name} (see above)"
    reviewed = _read_table()
    changes = [f"newly refused: {n}: {refused[n]}" for n in sorted(refused.keys() - reviewed.keys())]
    changes += [f"newly allowed: {n} (was refused: {reviewed[n]})" for n in sorted(reviewed.keys() - refused.keys())
                if n in verdicts]
    changes += [f"gone from this torch: {n} (was refused: {reviewed[n]})"
                for n in sorted(reviewed.keys() - verdicts.keys())]
    changes += [f"reason changed: {n}: {reviewed[n]} -> {refused[n]}" for n in sorted(refused.keys() & reviewed.keys())
                if refused[n] != reviewed[n]]
    assert not changes, (f"{len(changes)} verdicts differ from the reviewed table {TABLE.name} "
                         f"(torch {torch.__version__}):\n" + "\n".join(changes[:60]))


def test_pure_tensor_functions_outside_the_overridable_list_are_allowed(verdicts):
    for name in ONCE_REFUSED:
        assert verdicts[f"torch.nn.functional.{name}"] is None, name


def test_the_surface_holds_every_namespace_and_the_dispatcher(verdicts):
    prefixes = ("torch.nn.functional.", "torch.linalg.", "torch.fft.", "torch.special.", "torch.Tensor.",
                "call_method Tensor.", "torch.ops.aten.", "torch.ops.prims.", "torch.ops.quantized.")
    for prefix in prefixes:
        assert any(name.startswith(prefix) for name in verdicts), prefix
    allowed = [n for n, r in verdicts.items() if r is None]
    assert len(allowed) > 4000, len(allowed)
