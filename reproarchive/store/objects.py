"""The objects of a store (spec/FORMAT.md §11): their keys, their bytes, and the checks a reader
makes before it trusts one.

A store holds three kinds of objects under its root:

    reproarchive-store          marker: {"format": "reproarchive-store", "version": "1.1"} (JSON)
    blobs/<alg>/<hex>           a blob member's zstd data frames, byte for byte as in the archive
    archives/sha256/<hex>       one per archive, named by the sha256 of the archive file: the
                                bytes of the archive that are not blob data, and where the blob
                                data goes (msgpack)
    refs/<name>                 a name for an archive (JSON), written last
    damaged/<alg>/<hex>         (1.1) a check found that blob object damaged (JSON; spec §11.6)

Everything read from a store is checked the way a reader checks an archive (spec §5): sizes
are capped before anything is read, msgpack goes through the same bomb check as an index, and
every key, digest and size follows a grammar. The byte layer knows nothing about fsspec; this
module turns bytes into checked records and back.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from typing import TYPE_CHECKING, Any

import msgpack
import zstandard

from reproarchive.errors import CorruptStoreError, IndexSchemaError, LimitExceededError, UnsupportedVersionError
from reproarchive.format import layout
from reproarchive.format.digests import new_hasher
from reproarchive.format.index_codec import check_msgpack_shape

if TYPE_CHECKING:
    from reproarchive.store.backend import Store

STORE_FORMAT = "reproarchive-store"
STORE_MAJOR, STORE_MINOR = 1, 1
STORE_VERSION = f"{STORE_MAJOR}.{STORE_MINOR}"
MARKER_KEY = "reproarchive-store"
ARCHIVE_OBJECT_FORMAT = "reproarchive-store-archive"
REF_FORMAT = "reproarchive-store-ref"
DAMAGE_FORMAT = "reproarchive-store-damage"

MAX_MARKER_BYTES = 4 << 10
MAX_REF_BYTES = 64 << 10
MAX_ARCHIVE_OBJECT_BYTES = 256 << 20
MAX_SEGMENTS = 2 * layout.DEFAULT_LIMITS.max_members + 2

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
SHA256_RE = re.compile(r"^sha256:([0-9a-f]{64})$")
# A digest prefix as people copy it: "file sha256:3fa2...", "index-sha256:3fa2", "sha256:3fa2", "3fa2"
HEX_PREFIX_RE = re.compile(r"^(?:(file|index)[-_: ]?)?(?:sha256:)?([0-9a-f]{4,64})(?:\.\.\.|\u2026)?$")
# A blob object is stored under its member name; a copy compressed differently from the one
# already there goes under the member name plus 16 hex digits of its own sha256 (§11.2).
_VARIANT_RE = re.compile(r"^\.[0-9a-f]{16}$")


def archive_key(digest: str) -> str:
    return f"archives/sha256/{SHA256_RE.match(digest).group(1)}"


def ref_key(name: str) -> str:
    return f"refs/{check_name(name)}"


def variant_key(blob: str, sha256_hex: str) -> str:
    return f"{blob}.{sha256_hex[:16]}"


def blob_of(key: str) -> str | None:
    """The blob member a blob object key holds, or None when the key is not one of §11.1's."""
    parts = key.split("/")
    if len(parts) != 3 or parts[0] != "blobs" or parts[1] != "sha256":
        return None
    name, _, variant = parts[2].partition(".")
    if not SHA256_RE.match("sha256:" + name) or (variant and not _VARIANT_RE.match("." + variant)):
        return None
    return f"blobs/sha256/{name}"


def damage_key(blob_key: str) -> str:
    """``blobs/sha256/<hex>[.<16 hex>]`` -> ``damaged/sha256/<hex>[.<16 hex>]``."""
    return "damaged/" + blob_key.removeprefix("blobs/")


def damaged_keys(store: Store) -> set[str]:
    """The blob objects a check recorded as damaged (their blob keys); empty when the store
    cannot list. A record is only a reason to look again, never trusted to name good bytes."""
    if not store.supports_listing:
        return set()
    found = set()
    for alg in ("sha256",):
        for key in store.list(f"damaged/{alg}"):
            blob_key = "blobs/" + key.removeprefix("damaged/")
            if blob_of(blob_key) is not None:
                found.add(blob_key)
    return found


def check_name(name: object) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise CorruptStoreError(
            f"{str(name)[:80]!r} is not a valid archive name in a store",
            "names are 1-128 characters of letters, digits, '.', '_', '+' and '-', starting with a letter or digit",
        )
    return name


