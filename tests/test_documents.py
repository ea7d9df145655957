"""Every command's ``--json`` document has the shape spec/json/reports.schema.json declares,
on success and on failure, and that file is the one the records derive (``reproarchive.documents``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import pytest
import torch

import reproarchive
from reproarchive import documents
from support.cli import invoke


def _validator(command: str) -> jsonschema.Draft202012Validator:
    schema = json.loads(documents.SCHEMA_FILE.read_text())
    return jsonschema.Draft202012Validator({"$ref": f"#/$defs/command.{command}", "$defs": schema["$defs"]})


def test_the_schema_file_is_what_the_records_declare():
    assert documents.SCHEMA_FILE.read_text() == documents.schema_text(), \
        "run `python -m reproarchive.spec_files --write`"
    jsonschema.Draft202012Validator.check_schema(json.loads(documents.SCHEMA_FILE.read_text()))


def test_a_document_that_lost_a_key_is_refused():
    """The schema is strict enough to fail: a report without its digest, or with a key it does
    not declare, does not validate."""
    ok = {"valid": True, "path": "a", "format": "1.1", "digest": "sha256:00", "members": 3, "blobs": 1,
          "uncompressed_bytes": 10, "file_bytes": 20, "not_replayable_here": [], "index_digest": "sha256:00",
          "randomness": "no random ops"}
    validator = _validator("verify")
    validator.validate(ok)
    for bad in ({k: v for k, v in ok.items() if k != "digest"}, {**ok, "surprise": 1}, {**ok, "blobs": "1"}):
        assert not validator.is_valid(bad)


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> Path:
    """A real compile failure: capture around PyTorch's relu compile-error injector (no inductor)."""
    import torch._dynamo

    path = tmp_path_factory.mktemp("docs") / "repro.tar.zst"
    torch._dynamo.reset()
    backend = reproarchive.capture("relu_compile_error_TESTING_ONLY", path=path)
    with pytest.raises(Exception, match="archive written to"):
        torch.compile(lambda x: torch.relu(x + 1) * 2, backend=backend)(torch.randn(8))
    torch._dynamo.reset()
    return path


def _trace_log(folder: Path) -> Path:
    """A TORCH_TRACE log cut off inside its first compile (what a killed process leaves)."""
    folder.mkdir()
    (folder / "dedicated_log_torch_trace_rank_0_x.log").write_text(
        'V1126 08:00:00.000000 4242 torch/_dynamo/convert_frame.py:1000] {"str": ["/tmp/prog.py", 0]}\n'
        'V1126 08:00:00.000100 4242 torch/_dynamo/convert_frame.py:1001] {"dynamo_start": {"stack": '
        '[{"line": 5, "name": "f", "filename": 0}]}, "frame_id": 0, "frame_compile_id": 0, "attempt": 0}\n')
    return folder


def test_every_command_prints_a_declared_document(captured, tmp_path, monkeypatch):
    monkeypatch.setenv("REPROARCHIVE_CACHE", str(tmp_path / "cache"))
    other = tmp_path / "other.tar.zst"
    reproarchive.pack(torch.fx.symbolic_trace(torch.nn.ReLU()), [torch.ones(3)], other, backend="eager")
    missing = tmp_path / "missing.tar.zst"
    store = tmp_path / "store"
    assert invoke("push", captured, store).exit_code == 0
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    cases = [
        ("inspect", ["inspect", captured], 0), ("inspect", ["inspect", "--graph", captured], 0),
        ("inspect", ["inspect", missing], 4),
        ("verify", ["verify", captured], 0), ("verify", ["verify", missing], 4),
        ("doctor", ["doctor", captured], 0), ("doctor", ["doctor", missing], 4),
        ("diff", ["diff", captured, other], 1), ("diff", ["diff", captured, missing], 4),
        ("run", ["run", "--no-isolate", captured], 1), ("run", ["run", captured, "--backend", "no_such"], 125),
        ("run", ["run", "--minify", captured, "-o", tmp_path / "min.tar.zst"], 0),
        ("minify", ["minify", other, "-o", tmp_path / "min2.tar.zst"], 2),
        ("export", ["export", captured, "-o", tmp_path / "bug"], 0),
        ("export", ["export", captured, "-o", tmp_path / "full"], 4),
        ("ls", ["ls", store], 0), ("ls", ["ls", _trace_log(tmp_path / "trace")], 0),
        ("ls", ["ls", tmp_path / "nowhere"], 4),
        ("fsck", ["fsck", store], 0), ("fsck", ["fsck", tmp_path / "nowhere"], 4),
        ("bisect.compiler", ["bisect", "compiler", captured, "--max-time", "0.000001"], 3),
        ("bisect.compiler", ["bisect", "compiler", missing], 4),
        ("bisect.torch", ["bisect", "torch", missing, "--env", sys.executable], 4),
        ("triage", ["triage", store, "--group-only"], 0), ("triage", ["triage", tmp_path / "nowhere"], 4),
    ]
    for command, argv, code in cases:
        result = invoke(*argv, "--json")
        assert result.exit_code == code, (argv, result.output)
        document = json.loads(result.stdout)
        errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
                  for e in _validator(command).iter_errors(document)]
        assert not errors, (argv, errors[:5])
        assert ("error" in document) == (code not in (0, 1, 3)), argv  # 3: a report (not reproduced, no culprit)
