"""Build the invalid vectors of spec/FORMAT.md §5.2: one archive per reader rule, each broken in
exactly that rule and otherwise valid (frames, index digest, footer and seek table agree).

    python spec/vectors/make_invalid.py

Every file starts from the golden vector ``basic-<version>.tar.zst`` of the current version and is
re-assembled by the hostile corpus' ``assemble`` (tests/support/hostile_corpus.py), so the
defect under test is the only one. ``invalid/manifest.json`` maps each file to the rule id a
reader MUST name and the error code it MUST raise (``verify``, which checks every rule);
``limits``, where given, are reader caps to apply first (two rules are about caps whose
defaults would need files of megabytes). ``python -m reproarchive.spec_files`` checks or writes
them with every generated file (``check``, ``write``).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zstandard

from reproarchive.format.layout import LAYOUT_MEMBER, layout_member_bytes, tar_header
from reproarchive.format.schema import FORMAT_VERSION

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tests"))  # the hostile corpus' assembler, run as a script too
from support.hostile_corpus import assemble, parse, rebuild  # noqa: E402 (needs the path above)

OUT = HERE / "invalid"
BASE = HERE / f"basic-{FORMAT_VERSION}.tar.zst"


def _node(index: dict, name: str) -> dict:
    return next(n for n in index["graph"]["nodes"] if n["name"] == name)


def _edit(fn: Callable[[dict], Any]) -> Callable:
    return lambda p, valid: rebuild(p, fn)


def _patch(offset_from_end: int, value: int) -> Callable:
    def build(p, valid: bytes) -> bytes:
        data = bytearray(valid)
        data[len(data) - offset_from_end] = value
        return bytes(data)
    return build


def _raw_index(raw: bytes) -> Callable:
    return lambda p, valid: assemble(p.members, None, index_bytes=raw, frame_size=p.frame_size)


def _frame(which: Callable[[Any], int], compressed: Callable[[Any], bytes]) -> Callable:
    return lambda p, valid: rebuild(p, compressed={which(p): compressed(p)})


def _first_blob_frame(p) -> int:
    name = next(n for n, _ in p.members if n.startswith("blobs/"))
    return p.member_frames[name][0]


def _first_blob(p) -> bytes:
    return next(d for n, d in p.members if n.startswith("blobs/"))


def _set(path: tuple, value: Any) -> Callable[[dict], None]:
    def fn(index: dict) -> None:
        target = index
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = value
    return fn


_FRAME = {"file": "./model.py", "line": 3, "name": "forward", "code": "return x.relu()"}


def _stack(frame: dict, index: int = 0) -> Callable[[dict], None]:
    """The graph gets one stack of ``frame``, and its ``relu`` node the stack at ``index``."""
    def fn(index_map: dict) -> None:
        index_map["graph"]["stacks"] = [[frame]]
        _node(index_map, "relu")["stack"] = index
    return fn


def _job(**change) -> dict:
    """A valid two-rank job record (§8, 1.3) with ``change`` applied."""
    return {"world_size": 2, "primary_rank": 0, "groups": [{"name": "0", "ranks": [0, 1]}],
            "ranks": [{"rank": 0}, {"rank": 1}], **change}


def _size(of: int, dim: int) -> dict:
    """(1.3) An input that is the size of input ``of`` at ``dim`` (§6.3 ``size``)."""
    return {"kind": "size", "input": of, "dim": dim, "expr": "s0"}


def _deep_graph(depth: int) -> dict:
    graph = {"nodes": [{"op": "output", "name": "output", "target": "output", "args": [None], "kwargs": {}}],
             "module_state": []}
    for _ in range(depth):
        graph = {"nodes": graph["nodes"], "module_state": [{"kind": "graph", "path": "g", "graph": graph}]}
    return graph


def _add_state(entry: dict) -> Callable[[dict], None]:
    return lambda index: index["graph"]["module_state"].append(entry)


def _swap_output(index: dict) -> None:
    out = _node(index, "output")
    index["graph"]["nodes"].append({**out, "name": "output_1"})


#: Rules no file can break alone, and why.
NOT_VECTORISED = {
    "R6.3-8": "implied by R5.1-2: values 33 deep take at least 66 msgpack levels, and the index allows 64",
}

#: (rule, file slug, expected error code, builder, reader limits or None)
CASES: list[tuple[str, str, str, Callable, dict | None]] = [
    ("R2.1-1", "tar-header", "E_CORRUPT", lambda p, valid: rebuild(p, headers={"graph.py": _other_header(p)}), None),
    ("R2.2-1", "layout-member", "E_CORRUPT",
     lambda p, valid: rebuild(p, edit_members=lambda ms: [(n, layout_member_bytes(1, 0) if n == LAYOUT_MEMBER else d)
                                                         for n, d in ms]), None),
    ("R5-1", "truncated", "E_TRUNCATED", lambda p, valid: valid[: len(valid) // 2], None),
    ("R5-2", "seek-descriptor", "E_CORRUPT", _patch(5, 1), None),
    ("R5-3", "major-2", "E_VERSION", lambda p, valid: rebuild(p, major=2), None),
    ("R5-4", "gap-before-footer", "E_CORRUPT",
     lambda p, valid: valid[: p.footer_start] + bytes(7) + valid[p.footer_start:], None),
    ("R5-5", "index-digest", "E_CORRUPT", lambda p, valid: _flip_index_sha(p, valid), None),
    ("R5-6", "format-name", "E_SCHEMA", _edit(_set(("format",), "zip")), None),
    ("R5-7", "frame-size", "E_SCHEMA", _edit(_set(("container", "frame_size"), 1024)), None),
    ("R5-7", "member-name", "E_UNSAFE",
     lambda p, valid: rebuild(p, edit_members=lambda ms: [("Graph.py" if n == "graph.py" else n, d) for n, d in ms]),
     None),
    ("R5-8", "tiny-frame", "E_CORRUPT", _frame(_first_blob_frame, lambda p: b"\x28\xb5\x2f\xfd\x00\x00\x00\x00"), None),
    ("R5-9", "node-cap", "E_LIMIT", _edit(lambda i: None), {"max_nodes": 10}),
    ("R5-10", "member-too-long", "E_CORRUPT",
     _frame(_first_blob_frame, lambda p: zstandard.ZstdCompressor(write_checksum=True).compress(_first_blob(p) + b"x")),
     None),
    ("R5.1-1", "extension-type", "E_SCHEMA", _raw_index(b"\x81\xa1a\xd4\x01\x00"), None),
    ("R5.1-2", "depth", "E_SCHEMA", _raw_index(b"\x91" * 70 + b"\xc0"), None),
    ("R5.1-3", "trailing", "E_SCHEMA", _raw_index(b"\x80\xc0"), None),
    ("R5.1-4", "bomb", "E_SCHEMA", _raw_index(b"\xdd\xff\xff\xff\xff\xc0"), None),
    ("R5.1-5", "memory", "E_LIMIT", _raw_index(b"\xdc\x01\x00" + b"\x90" * 256), {"max_index_memory": 4096}),
    ("R5.1-6", "invalid-byte", "E_SCHEMA", _raw_index(b"\x81\xa1a\xc1"), None),
    ("R5.1-7", "uint64", "E_SCHEMA", _edit(_set(("metadata",), {"big": (1 << 64) - 1})), None),
    ("R6-1", "field-type", "E_SCHEMA", _edit(_set(("storages", 0, "size"), "96")), None),
    ("R6.1-1", "digest-algorithm", "E_SCHEMA", _edit(_set(("digest_algorithm",), "md5")), None),
    ("R6.1-3", "blob-bytes", "E_DIGEST",
     lambda p, valid: rebuild(p, edit_members=lambda ms: [(n, bytes(len(d)) if n.startswith("blobs/") else d)
                                                         for n, d in ms]), None),
    ("R6.1-2", "parent-digest", "E_SCHEMA", _edit(_set(("parent",), "sha256:xyz")), None),
    ("R6.2-1", "storage-size", "E_SCHEMA", _edit(_set(("storages", 2, "size"), -1)), None),
    ("R6.2-2", "storage-device", "E_SCHEMA", _edit(_set(("storages", 0, "device"), "CUDA 0")), None),
    ("R6.2-3", "storage-fidelity", "E_SCHEMA", _edit(_set(("storages", 0, "fidelity"), "fake")), None),
    ("R6.2-4", "storage-blob", "E_SCHEMA", _edit(_set(("storages", 0, "digest"), "sha256:" + "0" * 64)), None),
    ("R6.2-5", "storage-total", "E_LIMIT",
     _edit(lambda i: i["storages"].append({"size": 1 << 43, "device": "cpu", "fidelity": "absent"})), None),
    ("R6.3-1", "tensor-storage", "E_SCHEMA", _edit(_set(("inputs", 0, "storage"), 99)), None),
    ("R6.3-2", "tensor-dtype", "E_SCHEMA", _edit(_set(("inputs", 0, "dtype"), "float7")), None),
    ("R6.3-3", "tensor-rank", "E_SCHEMA", _edit(_set(("inputs", 0, "stride"), [4])), None),
    ("R6.3-4", "tensor-fits", "E_SCHEMA", _edit(_set(("inputs", 0, "shape"), [30, 4])), None),
    ("R6.3-5", "tensor-grad", "E_SCHEMA", _edit(_set(("inputs", 2, "requires_grad"), False)), None),
    ("R6.3-6", "tensor-dynamic", "E_SCHEMA", _edit(_set(("inputs", 0, "dynamic"), [[5, "s0"]])), None),
    ("R6.3-7", "scalar-kind", "E_SCHEMA", _edit(_set(("inputs", 7, "value"), "three")), None),
    ("R6.3-9", "inputs-count", "E_SCHEMA", _edit(lambda i: i["inputs"].pop()), None),
    ("R6.3-10", "derived-input", "E_SCHEMA", _edit(_set(("inputs", 7), _size(99, 0))), None),
    ("R6.3-10", "derived-of-itself", "E_SCHEMA", _edit(_set(("inputs", 7), _size(7, 0))), None),
    ("R6.3-10", "derived-of-scalar", "E_SCHEMA", _edit(_set(("inputs", 7), _size(8, 0))), None),
    ("R6.3-10", "derived-dim", "E_SCHEMA", _edit(_set(("inputs", 7), _size(0, 2))), None),
    ("R6.3-10", "derived-negative-dim", "E_SCHEMA", _edit(_set(("inputs", 7), _size(0, -1))), None),
    ("R6.3-10", "derived-nested", "E_SCHEMA", _edit(_set(("inputs", 11, "items", 0), _size(0, 0))), None),
    # (1.7) a node's stack: a frame whose code holds a line break (FX would paste it into code), an index past the table
    ("R7.1-9", "stack-line-break", "E_UNSAFE", _edit(_stack({**_FRAME, "code": "x.relu()\rimport os"})), None),
    ("R7.1-9", "stack-index", "E_SCHEMA", _edit(_stack(_FRAME, index=1)), None),
    ("R7-1", "graph-depth", "E_SCHEMA", _edit(_set(("graph", "module_state"),
                                                     [{"kind": "graph", "path": "g", "graph": _deep_graph(9)}])), None),
    ("R7.1-1", "node-op", "E_SCHEMA", _edit(lambda i: _node(i, "relu").update(op="call_evil")), None),
    ("R7.1-2", "node-name", "E_SCHEMA", _edit(lambda i: _node(i, "relu").update(name="in0")), None),
    ("R7.1-3", "two-outputs", "E_SCHEMA", _edit(_swap_output), None),
    ("R7.1-4", "kwarg-name", "E_UNSAFE", _edit(lambda i: _node(i, "relu").update(kwargs={"a b": 1})), None),
    ("R7.1-5", "placeholder", "E_UNSAFE", _edit(lambda i: _node(i, "in0").update(target="x=__import__('os')")), None),
    ("R7.1-6", "function-name", "E_UNSAFE", _edit(lambda i: _node(i, "relu").update(target="torch.__dict__.load")),
     None),
    ("R7.1-7", "method-name", "E_UNSAFE",
     _edit(lambda i: next(n for n in i["graph"]["nodes"] if n["op"] == "call_method").update(target="sum()")), None),
    ("R7.1-8", "attribute", "E_SCHEMA",
     _edit(lambda i: _node(i, "relu").update(op="get_attr", target="missing", args=[])), None),
    ("R7.2-1", "arg-tag", "E_SCHEMA", _edit(lambda i: _node(i, "relu").update(args=[{"k": "pickle", "v": "x"}])),
     None),
    ("R7.2-2", "arg-ref", "E_SCHEMA", _edit(lambda i: _node(i, "relu").update(args=[{"k": "node", "v": "output"}])),
     None),
    ("R7.3-1", "call-target", "E_UNSAFE", _edit(lambda i: _node(i, "relu").update(target="torch.load")), None),
    ("R7.4-1", "state-path", "E_UNSAFE", _edit(_add_state({"kind": "module", "path": "__class__", "class":
                                                           "torch.nn.ReLU", "training": False, "attributes": {}})),
     None),
    ("R7.4-2", "state-module", "E_SCHEMA", _edit(_add_state({"kind": "module", "path": "m", "class": "torch.nn.ReLU",
                                                             "training": False, "attributes": {"__init__": 1}})), None),
    ("R8-1", "failure-stage", "E_SCHEMA", _edit(_set(("failure", "stage"), "exploded")), None),
    ("R8-2", "shape-policy", "E_SCHEMA", _edit(_set(("shapes",), {"recorded_from": "fake_tensors", "inputs": [
        {"input": 0, "kind": "tensor", "dims": [{"kind": "backed", "expr": "s0"}]}]})), None),
    # (1.6) a backend entered with more shape guards than the compile ended with
    ("R8-2", "shape-entry", "E_SCHEMA", _edit(_set(("shapes",), {"recorded_from": "fake_tensors", "entry": {
        "guards": [], "shape_guards": 2}, "shape_guards": ["s0 <= 64"]})), None),
    ("R8-3", "job-ranks", "E_SCHEMA", _edit(_set(("job",), _job(ranks=[{"rank": 0}, {"rank": 2}]))), None),
    ("R8-4", "job-groups", "E_SCHEMA", _edit(_set(("job",), _job(groups=[{"name": "0", "ranks": [0, 0]}]))), None),
    ("R8-5", "job-refs", "E_SCHEMA", _edit(_set(("job",), _job(ranks=[{"rank": 0}, {"rank": 1, "graph": 3}]))),
     None),
    # (1.5) a rank's own records: a set the job does not hold, and one whose RNG state is no storage
    ("R8-5", "job-records", "E_SCHEMA", _edit(_set(("job",), _job(ranks=[{"rank": 0}, {"rank": 1, "records": 1}],
                                                                  records=[{}]))), None),
    ("R8-6", "job-rank-rng", "E_SCHEMA", _edit(_set(("job",), _job(
        ranks=[{"rank": 0}, {"rank": 1, "records": 0}],
        records=[{"rng": {"random_ops": [], "generators": [{"device": "cpu", "storage": 99}]}}]))), None),
    ("R8-6", "rng-state", "E_SCHEMA",
     _edit(lambda i: i.update(rng={"random_ops": [], "generators": [{"device": "cpu", "storage": 99}]})), None),
    ("R8-7", "triton-digest", "E_SCHEMA", _edit(_set(("triton_kernels",), [
        {"index": 0, "name": "kernel", "source": "def kernel(x_ptr):\n    pass\n", "digest": "sha256:" + "0" * 64}])),
     None),
    ("R8-7", "triton-launch", "E_SCHEMA", _edit(lambda i: i["graph"]["nodes"].insert(-1, {
        "op": "call_function", "name": "launch", "target": "torch.ops.higher_order.triton_kernel_wrapper_mutation",
        "args": [], "kwargs": {"kernel_idx": 5, "constant_args_idx": 0}})), None),
]


def _other_header(p) -> bytes:
    """graph.py's tar header with another mtime: the same length, not the header §2.1 fixes."""
    size = len(dict(p.members)["graph.py"])
    header = bytearray(tar_header("graph.py", size))
    header[136:148] = b"00000000001\0"  # mtime 1 instead of 0 (its checksum left as is)
    return bytes(header)


