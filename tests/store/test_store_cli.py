"""The store on the command line (push, pull, ls, inspect, run), the capture backend's store=,
and the team flow of docs/stores.md run as written against a local S3 server."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import reproarchive
from support.cli import invoke

ROOT = Path(__file__).resolve().parents[2]


def test_push_ls_pull_inspect_run_on_the_command_line(tmp_path, archives, monkeypatch):
    a, b, c = archives
    monkeypatch.setenv("REPROARCHIVE_CACHE", str(tmp_path / "cache"))
    store = tmp_path / "store"
    result = invoke("push", a, b, c, store)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 3 and "(5 of 5 blobs were new)" in lines[0] and "(2 of 5 blobs were new)" in lines[1]
    names = [re.search(r" as \S+/(\S+) ", line).group(1) for line in lines]

    listing = invoke("ls", store)
    assert listing.exit_code == 0, listing.output
    out = listing.stdout
    assert out.count("[2 archives]") == 1 and out.count("[1 archive]") == 1  # grouped by failure
    assert "compile RuntimeError: boom" in out and "forward ValueError: bad shape" in out
    assert all(name in out for name in names) and "5 real / 0 absent" in out
    as_json = json.loads(invoke("ls", store, "--json").stdout)
    assert as_json["archives"] == 3 and len(as_json["groups"]) == 2

    pulled = invoke("pull", f"{store}/{names[2]}", "-o", tmp_path / "got.tar.zst", "--json")
    assert pulled.exit_code == 0, pulled.output
    assert (tmp_path / "got.tar.zst").read_bytes() == Path(c).read_bytes()
    assert json.loads(pulled.stdout)["digest"] == "sha256:" + hashlib.sha256(Path(c).read_bytes()).hexdigest()

    shown = invoke("inspect", f"{store}/{names[0]}")
    assert shown.exit_code == 0 and shown.stdout.startswith(f"{store}/{names[0]}")
    ran = invoke("run", f"{store}/{names[0]}", "--json")
    assert ran.exit_code == 0, ran.output  # eager passes: the recorded failure does not reproduce here
    assert json.loads(ran.stdout)["status"] == "passed"

    missing = invoke("pull", f"{store}/no-such-name", "--json")
    assert missing.exit_code == 4 and json.loads(missing.stdout)["exit_code"] == 4
    not_a_store = invoke("ls", tmp_path / "nowhere")
    assert not_a_store.exit_code == 4 and "does not exist; name a store" in not_a_store.stderr
    usage = invoke("push", a, b, store, "--name", "x")
    assert usage.exit_code == 2


def test_the_capture_backend_pushes_every_failure_it_archives(tmp_path, monkeypatch, caplog, fresh_dynamo):
    store = f"memory://capture-{os.getpid()}-{tmp_path.name}"
    monkeypatch.setenv("REPROARCHIVE_STORE", store)
    backend = reproarchive.capture("relu_compile_error_TESTING_ONLY", path=tmp_path / "repros")
    with pytest.raises(Exception, match="archive written to"):
        torch.compile(lambda x: torch.relu(x) + 1, backend=backend)(torch.randn(4))
    (written,) = backend.written
    (pushed,) = backend.pushed
    assert pushed.archive == written and pushed.store == store
    listing = reproarchive.list_store(store)
    assert [r["name"] for g in listing["groups"] for r in g["archives"]] == [pushed.name]

    # a store that cannot take it costs a log line, never the user's own error
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    torch._dynamo.reset()
    failing = reproarchive.capture("relu_compile_error_TESTING_ONLY", path=tmp_path / "more",
                                   store=str(blocker / "store"))
    with caplog.at_level(logging.WARNING, logger="reproarchive.capture"):
        with pytest.raises(Exception, match="archive written to"):
            torch.compile(lambda x: torch.relu(x) * 2, backend=failing)(torch.randn(4))
    assert failing.written and not failing.pushed
    assert any("could not push" in r.getMessage() for r in caplog.records)


def _flow_script(port: int) -> str:
    text = (ROOT / "docs" / "stores.md").read_text()
    block = text.split("<!-- store-flow -->", 1)[1].split("```bash\n", 1)[1].split("\n```", 1)[0]
    lines = [line for line in block.splitlines() if not line.startswith("pip install")]  # installed already
    return "\n".join(lines).replace("5055", str(port)) + "\n"


@pytest.mark.slow
def test_the_documented_team_flow_works_as_written(tmp_path):
    pytest.importorskip("moto.server")
    from support.s3server import free_port

    script = _flow_script(free_port())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "REPROARCHIVE_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["REPROARCHIVE_CACHE"] = str(tmp_path / "cache")
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=420)
    out = done.stdout
    assert done.returncode == 0, done.stdout + done.stderr
    assert out.count("failed: ") == 3
    assert "[2 archives]" in out and "[1 archive]" in out  # two failures of one kind, one of another
    assert "pulled bug.tar.zst" in out
    assert out.count("REPRODUCED (exit 1)") == 2, out
    # locally the third failure (same graph, shapes and signature as the first) overwrites the first
    # one's file, by design of the capture backend; the store keeps both as distinct archives
    assert len(list((tmp_path / "repros").glob("repro-*.tar.zst"))) == 2
