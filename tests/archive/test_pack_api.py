"""``reproarchive.pack`` as a user calls it: snapshots by default, a failure given as the
exception itself, and the same redaction as every capture path."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

import reproarchive
from reproarchive.testing.machine_paths import machine_paths_in


def _graph():
    return torch.fx.symbolic_trace(lambda x: torch.relu(x) + 1)


def test_pack_records_this_process_by_default(tmp_path):
    path = reproarchive.pack(_graph(), [torch.randn(3)], tmp_path / "a.tar.zst", backend="eager")
    repro = reproarchive.load(path)
    assert repro.records.config.modules["torch._inductor.config"]  # the torch config of this process
    assert repro.records.system.torch.version == torch.__version__
    assert repro.records.environment is not None
    assert machine_paths_in(path, tmp_path, os.getcwd()) == []

    bare = reproarchive.pack(_graph(), [torch.randn(3)], tmp_path / "b.tar.zst", snapshot=False)
    index = reproarchive.load(bare)
    assert index.records.config is None and index.records.system is None and index.records.environment is None


def test_pack_takes_the_exception_itself(tmp_path):
    try:
        raise RuntimeError(f"boom in {tmp_path}/kernel.cpp")
    except RuntimeError as err:
        path = reproarchive.pack(_graph(), [torch.randn(3)], tmp_path / "a.tar.zst", failure=err,
                                 failure_stage="forward", backend="eager")
    failure = reproarchive.load(path).records.failure
    assert failure.stage == "forward" and failure.exception_type == "RuntimeError"
    assert failure.signature == "forward|RuntimeError|boom in <path>"
    assert "test_pack_takes_the_exception_itself" in failure.traceback  # the real traceback
    assert str(tmp_path) not in failure.message + failure.traceback
    with pytest.raises(ValueError):
        reproarchive.pack(_graph(), [torch.randn(3)], tmp_path / "c.tar.zst", failure=RuntimeError("x"),
                          failure_stage="later")


def test_a_failing_json_command_prints_an_error_object(tmp_path):
    import json

    from support.cli import invoke

    result = invoke("inspect", "--json", tmp_path / "missing.tar.zst")
    document = json.loads(result.stdout)
    assert result.exit_code == 4 and document["exit_code"] == 4
    assert document["error"]["exit_code"] == 4 and "missing.tar.zst" in document["error"]["message"]


def test_records_go_in_and_come_back_in_one_piece(tmp_path):
    from reproarchive.format.schema import CaptureSource, FailureRecord

    records = reproarchive.Records(backend="eager", accuracy=False, source=CaptureSource(stage="compile"),
                                   failure=FailureRecord(stage="compile", signature="compile|E|x"),
                                   metadata={"ticket": "T-1"})
    path = reproarchive.pack(_graph(), [torch.randn(3)], tmp_path / "a.tar.zst", records=records, snapshot=False)
    back = reproarchive.load(path).records
    assert back.created_by.reproarchive == reproarchive.__version__  # the writer's own
    assert back == dataclasses.replace(records, created_by=back.created_by)
    # a section given as a keyword wins over the same section in ``records``; the rest is metadata
    path = reproarchive.pack(_graph(), [torch.randn(3)], tmp_path / "b.tar.zst", records=records, snapshot=False,
                             backend="inductor", note="n")
    back = reproarchive.load(path).records
    assert back.backend == "inductor" and back.metadata == {"ticket": "T-1", "note": "n"}
    assert back.failure == records.failure
    with pytest.raises(reproarchive.errors.PackError, match="'sauce' is not a record section"):
        reproarchive.pack(_graph(), [torch.randn(3)], tmp_path / "c.tar.zst", records={"sauce": {}})


def test_a_write_that_fails_first_surfaces_its_own_error_and_leaves_no_file(tmp_path, monkeypatch):
    """The first member written (the graph's code) failing: its error reaches the caller, not
    one raised by the cleanup, and nothing is left at the target."""
    from reproarchive.format.layout import GRAPH_CODE_MEMBER
    from reproarchive.format.writer import ContainerWriter

    add_member = ContainerWriter.add_member

    def full_disk(self, name, data, *args, **kwargs):
        if name == GRAPH_CODE_MEMBER:
            raise OSError(28, "No space left on device")
        return add_member(self, name, data, *args, **kwargs)

    monkeypatch.setattr(ContainerWriter, "add_member", full_disk)
    gm = torch.fx.symbolic_trace(torch.nn.ReLU())
    with pytest.raises(OSError, match="No space left"):
        reproarchive.pack(gm, [torch.randn(3)], tmp_path / "r.tar.zst")
    assert list(tmp_path.iterdir()) == []