def _flip_index_sha(p, valid: bytes) -> bytes:
    data = bytearray(valid)
    data[p.footer_start + 8 + 32] ^= 0xFF  # first byte of the footer's index sha256
    return bytes(data)


def build(out: Path | None = None, base: Path | None = None) -> dict[str, dict]:
    """Write every invalid vector and the manifest into ``out`` (default ``OUT``), from ``base``
    (default ``BASE``)."""
    out, base = OUT if out is None else out, BASE if base is None else base
    valid = base.read_bytes()
    parsed = parse(valid)
    out.mkdir(exist_ok=True)
    vectors: dict[str, dict] = {}
    for rule, slug, code, builder, limits in CASES:
        name = f"{rule}-{slug}.tar.zst"
        (out / name).write_bytes(builder(parsed, valid))
        vectors[name] = {"rule": rule, "code": code, **({"limits": limits} if limits else {})}
    manifest = {"base": base.name, "vectors": vectors, "not_vectorised": NOT_VECTORISED}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return vectors


def _differing(spec_dir: Path, built: Path) -> dict[Path, str]:
    """The files of ``spec_dir``'s invalid/ that are not what was built into ``built``, and how."""
    kept = spec_dir / "vectors" / OUT.name
    names = {p.name for p in built.iterdir()} | {p.name for p in kept.glob("*.tar.zst")}
    out = {}
    for name in sorted(names):
        if not (built / name).exists():
            out[kept / name] = "no longer made"
        elif not (kept / name).exists():
            out[kept / name] = "missing"
        elif (built / name).read_bytes() != (kept / name).read_bytes():
            out[kept / name] = "differs from what the generator makes"
    return out


def check(spec_dir: Path = HERE.parent) -> list[str]:
    """The invalid vectors that are not what the builders make now (built in a temporary folder),
    one line each; empty when all are."""
    base = spec_dir / "vectors" / BASE.name
    if not base.exists():
        return [f"{spec_dir / 'vectors' / OUT.name}: not checked: the golden vector they are built from is missing"]
    with tempfile.TemporaryDirectory() as tmp:
        build(Path(tmp), base)
        return [f"{path}: {how}" for path, how in _differing(spec_dir, Path(tmp)).items()]


def write(spec_dir: Path = HERE.parent) -> list[Path]:
    """Bring invalid/ to what the builders make; the files changed or removed (none without the
    golden vector they are built from)."""
    if not (spec_dir / "vectors" / BASE.name).exists():
        return []
    (spec_dir / "vectors" / OUT.name).mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        build(Path(tmp), spec_dir / "vectors" / BASE.name)
        changed = list(_differing(spec_dir, Path(tmp)))
        for path in changed:
            if (Path(tmp) / path.name).exists():
                shutil.copyfile(Path(tmp) / path.name, path)
            else:
                path.unlink()
    return changed


if __name__ == "__main__":
    write()
    print(f"wrote {len(CASES)} invalid vectors to {OUT}")
