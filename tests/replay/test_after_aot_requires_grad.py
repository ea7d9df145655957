"""An after_aot graph whose inputs require grad replays as AOTAutograd ran it: grad mode off.

AOTAutograd runs its compiled halves inside an autograd.Function, with grad mode off, so the
inputs' ``requires_grad`` (recorded faithfully: primals of a training graph) never met
inductor's ``out=`` kernels. A replay with grad on failed with a different error ("addmm():
functions with out=... arguments don't support automatic differentiation") instead of
reproducing. Made from a real level-3 dump (one real Inductor CPU compile per step).
"""

from __future__ import annotations

import reproarchive
from reproarchive.replay.outcome import REPRODUCED
from reproarchive.sources.dump.pack_dump import pack_dump
from support import dump_programs as progs
from support.cli import invoke
from support.isolated import run_isolated


def test_after_aot_dump_with_requires_grad_inputs_reproduces_in_run_and_export(tmp_path):
    folder = tmp_path / "dump"
    progs.make_dump(folder, progs.aot_grad_program("runtime_error"), after="aot", level=3)
    archive = tmp_path / "aot.tar.zst"
    pack_dump(folder, archive)
    repro = reproarchive.load(archive)
    assert repro.records.graph_kind == "after_aot" and "addmm" in repro.gm.code
    assert all(a.requires_grad for a in repro.args)
    assert repro.records.failure.message == "unhandled error", repro.records.failure

    outcome = reproarchive.run(archive)
    assert outcome.status == REPRODUCED, outcome.observed
    assert not outcome.ran_backward

    result = invoke("export", archive, "-o", tmp_path / "out")
    assert result.exit_code == 0, result.output
    [(failed, detail)] = run_isolated(tmp_path / "out" / "repro.py", [], cwd=tmp_path)
    assert failed == "reproduced" and "unhandled error" in detail and "addmm" not in detail.splitlines()[0], detail