def check_digest(digest: object, what: str) -> str:
    if not isinstance(digest, str) or not SHA256_RE.match(digest):
        raise CorruptStoreError(f"{what} has a malformed archive digest {str(digest)[:80]!r}",
                                "the store is damaged or hostile")
    return digest


# --------------------------------------------------------------------------------------------
# marker


def marker_bytes() -> bytes:
    return (json.dumps({"format": STORE_FORMAT, "version": STORE_VERSION}, sort_keys=True) + "\n").encode()


def check_marker(data: bytes, where: str) -> str:
    plain = _json(data, f"{where}/{MARKER_KEY}", MAX_MARKER_BYTES)
    if plain.get("format") != STORE_FORMAT or not isinstance(plain.get("version"), str):
        raise CorruptStoreError(f"{where}/{MARKER_KEY} is not a reproarchive store marker")
    major, _, _minor = plain["version"].partition(".")
    if major != str(STORE_MAJOR):
        raise UnsupportedVersionError(
            f"{where} is a reproarchive store of layout {plain['version']}; this reproarchive reads layout "
            f"{STORE_MAJOR}.x",
            "this store needs a newer reproarchive: pip install -U reproarchive",
        )
    return plain["version"]


# --------------------------------------------------------------------------------------------
# refs


def _text(value: Any) -> str | None:
    """A ref's text, shortened and without control characters (``ls`` prints it on terminals)."""
    if not isinstance(value, str):
        return None
    return "".join(c if c.isprintable() else "?" for c in value[:300])


def _known_count(value: Any) -> int | None:
    return value if _count(value) else None


@dataclasses.dataclass(frozen=True)
class RefFailure:
    signature: str
    stage: str | None = None
    exception_type: str | None = None
    message: str | None = None


@dataclasses.dataclass(frozen=True)
class RefSummary:
    """What ``ls`` shows about an archive, kept in its ref so that listing reads refs only.

    Informative, like the index's system record: a field of the wrong type reads as unknown
    (None) instead of refusing the ref, since nothing is trusted from it but the text shown."""

    failure: RefFailure | None = None
    backend: str | None = None
    ops: int | None = None
    inputs_real: int | None = None
    inputs_absent: int | None = None
    inputs_values: int | None = None
    bytes_logical: int | None = None
    file_bytes: int | None = None
    torch: str | None = None
    source: str | None = None
    index_digest: str | None = None  # lets a reference give the digest `inspect` prints

    def to_plain(self) -> dict[str, Any]:
        return {
            "failure": None if self.failure is None else dataclasses.asdict(self.failure),
            "backend": self.backend, "ops": self.ops,
            "inputs": {"real": self.inputs_real, "absent": self.inputs_absent, "values": self.inputs_values},
            "bytes_logical": self.bytes_logical, "file_bytes": self.file_bytes,
            "torch": self.torch, "source": self.source, "index_digest": self.index_digest,
        }

    @classmethod
    def from_plain(cls, plain: dict) -> RefSummary:
        failure = plain.get("failure") if isinstance(plain.get("failure"), dict) else {}
        signature = _text(failure.get("signature"))
        inputs = plain.get("inputs") if isinstance(plain.get("inputs"), dict) else {}
        return cls(
            failure=None if signature is None else RefFailure(
                signature, _text(failure.get("stage")), _text(failure.get("exception_type")),
                _text(failure.get("message"))),
            backend=_text(plain.get("backend")), ops=_known_count(plain.get("ops")),
            inputs_real=_known_count(inputs.get("real")), inputs_absent=_known_count(inputs.get("absent")),
            inputs_values=_known_count(inputs.get("values")),
            bytes_logical=_known_count(plain.get("bytes_logical")), file_bytes=_known_count(plain.get("file_bytes")),
            torch=_text(plain.get("torch")), source=_text(plain.get("source")),
            index_digest=plain.get("index_digest") if SHA256_RE.match(str(plain.get("index_digest"))) else None,
        )


@dataclasses.dataclass(frozen=True)
class Ref:
    """A name for an archive, with what ``ls`` shows about it (informative: only the archive
    digest is trusted, and only after the pulled bytes hash to it)."""

    name: str
    archive: str
    size: int
    pushed: str
    summary: RefSummary

    def to_bytes(self) -> bytes:
        plain = {"format": REF_FORMAT, "archive": self.archive, "size": self.size, "pushed": self.pushed,
                 "summary": self.summary.to_plain()}
        return (json.dumps(plain, sort_keys=True, indent=1) + "\n").encode()


