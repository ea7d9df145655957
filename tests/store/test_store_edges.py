"""Rough edges of the store found by trying it as a new user would: the two
digests, URLs of no known kind, a missing bucket, missing credentials, and an output file
that is already there."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import reproarchive
from reproarchive.store import objects
from support import s3server
from support.cli import invoke


def _sha256(path) -> str:
    return "sha256:" + hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_each_digest_is_labelled_and_a_reference_takes_either(tmp_path, archives, monkeypatch):
    a, b, _ = archives
    monkeypatch.setenv("REPROARCHIVE_CACHE", str(tmp_path / "cache"))
    store = tmp_path / "store"
    pushed = json.loads(invoke("push", a, b, store, "--json").stdout)["pushed"]
    first = pushed[0]
    assert first["file_digest"] == first["digest"] == _sha256(a)
    index = json.loads(invoke("inspect", a, "--json").stdout)["index_digest"]
    assert first["index_digest"] == index != first["file_digest"]
    rows = [r for g in json.loads(invoke("ls", store, "--json").stdout)["groups"] for r in g["archives"]]
    assert ({(r["file_digest"], r["index_digest"]) for r in rows}
            == {(p["file_digest"], p["index_digest"]) for p in pushed})

    # what people read: each printed digest says which one it is
    assert f"index {index[:19]}..." in invoke("inspect", a).stdout
    assert f"index {index[:19]}..." in invoke("verify", a, "-q").stdout
    assert f"file {first['digest'][:19]}..." in invoke("push", a, store).stdout
    assert f"index {index[:19]}..." in invoke("diff", a, b).stdout

    # ... and either one, copied as printed, names the archive
    for copied in (f"index {index[:19]}...", index[:19], index.split(":")[1][:10], f"file {first['digest'][:19]}..."):
        out = tmp_path / "pulled" / f"{len(copied)}-{copied[:4]}.tar.zst"
        result = invoke("pull", f"{store}/{copied}", "-o", out)
        assert result.exit_code == 0, (copied, result.output)
        assert out.read_bytes() == Path(a).read_bytes()
    shown = json.loads(invoke("inspect", f"{store}/{index[:19]}", "--json").stdout)
    assert shown["store"]["archive"] == first["digest"]
    wrong_kind = invoke("pull", f"{store}/file {index[:19]}", "-o", tmp_path / "x.tar.zst")
    assert wrong_kind.exit_code == 4 and "whose file digest starts with" in wrong_kind.stderr


def test_a_ref_written_before_refs_kept_the_index_digest_still_resolves_by_it(tmp_path, archives):
    a = archives[0]
    store = tmp_path / "store"
    name = reproarchive.push(a, store)[0].name
    ref_path = store / objects.ref_key(name)
    plain = json.loads(ref_path.read_text())
    del plain["summary"]["index_digest"]
    ref_path.write_text(json.dumps(plain))
    index = reproarchive.inspect(a).digest
    assert reproarchive.pull(f"{store}/{index[:16]}", tmp_path / "out.tar.zst").digest == _sha256(a)


@pytest.mark.parametrize("args", [("ls", "nosuch://bucket/x"), ("pull", "nosuch://bucket/x/name"),
                                  ("push", "ARCHIVE", "nosuch://bucket/x")])
def test_a_url_of_no_known_kind_is_a_usage_error(args, archives):
    result = invoke(*[archives[0] if a == "ARCHIVE" else a for a in args], "--json")
    assert result.exit_code == 2, result.output
    assert "nosuch:// is not a kind of store reproarchive knows" in result.stderr
    assert json.loads(result.stdout)["exit_code"] == 2


def test_a_missing_bucket_is_named_as_such(s3_endpoint, archives):
    for args in (("ls", "s3://no-such-bucket-0/repros"), ("pull", "s3://no-such-bucket-0/repros/name"),
                 ("push", archives[0], "s3://no-such-bucket-0/repros")):
        result = invoke(*args)
        assert result.exit_code == 4, result.output
        assert "the bucket 'no-such-bucket-0' does not exist" in result.stderr, result.stderr
        assert "marker" not in result.stderr


@pytest.mark.slow
def test_missing_credentials_name_the_variables(s3_endpoint, tmp_path):
    """In a process of its own: s3fs caches clients, and this one must find no credentials."""
    s3server.make_bucket("no-credentials")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ENDPOINT_URL=s3_endpoint, AWS_EC2_METADATA_DISABLED="true",
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"))
    result = subprocess.run([str(Path(sys.executable).parent / "reproarchive"), "ls", "s3://no-credentials/repros"],
                            check=False, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 5, result.stderr
    assert "no usable credentials" in result.stderr
    assert "AWS_ACCESS_KEY_ID" in result.stderr and "AWS_ENDPOINT_URL" in result.stderr


def test_pull_does_not_overwrite_another_file(tmp_path, archives):
    a, b, _ = archives
    store = tmp_path / "store"
    name = reproarchive.push(a, store)[0].name
    out = tmp_path / "out.tar.zst"
    out.write_bytes(Path(b).read_bytes())
    refused = invoke("pull", f"{store}/{name}", "-o", out, "--json")
    assert (refused.exit_code == 4 and "already exists and is not the archive" in refused.stderr
            and "--force" in refused.stderr)
    assert out.read_bytes() == Path(b).read_bytes()

    assert invoke("pull", f"{store}/{name}", "-o", out, "--force").exit_code == 0
    assert out.read_bytes() == Path(a).read_bytes()
    again = invoke("pull", f"{store}/{name}", "-o", out, "--json")  # the same archive: nothing to do
    assert again.exit_code == 0 and json.loads(again.stdout)["downloaded_bytes"] == 0


def test_an_s3_api_without_conditional_writes_still_takes_pushes(s3_store, archives, monkeypatch, tmp_path):
    """Some S3 APIs answer a conditional PUT with 501: ``create`` falls back to a lookup and a
    write (and says it is no longer atomic), so a push still succeeds."""
    import errno

    from reproarchive.store.location import FsspecStore

    store = FsspecStore(s3_store)
    plain_pipe = store.fs.pipe_file

    def no_conditional_writes(path, data, mode="overwrite", **kwargs):
        if mode == "create":
            raise OSError(errno.ENOSYS, "NotImplemented")
        return plain_pipe(path, data, **kwargs)

    monkeypatch.setattr(store.fs, "pipe_file", no_conditional_writes)
    assert store.atomic_create
    result = reproarchive.push(archives[0], store)[0]
    assert not store.atomic_create and result.uploaded_blobs == result.blobs
    assert store.create("refs/x", b"1") is True and store.create("refs/x", b"2") is False
    pulled = reproarchive.pull(f"{s3_store}/{result.name}", tmp_path / "out.tar.zst")
    assert pulled.path.read_bytes() == Path(archives[0]).read_bytes()
