"""Write the worked example of spec/FORMAT.md §6: the index of the golden vector
``basic-1.3.tar.zst``, decoded, as ``spec/example-index.json``.

    python spec/vectors/make_example.py

It reads the vector the way any tool can (zstd + tar, no reproarchive): the index member is
plain msgpack. JSON has no binary type, so a ``bin`` value is shown as ``{"$bin": "<hex>"}``.
``tests/format/test_spec.py`` regenerates it and fails when the file drifts;
``python -m reproarchive.spec_files`` checks or writes it with every generated file (``check``,
``write``).
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import msgpack
import zstandard

from reproarchive.format.atomic import write_if_changed

HERE = Path(__file__).resolve().parent
VECTOR = HERE / "basic-1.3.tar.zst"
TARGET = HERE.parent / "example-index.json"


def decoded_index(path: Path = VECTOR) -> dict:
    with zstandard.ZstdDecompressor().stream_reader(path.open("rb"), read_across_frames=True) as stream:
        tar_bytes = stream.read()
    with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:") as tar:
        return msgpack.unpackb(tar.extractfile("index.msgpack").read(), raw=False)


def example_text(vector: Path = VECTOR) -> str:
    index = decoded_index(vector)
    return json.dumps(index, indent=1, sort_keys=True, default=lambda b: {"$bin": b.hex()}) + "\n"


def check(spec_dir: Path = HERE.parent) -> list[str]:
    """The example if it is not the vector decoded: one line naming it; empty when it is."""
    target, vector = spec_dir / TARGET.name, spec_dir / "vectors" / VECTOR.name
    if not target.exists():
        return [f"{target}: missing"]
    if not vector.exists():
        return [f"{target}: not checked: the golden vector it decodes is missing"]
    if target.read_text() != example_text(vector):
        return [f"{target}: differs from {VECTOR.name} decoded"]
    return []


def write(spec_dir: Path = HERE.parent) -> list[Path]:
    """Write the example; the files changed (none when it was current, or without its vector)."""
    if not (spec_dir / "vectors" / VECTOR.name).exists():
        return []
    return write_if_changed(spec_dir / TARGET.name, example_text(spec_dir / "vectors" / VECTOR.name))


if __name__ == "__main__":
    write()
    print(f"wrote {TARGET}")
