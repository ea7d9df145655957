"""TORCH_TRACE logs from other machines and other torch versions.

A real log is made here (an Inductor compile error in a graph that calls a custom op the job
defined), then edited as a log of another job would differ: its ``fx_graph_runnable`` sets a
config key this torch does not have and loads a library that is not on this machine, whose
operator ``foo::bar`` the graph calls. ``pack`` must still write an archive that verifies, and
its replay must say which ops were stand-ins and which settings were not applied; a log with a
corrupted line still packs every compile it can, saying so once.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import reproarchive
from reproarchive.replay.outcome import REPRODUCED
from support.custom_op_programs import twice_library

pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:.*(stand-in|generated|no data).*:UserWarning")]

JOB = twice_library("mylib") + """
torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY = "compile_error"

def f(a):
    return torch.relu(torch.ops.mylib.twice(a) + 1).sum(0)

torch.compile(f, backend="inductor")(torch.randn(3, 4))
"""


@pytest.fixture(scope="module")
def job_log(tmp_path_factory) -> Path:
    """The TORCH_TRACE log of one real failing job (a custom op, Inductor's C++ relu bug)."""
    folder = tmp_path_factory.mktemp("foreign_job")
    (folder / "job.py").write_text(JOB)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHDYNAMO_REPRO", "TORCH_COMPILE_DEBUG",
                                                                    "TORCH_TRACE", "TORCH_LOGS"))}
    env["TORCH_TRACE"] = str(folder / "trace")
    proc = subprocess.run([sys.executable, "job.py"], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0, proc.stderr[-2000:]
    (log,) = (folder / "trace").glob("*.log")
    return log


def edited(log: Path, out: Path, edit_payload) -> Path:
    """``log`` with each payload passed through ``edit_payload(kind, text)`` and its MD5 redone,
    as another job's log would be written."""
    lines = log.read_text().splitlines()
    result, i = [], 0
    while i < len(lines):
        head = lines[i]
        i += 1
        payload = []
        while i < len(lines) and lines[i].startswith("\t"):
            payload.append(lines[i][1:])
            i += 1
        if '"has_payload"' not in head:
            result.append(head)
            continue
        kind = m.group(1) if (m := re.search(r'"name": "(\w+)"', head)) else head
        text = edit_payload(kind, "\n".join(payload))
        md5 = hashlib.md5(text.encode()).hexdigest()
        result.append(re.sub(r'"has_payload": "[0-9a-f]+"', f'"has_payload": "{md5}"', head))
        result.extend("\t" + ln for ln in text.split("\n"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(result) + "\n")
    return out


def another_machines_job(kind: str, text: str) -> str:
    text = text.replace("torch.ops.mylib.twice.default", "torch.ops.foo.bar.default")
    if kind == "fx_graph_runnable":
        text = text.replace("import torch._inductor.config\n",
                            "import torch._inductor.config\n"
                            "torch.ops.load_library('/nonexistent/libfoo.so')\n"
                            "torch._inductor.config.a_key_of_another_torch = 3\n", 1)
    return text


def test_log_from_another_machine_and_torch_packs_and_replays(job_log, tmp_path):
    log = edited(job_log, tmp_path / "trace" / job_log.name, another_machines_job)
    result = reproarchive.pack_trace(log.parent, tmp_path / "out")
    (packed,) = result.packed
    reproarchive.verify(packed.archive)
    warned = " ".join(packed.warnings)
    assert "a_key_of_another_torch" in warned and "libfoo.so" in warned and "foo::bar.default" in warned

    from reproarchive.format.reader import ContainerReader

    with ContainerReader(packed.archive) as reader:
        index = reader.index
    (op,) = index.custom_ops
    assert op.name == "foo::bar.default" and op.schema == "foo::bar(Tensor a0) -> Tensor"
    assert op.provenance.library == "libfoo.so" and not op.provenance.digest
    assert [index.storages[t.storage].fidelity for t in op.tensors()] == ["absent"]
    assert ("torch._inductor.config", "a_key_of_another_torch") in {
        (u.module, u.key) for u in index.records.config.unrepresentable}

    outcome = reproarchive.run(packed.archive, isolate=False)
    assert outcome.status == REPRODUCED, outcome.to_dict()
    assert outcome.stand_ins == ["foo::bar.default"]
    assert any("GENERATED outputs" in w for w in outcome.warnings)
    assert any(d["name"] == "torch._inductor.config.a_key_of_another_torch" and d["important"]
               for d in outcome.differences), outcome.differences


def test_log_with_a_corrupted_line_packs_what_it_can(job_log, tmp_path):
    lines = job_log.read_text().splitlines()
    broken = next(i for i, ln in enumerate(lines) if '"describe_tensor"' in ln)
    lines[broken] = lines[broken][: len(lines[broken]) // 2]  # a truncated JSON envelope
    log = tmp_path / "trace" / job_log.name
    log.parent.mkdir()
    log.write_text("\n".join(lines) + "\n")
    result = reproarchive.pack_trace(log.parent, tmp_path / "out", replay=False)
    (packed,) = result.packed
    reproarchive.verify(packed.archive)
    problems = [w for w in result.warnings if "not valid JSON" in w]
    assert len(problems) == 1, result.warnings


def test_log_whose_graph_lines_are_corrupted_ends_with_one_error_line(job_log, tmp_path):
    from support.cli import invoke

    lines = job_log.read_text().splitlines()
    lines = [ln[: len(ln) // 2] if not ln.startswith("\t") and ('"fx_graph_runnable"' in ln
                                                                 or '"dynamo_output_graph"' in ln) else ln
             for ln in lines]
    log = tmp_path / "trace" / job_log.name
    log.parent.mkdir()
    log.write_text("\n".join(lines) + "\n")
    result = invoke("pack", log.parent, "-o", tmp_path / "out")
    said = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 4 and len(said) == 1, result.output
    assert said[0].startswith("error: ") and "not valid JSON" in said[0]
