"""Write the worked example of spec/FORMAT.md §6: the index of the golden vector
``basic-1.3.tar.zst``, decoded, as ``spec/example-index.json``.

    python spec/vectors/make_example.py

It reads the vector the way any tool can (zstd + tar, no reproarchive): the index member is
plain msgpack. JSON has no binary type, so a ``bin`` value is shown as ``{"$bin": "<hex>"}``.
``tests/format/test_spec.py`` regenerates it and fails when the file drifts.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import msgpack
import zstandard

HERE = Path(__file__).resolve().parent
VECTOR = HERE / "basic-1.3.tar.zst"
TARGET = HERE.parent / "example-index.json"


def decoded_index(path: Path = VECTOR) -> dict:
    with zstandard.ZstdDecompressor().stream_reader(path.open("rb"), read_across_frames=True) as stream:
        tar_bytes = stream.read()
    with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:") as tar:
        return msgpack.unpackb(tar.extractfile("index.msgpack").read(), raw=False)


def example_text() -> str:
    index = decoded_index()
    return json.dumps(index, indent=1, sort_keys=True, default=lambda b: {"$bin": b.hex()}) + "\n"


if __name__ == "__main__":
    TARGET.write_text(example_text())
    print(f"wrote {TARGET}")
