"""Grouping a fleet of archives by the multi-level signature."""

from __future__ import annotations

import time

import torch
import torch.fx as fx

import reproarchive
from reproarchive.format.reader import ContainerReader
from reproarchive.triage import grouping
from support import fleet_corpus


def _signatures(members):
    out = []
    for m in members:
        with ContainerReader(m.path) as reader:
            out.append((m.path, grouping.signature_of(reader.index)))
    return out


def test_corpus_of_five_bugs_groups_into_five_pure_groups(fleet):
    """200 archives, 5 bugs, 3 models, 8 machines (paths, line numbers, names), 16 shapes:
    five groups, none mixed; precision and recall 1 at the default level."""
    start = time.perf_counter()
    items = _signatures(fleet)
    elapsed = time.perf_counter() - start
    truth = {m.path: m.bug for m in fleet}
    found = grouping.group(items)
    scores = grouping.precision_recall(found.groups.values(), truth)
    print(f"\n{len(fleet)} archives signed in {elapsed:.2f} s; default level: {scores}")
    assert scores == {"precision": 1.0, "recall": 1.0, "groups": 5, "bugs": 5, "mixed_groups": 0}
    assert len({m.machine for m in fleet}) >= 6 and len({m.model for m in fleet}) == 3
    # the failing node was found where the failure names one
    targets = {truth[members[0]]: found.signatures[key].target for key, members in found.groups.items()}
    assert targets == {"relu-compile": None, "relu-runtime": "torch.relu", "relu-accuracy": None,
                       "no-sigmoid": "torch.sigmoid", "no-tanh": "torch.tanh"}
    # the levels: the failure level alone also separates these bugs; structure splits one bug by model
    assert grouping.precision_recall(grouping.group(items, "failure").groups.values(), truth)["precision"] == 1.0
    by_structure = grouping.precision_recall(grouping.group(items, "structure").groups.values(), truth)
    assert by_structure["precision"] == 1.0 and by_structure["groups"] > 5
    # the signature `run` judges by never merges two of these bugs either
    raw = {}
    for path, _ in items:
        with ContainerReader(path) as reader:
            raw.setdefault(reader.index.records.failure.signature, []).append(path)
    assert grouping.precision_recall(raw.values(), truth)["precision"] == 1.0


def _named(path, relu_name: str, message: str, exc_type: str = "RuntimeError"):
    g = fx.Graph()
    x = g.placeholder("inp")
    s = g.call_function(torch.sin, (x,))
    r = g.create_node("call_function", torch.relu, (s,), name=relu_name)
    c = g.call_function(torch.cos, (s,))
    g.output((r, c))
    failure = {"stage": "compile", "exception_type": exc_type, "message": message,
               "signature": f"compile|{exc_type}|{message}"}
    return reproarchive.pack(fx.GraphModule(torch.nn.Module(), g), [torch.ones(3)], path, backend="eager",
                             failure=failure, snapshot=False)


def _sign(path):
    with ContainerReader(path) as reader:
        return grouping.signature_of(reader.index)


def test_node_names_are_read_as_what_they_stand_for(tmp_path):
    """FX calls one node ``relu`` in one graph and ``relu_1`` in another: the message's masking
    reads ``relu`` and ``relu<n>``, the group signature reads the op both times; and a message
    that is the same for two ops is told apart by the node it names."""
    a = _sign(_named(tmp_path / "a.tar.zst", "relu", "cannot lower relu"))
    b = _sign(_named(tmp_path / "b.tar.zst", "relu_1", "cannot lower relu_1"))
    assert a.key() == b.key() and a.target == "torch.relu" and a.located_by == "message"
    c = _sign(_named(tmp_path / "c.tar.zst", "relu", "cannot lower cos"))
    assert c.key() != a.key() and c.target == "torch.cos"
    # an input's name is the user's: any input reads <input>
    d = _sign(_named(tmp_path / "d.tar.zst", "relu", "inp has the wrong stride"))
    assert d.message == "<input> has the wrong stride" and d.target is None


def test_grouping_reads_indexes_only_and_is_fast(fleet):
    """Signing is a few milliseconds per archive: thousands in seconds (index reads only)."""
    start = time.perf_counter()
    _signatures(fleet[:100])
    per = (time.perf_counter() - start) / 100
    assert per < 0.05, f"{per * 1000:.1f} ms per archive"
    assert fleet_corpus.BUGS == ("relu-compile", "relu-runtime", "relu-accuracy", "no-sigmoid", "no-tanh")
