"""Coverage-guided fuzzing of the reader with atheris (manual runs only; not part of the suite).

    pip install atheris
    python tests/fuzz_atheris.py -atheris_runs=200000 [-max_len=8192] [CORPUS_DIR ...]

Seeds: the valid archive from ``hostile_corpus`` (and any folders given, e.g. the output of
``python tests/hostile_corpus.py OUTDIR``). The oracle is the same as tests/test_fuzz.py: an
``ArchiveError`` with one line, or acceptance of content identical to the seed. Any other
exception is a finding (atheris saves the input as ``crash-*``).
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from pathlib import Path

import atheris

with atheris.instrument_imports():
    import hostile_corpus as hc

    from reproarchive.format import index_codec, layout, reader, writer  # noqa: F401

_WORK = Path(tempfile.mkdtemp(prefix="reproarchive-atheris-"))
_SEED = hc.make_valid(_WORK / "seed.tar.zst")
_REF = {op: hc.run_library_op(op, _SEED, _WORK) for op in ("verify", "load")}
_PATH = _WORK / "input.tar.zst"


def test_one_input(data: bytes) -> None:
    _PATH.write_bytes(data)
    for op in ("verify", "load"):
        res = hc.run_library_op(op, _PATH, _WORK)
        if res["outcome"] == "leak":
            raise RuntimeError(f"{op} leaked {res['type']}: {res['message']}")
        if res["outcome"] == "archive_error" and ("\n" in res["message"] or not res["message"].strip()):
            raise RuntimeError(f"{op} error is not one line: {res['message']!r}")
        if res["outcome"] == "ok" and any(res.get(k) != _REF[op].get(k) for k in ("digest", "args", "code")):
            raise RuntimeError(f"{op} accepted content unlike the seed")


def main() -> None:
    warnings.simplefilter("ignore")
    seeds = _WORK / "seeds"
    seeds.mkdir()
    (seeds / "valid.tar.zst").write_bytes(_SEED.read_bytes())
    argv = [a for a in sys.argv if not os.path.isdir(a)] + [str(seeds)] + [a for a in sys.argv[1:] if os.path.isdir(a)]
    atheris.Setup(argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
