"""Golden vectors (spec §10): every stored archive must keep loading to the recorded values."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest
import torch
import zstandard

import reproarchive
from spec.vectors import make_vectors

VECTORS = Path(__file__).resolve().parents[2] / "spec" / "vectors"

MANIFEST = json.loads((VECTORS / "vectors.json").read_text())


def _case(name: str) -> str:
    """``custom-op-1.3.tar.zst`` -> ``custom-op``."""
    return name.removesuffix(".tar.zst").rsplit("-", 1)[0]


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_vector_loads_to_recorded_values(name, recwarn):
    expected = MANIFEST[name]
    path = VECTORS / name
    assert hashlib.sha256(path.read_bytes()).hexdigest() == expected["file_sha256"], "vector file was modified"
    reproarchive.verify(path)
    facts = make_vectors.expectations(_case(name), path)
    for key in ("index_digest", "fidelity", "inputs", "storage_aliases", "job"):
        assert facts.get(key) == expected.get(key), key
    assert facts.get("shapes") == expected.get("shapes")  # (1.3) the shape policy, as recorded
    if "outputs" in expected:
        assert len(facts["outputs"]) == len(expected["outputs"])
        for got, want in zip(facts["outputs"], expected["outputs"]):
            assert {k: v for k, v in got.items() if k != "values"} == {k: v for k, v in want.items() if k != "values"}
            # computed values: kernels round differently on different CPUs (make_vectors.output_facts)
            if "values" in want:
                torch.testing.assert_close(torch.tensor(got["values"]), torch.tensor(want["values"]),
                                           rtol=1e-5, atol=1e-6, equal_nan=True)


def test_every_case_has_a_vector_for_the_current_version():
    for case in (*make_vectors.CASES, *make_vectors.JOB_CASES):
        assert f"{case}-{make_vectors.VERSION}.tar.zst" in MANIFEST


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_current_writer_reproduces_vector_bytes(name, tmp_path):
    """Determinism across processes and time: same inputs, same library versions, same bytes."""
    expected = MANIFEST[name]
    if expected.get("zstd_library") != ".".join(map(str, zstandard.ZSTD_VERSION)):
        pytest.skip("vector written with another zstd library; bytes may legitimately differ")
    if expected.get("format") != make_vectors.VERSION:
        pytest.skip("vector of an older format version")
    index = reproarchive.inspect(VECTORS / name).to_plain()
    if index["created_by"]["torch"] != torch.__version__.split("+")[0]:
        pytest.skip("vector written with another torch version (recorded in the index)")
    if _case(name) == "triton" and importlib.util.find_spec("triton") is None:
        pytest.skip("building the triton vector needs the triton package (its kernel runs in Triton's interpreter)")
    out = tmp_path / name
    make_vectors.build(_case(name), out)
    assert out.read_bytes() == (VECTORS / name).read_bytes()
