"""The exported script compiles a symbolic recording with its recorded shape policy, as ``run`` does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import reproarchive
from reproarchive.standalone.script import export
from support.symbolic_backends import FREE_SYMBOLS

TESTS = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # a child Python runs the script
@pytest.mark.usefixtures("fresh_dynamo")
def test_exported_script_keeps_symbolic_inputs_symbolic_and_its_guards(tmp_path):
    x, y = torch.randn(8, 3), torch.randn(8, 3)
    torch._dynamo.mark_dynamic(x, 0, min=2, max=64)
    compiled = torch.compile(lambda x, y: (x * 2).sum(0) + y.sum(0),
                             backend=reproarchive.capture(FREE_SYMBOLS, path=tmp_path / "a.tar.zst"))
    with pytest.raises(Exception, match="free symbols"):
        compiled(x, y)
    export(tmp_path / "a.tar.zst", tmp_path / "out")
    text = (tmp_path / "out" / "repro.py").read_text()
    bound = "\"2 <= L['x'].size()[0] and L['x'].size()[0] <= 64\""  # the mark's range: Dynamo's, at backend entry too
    assert f"RECORDED_GUARDS = ([{bound}], [{bound}])" in text

    env = {**os.environ, "PYTHONPATH": str(TESTS), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "repro.py", "--backend", "support.symbolic_backends:free_symbols_backend"],
                          cwd=tmp_path / "out", capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode != 0 and "symbolic graph: free symbols s77" in proc.stderr, proc.stderr[-2000:]
    assert "guards differ" not in proc.stderr
