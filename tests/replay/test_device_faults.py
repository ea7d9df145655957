"""A fault on the device is judged by its class, not by its code.

One out-of-bounds access surfaces as "an illegal memory access was encountered" (CUDA error
700) or "unspecified launch failure" (719), by where the kernel met it, raised as
``torch.AcceleratorError`` or a ``RuntimeError`` by torch, or by Triton as "Triton Error [CUDA]".
A replay that says 719 where the recording said 700 reproduced the fault; one that says
"device-side assert triggered" did not. The classes are read from the CUDA runtime's own words
(``cudaGetErrorString``), the replay of such a failure runs in a child (after a fault the
device fails every use in that process), and triage groups by the class.

This machine has no GPU: the faults here are raised by a compiler function with the exact text
torch raises them with, in a real compiled program, captured and replayed by the command line
as a user would. Capturing a fault of a real kernel needs a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import reproarchive
from reproarchive.context.failure import device_fault, failure_kind, same_failure, signature
from reproarchive.format.reader import ContainerReader
from reproarchive.format.schema import FailureRecord
from reproarchive.triage.grouping import signature_of
from support.cli import invoke
from support.job_archives import rank_one_faults

#: torch's words around a CUDA runtime error (c10/cuda/CUDAException, torch 2.8+)
_TAIL = ("\nCUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
         "might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
         "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")

FAULTS = '''import torch

_TAIL = {tail!r}


def _faulting(gm, message):
    def run(*args):
        gm(*args)
        raise torch.AcceleratorError(f"CUDA error: {{message}}{{_TAIL}}")
    return run


def illegal_address(gm, example_inputs):
    return _faulting(gm, "an illegal memory access was encountered")


def launch_failure(gm, example_inputs):
    return _faulting(gm, "unspecified launch failure")


def device_assert(gm, example_inputs):
    return _faulting(gm, "device-side assert triggered")
'''


@pytest.mark.parametrize("said, fault", [
    ("CUDA error: an illegal memory access was encountered", "illegal address"),
    ("CUDA error: unspecified launch failure", "illegal address"),
    ("CUDA error: misaligned address", "illegal address"),
    ("Triton Error [CUDA]: an illegal memory access was encountered", "illegal address"),
    ("HIP error: an illegal memory access was encountered", "illegal address"),
    ("CUDA error: device-side assert triggered", "device assert"),
    ("CUDA error: an illegal instruction was encountered", "illegal instruction"),
    ("CUDA error: too many resources requested for launch", "launch failure"),
    ("CUDA error: no kernel image is available for execution on the device", "launch failure"),
    ("CUDA error: out of memory", None),  # not a fault of a kernel
    ("index 9 is out of bounds for dimension 0 with size 8", None),
])
def test_a_fault_s_class_is_read_from_the_cuda_runtime_s_words(said, fault):
    for exc_type in ("torch.AcceleratorError", "RuntimeError"):
        assert device_fault(signature("forward", exc_type, said + _TAIL)) == fault
    assert device_fault(signature("compile", "RuntimeError", said)) is None  # a compile runs no kernel


def _record(stage: str, said: str) -> FailureRecord:
    return FailureRecord(stage=stage, exception_type="torch.AcceleratorError", message=said,
                         signature=signature(stage, "torch.AcceleratorError", said + _TAIL))


def test_one_fault_under_two_codes_is_one_failure_and_another_class_is_not():
    recorded = _record("forward", "CUDA error: an illegal memory access was encountered")
    assert same_failure(recorded, _record("forward", "CUDA error: unspecified launch failure"))
    # reported by the next call on the device: the backward's first sync
    assert same_failure(recorded, _record("backward", "CUDA error: an illegal memory access was encountered"))
    assert not same_failure(recorded, _record("forward", "CUDA error: device-side assert triggered"))
    assert not same_failure(recorded, _record("compile", "CUDA error: an illegal memory access was encountered"))
    assert failure_kind(recorded) == "device fault (illegal address, forward)"


@pytest.fixture
def faults(tmp_path, monkeypatch):
    """The folder holding ``faults.py`` (compiler functions that raise a device fault as torch
    does) and an archive of each fault, captured from a real compiled program."""
    (tmp_path / "faults.py").write_text(FAULTS.format(tail=_TAIL))
    monkeypatch.syspath_prepend(str(tmp_path))
    import faults as module

    archives = {}
    for name in ("illegal_address", "launch_failure", "device_assert"):
        torch._dynamo.reset()
        compiled = torch.compile(lambda x, i: torch.relu(x[i]) * 2,
                                 backend=reproarchive.capture(getattr(module, name), path=tmp_path / name))
        with pytest.raises(torch.AcceleratorError):
            compiled(torch.randn(8), torch.tensor([1, 2]))
        [archives[name]] = (tmp_path / name).glob("*.tar.zst")
    torch._dynamo.reset()
    sys.modules.pop("faults", None)
    return tmp_path, archives


def test_a_replay_is_judged_by_the_fault_s_class_in_a_child_and_triage_groups_by_it(faults):
    folder, archives = faults

    def run(archive, backend):
        done = subprocess.run([sys.executable, "-c", "from reproarchive.cli import main; main()", "run",
                               str(archive), "--backend", f"faults:{backend}", "--json"], cwd=folder,
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), *sys.path])})
        return done.returncode, json.loads(done.stdout)

    code, outcome = run(archives["illegal_address"], "launch_failure")  # 719 where 700 was recorded
    assert (code, outcome["status"], outcome["isolated"]) == (1, "reproduced", True), outcome
    assert outcome["kind"] == "device fault (illegal address, forward)"
    code, outcome = run(archives["illegal_address"], "device_assert")
    assert (code, outcome["status"], outcome["kind"]) == (3, "different failure",
                                                           "device fault (device assert, forward)"), outcome

    # the exported script judges by the class too (its bundled copy of the signature rule)
    assert invoke("export", archives["illegal_address"], "-o", folder / "script").exit_code == 0
    done = subprocess.run([sys.executable, str(folder / "script" / "repro.py"), "--backend", "faults:launch_failure"],
                          cwd=folder, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), *sys.path])})
    assert done.returncode == 1 and "reproduced: the recorded failure" in done.stdout + done.stderr, done.stderr[-2000:]

    def key(name):
        with ContainerReader(archives[name]) as reader:
            return signature_of(reader.index).key("failure")

    assert key("illegal_address") == key("launch_failure") == ("run", "device fault", "illegal address", "")
    assert key("device_assert") != key("illegal_address")


def test_a_device_fault_is_minified_with_each_faulting_candidate_in_a_worker_of_its_own(faults):
    """After a fault on the device every later use of it in the process fails with the same
    words, so a later candidate judged there would seem to reproduce the fault: the minifier
    judges these candidates in workers (as it does a crash), and retires a worker whose
    candidate faulted. The compiler function here faults on every graph, so every candidate
    faults: each retires its worker."""
    folder, archives = faults
    done = subprocess.run([sys.executable, "-c", "from reproarchive.cli import main; main()", "run", "--minify",
                           str(archives["illegal_address"]), "-o", str(folder / "min.tar.zst"),
                           "--backend", "faults:launch_failure", "--json"], cwd=folder, capture_output=True,
                          text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), *sys.path])})
    assert done.returncode == 0, done.stderr[-2000:]
    stats = json.loads(done.stdout)["stats"]
    assert stats["isolate"] is True and stats["calls"] >= 1, stats
    assert stats["workers_started"] == stats["jobs"] + 1 + stats["calls"], stats  # one spare, one per fault


@pytest.mark.slow
def test_a_job_s_device_fault_is_minified_in_a_job_launched_anew_after_each_fault(faults):
    """The job minifier judges candidates in one launched job, reused; after a candidate faulted
    a rank's device, that job's ranks would seem to reproduce every later candidate, so it is
    ended and the next candidate launches a new one."""
    folder, _ = faults
    job = rank_one_faults(folder, "faults:illegal_address")
    done = subprocess.run([sys.executable, "-c", "from reproarchive.cli import main; main()", "run", "--minify",
                           str(job), "-o", str(folder / "min-job.tar.zst"), "--backend", "faults:launch_failure",
                           "--timeout", "30", "--json"], cwd=folder, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), *sys.path]),
                               "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    stats = json.loads(done.stdout)["stats"]
    # the recording launch, then one launch per candidate judged (each faulted)
    assert stats["launches"] == stats["calls"] + 1, stats
