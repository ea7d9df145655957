"""Content digests, always written as ``algorithm:hex`` so the algorithm can change without a
format break (the lesson of git's SHA-1 transition).

sha256 is the default because every machine can check it with ``sha256sum``; blake3 is
accepted because it hashes 4-5x faster, but needs the optional ``blake3`` package.
"""

from __future__ import annotations

import hashlib
import re

from reproarchive.errors import IndexSchemaError, Rule
from reproarchive.format.schema import DigestAlgorithm

DEFAULT_ALGORITHM = DigestAlgorithm.SHA256.value
ALGORITHMS = tuple(a.value for a in DigestAlgorithm)

DIGEST_RE = re.compile(rf"^({'|'.join(ALGORITHMS)}):([0-9a-f]{{64}})$")


def new_hasher(algorithm: str):
    """A hashlib-style object (``update``/``hexdigest``) whose update releases the GIL."""
    if algorithm == "sha256":
        return hashlib.sha256()
    if algorithm == "blake3":
        try:
            import blake3
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise IndexSchemaError(
                "this archive uses blake3 digests but the blake3 package is not installed",
                "pip install blake3",
            ) from exc
        return blake3.blake3()
    raise IndexSchemaError(
        f"unknown digest algorithm {algorithm!r}",
        f"this reproarchive understands {', '.join(ALGORITHMS)}; upgrade reproarchive",
    )


def check_algorithm(algorithm: str) -> str:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"digest algorithm must be one of {ALGORITHMS}, not {algorithm!r}")
    if algorithm == "blake3":
        new_hasher("blake3")  # fail early when the package is missing
    return algorithm


def parse(digest: object) -> tuple[str, str]:
    """Split ``algorithm:hex``; raises IndexSchemaError for anything else."""
    if not isinstance(digest, str):
        raise IndexSchemaError(f"digest must be a string, got {type(digest).__name__}", rule=Rule.DIGEST_SYNTAX)
    m = DIGEST_RE.match(digest)
    if not m:
        raise IndexSchemaError(
            f"malformed digest {digest[:80]!r}", "expected sha256:<64 hex> or blake3:<64 hex>", rule=Rule.DIGEST_SYNTAX
        )
    return m.group(1), m.group(2)


def of_bytes(data, algorithm: str = DEFAULT_ALGORITHM) -> str:
    h = new_hasher(algorithm)
    h.update(data)
    return f"{algorithm}:{h.hexdigest()}"


def blob_member_name(digest: str) -> str:
    algorithm, hexdigest = parse(digest)
    return f"blobs/{algorithm}/{hexdigest}"