def decode_ref(name: str, data: bytes) -> Ref:
    where = f"ref {name!r}"
    plain = _json(data, where, MAX_REF_BYTES)
    if plain.get("format") != REF_FORMAT:
        raise CorruptStoreError(f"{where} is not a reproarchive ref", "the store is damaged or hostile")
    size, pushed, summary = plain.get("size"), plain.get("pushed"), plain.get("summary")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= layout.DEFAULT_LIMITS.max_total_bytes:
        raise CorruptStoreError(f"{where} declares an impossible size {str(size)[:40]}",
                                "the store is damaged or hostile")
    if not isinstance(pushed, str) or len(pushed) > 64:
        raise CorruptStoreError(f"{where} has no valid push date", "the store is damaged or hostile")
    if not isinstance(summary, dict):
        raise CorruptStoreError(f"{where} has no summary map", "the store is damaged or hostile")
    return Ref(check_name(name), check_digest(plain.get("archive"), where), size, _text(pushed),
               RefSummary.from_plain(summary))


# --------------------------------------------------------------------------------------------
# archive objects


@dataclasses.dataclass(frozen=True)
class BlobSegment:
    """Bytes of the archive that live in a blob object: a blob member's data frames."""

    blob: str  # the member name, blobs/<alg>/<hex>
    key: str  # the object holding the frames (the member name, or a variant of it)
    size: int  # compressed bytes
    sha256: str  # hex sha256 of those compressed bytes


@dataclasses.dataclass(frozen=True)
class ArchiveObject:
    """Everything needed to rebuild one archive's bytes: the archive is its segments, in order
    (inline bytes, or the frames of a blob object)."""

    digest: str  # sha256:<hex> of the archive file; the object is stored under it
    size: int
    index_digest: str
    segments: tuple  # of bytes | BlobSegment

    def blobs(self) -> list[BlobSegment]:
        return [s for s in self.segments if isinstance(s, BlobSegment)]

    def to_bytes(self) -> bytes:
        segments = [bytes(s) if not isinstance(s, BlobSegment) else
                    {"blob": s.blob, "key": s.key, "size": s.size, "sha256": s.sha256} for s in self.segments]
        plain = {"format": ARCHIVE_OBJECT_FORMAT, "digest": self.digest, "size": self.size,
                 "index_digest": self.index_digest, "segments": segments}
        return msgpack.packb(plain, use_bin_type=True)


def decode_archive_object(digest: str, data: bytes) -> ArchiveObject:
    """Check an archive object as a reader checks an index: shape first, then every field."""
    where = f"archive object {digest[:19]}..."
    if len(data) > MAX_ARCHIVE_OBJECT_BYTES:
        raise LimitExceededError(f"{where} is {len(data)} bytes, more than the limit {MAX_ARCHIVE_OBJECT_BYTES}")
    try:
        check_msgpack_shape(data, max_memory=layout.DEFAULT_LIMITS.max_index_memory)
        plain = msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True)
    except IndexSchemaError as exc:
        raise CorruptStoreError(f"{where} is not valid msgpack: {exc}", "the store is damaged or hostile") from None
    except Exception as exc:  # noqa: BLE001 - msgpack raises several unrelated types for bad input
        raise CorruptStoreError(f"{where} is not valid msgpack: {type(exc).__name__}",
                                "the store is damaged or hostile") from None
    if not isinstance(plain, dict) or plain.get("format") != ARCHIVE_OBJECT_FORMAT:
        raise CorruptStoreError(f"{where} is not a reproarchive archive object", "the store is damaged or hostile")
    if plain.get("digest") != digest:
        raise CorruptStoreError(f"{where} says it describes {str(plain.get('digest'))[:80]!r}",
                                "the store is damaged or hostile")
    size, segments = plain.get("size"), plain.get("segments")
    if not _count(size) or size > layout.DEFAULT_LIMITS.max_total_bytes:
        raise CorruptStoreError(f"{where} declares an impossible size", "the store is damaged or hostile")
    if not isinstance(segments, list) or len(segments) > MAX_SEGMENTS:
        raise CorruptStoreError(f"{where} has no valid segment list", "the store is damaged or hostile")
    out: list = []
    total = 0
    seen: set[str] = set()
    for i, seg in enumerate(segments):
        if isinstance(seg, bytes):
            out.append(seg)
            total += len(seg)
            continue
        if not isinstance(seg, dict):
            raise CorruptStoreError(f"{where}: segment {i} is neither bytes nor a blob",
                                    "the store is damaged or hostile")
        blob, key, n, sha = seg.get("blob"), seg.get("key"), seg.get("size"), seg.get("sha256")
        if not isinstance(blob, str) or not layout.is_blob_name(blob) or blob in seen:
            raise CorruptStoreError(f"{where}: segment {i} names no valid blob ({str(blob)[:80]!r})",
                                    "the store is damaged or hostile")
        if not isinstance(key, str) or not (key == blob
                                            or (key.startswith(blob) and _VARIANT_RE.match(key[len(blob):]))):
            raise CorruptStoreError(f"{where}: segment {i} keeps {blob} under an invalid key {str(key)[:100]!r}",
                                    "the store is damaged or hostile")
        if not _count(n) or n < 9 or not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise CorruptStoreError(f"{where}: segment {i} ({blob}) has an invalid size or sha256",
                                    "the store is damaged or hostile")
        seen.add(blob)
        out.append(BlobSegment(blob, key, n, sha))
        total += n
    if total != size:
        raise CorruptStoreError(f"{where}: its segments add up to {total} bytes, not the {size} it declares",
                                "the store is damaged or hostile")
    return ArchiveObject(digest, size, check_digest(plain.get("index_digest"), where), tuple(out))


