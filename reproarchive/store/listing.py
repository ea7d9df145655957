"""``ls STORE``: the archives of a store, grouped by failure signature.

A triager wants distinct bugs, not files: twenty archives of one failure are one group. The
listing reads the refs alone (one listing and one batch of small reads), whatever the size of
the archives; what a ref says about its archive is informative, and an unreadable or hostile
ref is reported and skipped, never trusted.
"""

from __future__ import annotations

import dataclasses
import os

from reproarchive.errors import ArchiveError
from reproarchive.store import objects
from reproarchive.store.pull import open_store

NO_FAILURE = "(no failure recorded)"


def list_store(url: str | os.PathLike, *, storage_options: dict | None = None) -> dict:
    """``{"store", "archives", "groups": [{"signature", "failure", "archives": [row...]}], "warnings"}``;
    groups hold the most recent push first, rows likewise."""
    store = open_store(url, storage_options)
    warnings: list[str] = []
    keys = []
    for key in store.list("refs"):
        name = key.rsplit("/", 1)[1]
        if objects.NAME_RE.match(name):
            keys.append(key)
        else:
            warnings.append(f"ignored {key[:120]!r}: not a valid archive name")
    rows = []
    for key, data in sorted(store.read_many(keys).items()):
        name = key.rsplit("/", 1)[1]
        if isinstance(data, BaseException):
            warnings.append(f"ref {name!r} could not be read: {type(data).__name__}: {str(data)[:120]}")
            continue
        try:
            ref = objects.decode_ref(name, data)
        except ArchiveError as err:
            warnings.append(str(err))
            continue
        rows.append(_row(ref))
    groups: dict[str, dict] = {}
    for row in sorted(rows, key=lambda r: r["pushed"], reverse=True):
        signature = row["failure"]["signature"] if row["failure"] else NO_FAILURE
        group = groups.setdefault(signature, {"signature": signature, "failure": row["failure"], "archives": []})
        group["archives"].append(row)
    return {"store": store.url, "archives": len(rows), "groups": list(groups.values()), "warnings": warnings}


def _row(ref: objects.Ref) -> dict:
    s = ref.summary
    return {
        "name": ref.name,
        "digest": ref.archive,  # the file's, as push and pull print it
        "file_digest": ref.archive,
        "index_digest": s.index_digest,  # as inspect, verify and diff print it (None: pushed before refs kept it)
        "pushed": ref.pushed,
        "failure": None if s.failure is None else dataclasses.asdict(s.failure),
        "backend": s.backend,
        "ops": s.ops,
        "inputs": {"real": s.inputs_real, "absent": s.inputs_absent, "values": s.inputs_values},
        "bytes_logical": s.bytes_logical,
        "bytes_stored": ref.size,
        "torch": s.torch,
    }