# --------------------------------------------------------------------------------------------
# blob objects


def repair_hint(url: str) -> str:
    """What repairs a damaged blob object: a push that reads back what it would reuse."""
    return (f"the copy in the store is damaged or was replaced; `reproarchive push --repair GOOD_COPY {url}` replaces "
            f"it from any good archive holding this blob (`reproarchive fsck {url}` finds others)")


class BlobCheck:
    """Checks a blob object's frames as they stream by: the compressed bytes against the sha256
    and size the archive object records, and (``content=True``) the decompressed bytes against
    the digest in the blob's name and its member size."""

    STORE_HINT = repair_hint("STORE")

    def __init__(self, segment: BlobSegment, member_size: int | None = None, *, content: bool = False,
                 stored: bool = True, hint: str = STORE_HINT):
        self.segment = segment
        self.stored = stored
        self.hint = hint
        self._stored = hashlib.sha256()
        self._got = 0
        self._member_size = member_size
        self._content = None
        if content:
            algorithm = segment.blob.split("/")[1]

            self._content = _ContentSink(new_hasher(algorithm))
            dctx = zstandard.ZstdDecompressor(max_window_size=layout.MAX_WINDOW_SIZE)
            self._writer = dctx.stream_writer(self._content, write_return_read=True)

    def update(self, data) -> None:
        self._got += len(data)
        if self._got > self.segment.size:
            raise self._mismatch(f"is larger than the {self.segment.size} bytes recorded")
        if self.stored:
            self._stored.update(data)
        if self._content is not None:
            try:
                self._writer.write(data)
            except zstandard.ZstdError as exc:
                raise self._mismatch(f"does not decompress: {str(exc)[:120]}") from None
            if self._member_size is not None and self._content.n > self._member_size:
                raise self._mismatch(f"decompresses to more than its {self._member_size} bytes")

    def finish(self) -> None:
        seg = self.segment
        if self._got != seg.size:
            raise self._mismatch(f"has {self._got} bytes, not the {seg.size} recorded")
        if self.stored and self._stored.hexdigest() != seg.sha256:
            raise self._mismatch("does not match the sha256 its archive recorded")
        if self._content is not None:
            self._writer.flush()
            if self._member_size is not None and self._content.n != self._member_size:
                raise self._mismatch(f"decompresses to {self._content.n} bytes, not {self._member_size}")
            if self._content.hasher.hexdigest() != seg.blob.rsplit("/", 1)[1]:
                raise self._mismatch("does not hash to its name")

    def _mismatch(self, what: str) -> CorruptStoreError:
        return CorruptStoreError(f"blob {self.segment.blob} (object {self.segment.key}) {what}", self.hint)


class _ContentSink:
    def __init__(self, hasher):
        self.hasher = hasher
        self.n = 0

    def write(self, data) -> int:
        self.hasher.update(data)
        self.n += len(data)
        return len(data)


# --------------------------------------------------------------------------------------------


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _json(data: bytes, where: str, cap: int) -> dict:
    if len(data) > cap:
        raise LimitExceededError(f"{where} is larger than {cap} bytes", "the store is damaged or hostile")
    try:
        plain = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise CorruptStoreError(f"{where} is not valid JSON", "the store is damaged or hostile") from None
    if not isinstance(plain, dict):
        raise CorruptStoreError(f"{where} is not a JSON object", "the store is damaged or hostile")
    return plain
