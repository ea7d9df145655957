"""``StoreTests``: the conformance suite every store backend's tests subclass.

It ships in the library, not under ``tests/``, for the reason zarr-python ships
``zarr.testing.store.StoreTests``: a backend written in another package (a company's object
store, a cache in front of one) proves itself with the same tests as ours by subclassing it.

A subclass gives two things (ours: ``tests/store/test_store_conformance.py``):

* a pytest fixture ``store`` that opens an empty store of the backend under test;
* ``side_put(store, key, data)`` and ``side_get(store, key)``: a side door that writes and reads
  the backend's objects *without* the class under test (plain files, the S3 API, the memory
  filesystem's dict), so that what is tested is the store's own methods, not a round trip
  through two of them that could be wrong in the same way.

Nothing is skipped. The capability flags (``store.backend.Store``) choose what a check expects:
a capability the backend claims is checked to work; one it does not claim is checked to be
refused as the interface says, with one ``StoreError`` and nothing written or removed (a
read-only store refuses every write and ``push``, a store that does not list refuses ``list``,
one that does not delete refuses ``delete``). Without ``atomic_create`` racing creates may
both win, but every one still leaves a whole object of one writer.

The last test pushes overlapping archives from several threads at once, including two that
hold the same blobs in different frames, and pulls every one back byte for byte: whatever the
backend, concurrent pushes lose nothing.
"""

from __future__ import annotations

# Imports inside functions: a third party's store tests import this module; push and pull
# (which bring torch) are imported only by the test that uses them.
import abc
import concurrent.futures
import threading
from collections.abc import Callable

from reproarchive.errors import LimitExceededError, StoreError, StoreNotFoundError
from reproarchive.store.backend import Store

__all__ = ["StoreTests"]


class StoreTests(abc.ABC):
    """Subclass with a ``store`` fixture and the side door; name the subclass ``Test...``."""

    @abc.abstractmethod
    def side_put(self, store: Store, key: str, data: bytes) -> None:
        """Write ``data`` under ``key`` without any method of ``store``."""

    @abc.abstractmethod
    def side_get(self, store: Store, key: str) -> bytes | None:
        """The bytes under ``key`` (None: no object), read without any method of ``store``."""

    # -- what it is
    def test_is_a_store(self, store):
        assert isinstance(store, Store)
        for flag in ("supports_writes", "supports_listing", "supports_delete", "atomic_create"):
            assert isinstance(getattr(store, flag), bool), flag
        assert isinstance(store.url, str) and store.url

    # -- reading
    def test_size_of_a_missing_key_is_none(self, store):
        assert store.size("refs/nothing-here") is None
        assert store.sizes(["refs/nothing-here"]) == {"refs/nothing-here": None}

    def test_size_and_ranges(self, store):
        data = bytes(range(256)) * 5
        self.side_put(store, "blobs/sha256/aa", data)
        store.refresh()
        assert store.size("blobs/sha256/aa") == len(data)
        assert store.read_range("blobs/sha256/aa", 0, len(data)) == data
        assert store.read_range("blobs/sha256/aa", 10, 20) == data[10:20]
        assert store.read_range("blobs/sha256/aa", len(data) - 3, len(data) + 100) == data[-3:]

    def test_sizes_in_one_batch(self, store):
        for i in range(5):
            self.side_put(store, f"blobs/sha256/{i:02d}", b"x" * (i + 1))
        store.refresh()
        keys = [f"blobs/sha256/{i:02d}" for i in range(7)]
        assert store.sizes(keys, jobs=3) == {k: (i + 1 if i < 5 else None) for i, k in enumerate(keys)}

    def test_reading_a_missing_key_says_not_found(self, store):
        for read in (lambda: store.read_range("refs/missing", 0, 10), lambda: store.read_small("refs/missing", 100)):
            try:
                read()
            except StoreNotFoundError:
                continue
            raise AssertionError("reading a missing key must raise StoreNotFoundError")

    def test_read_small_refuses_an_object_over_its_cap(self, store):
        self.side_put(store, "refs/big", b"y" * 100)
        store.refresh()
        assert store.read_small("refs/big", 100) == b"y" * 100
        try:
            store.read_small("refs/big", 99)
        except LimitExceededError:
            return
        raise AssertionError("an object over the cap must be refused")

    def test_iter_object_never_reads_past_the_declared_size(self, store):
        data = bytes(range(200))
        self.side_put(store, "blobs/sha256/bb", data)
        store.refresh()
        assert b"".join(store.iter_object("blobs/sha256/bb", len(data), chunk=7)) == data
        # an object longer than recorded yields one byte more, so the checker sees it, and no more
        assert b"".join(store.iter_object("blobs/sha256/bb", 50, chunk=7)) == data[:51]

    def test_read_many(self, store):
        keys = [f"refs/r{i}" for i in range(4)]
        for k in keys:
            self.side_put(store, k, k.encode())
        store.refresh()
        got = store.read_many(keys)
        assert {k: got[k] for k in keys} == {k: k.encode() for k in keys}
        assert store.read_many([]) == {}

    def test_list_gives_the_keys_directly_under_a_prefix(self, store):
        for key in ("refs/a", "refs/b-1.x", "archives/sha256/cc", "reproarchive-store"):
            self.side_put(store, key, b"1")
        store.refresh()
        if not store.supports_listing:  # reached by names only: ls must fail, never list nothing
            for prefix in ("refs", "archives/sha256", "blobs/sha256"):
                _refused(lambda prefix=prefix: store.list(prefix), f"list({prefix!r}) of a store that does not list")
            return
        assert sorted(store.list("refs")) == ["refs/a", "refs/b-1.x"]
        assert store.list("archives/sha256") == ["archives/sha256/cc"]
        assert store.list("blobs/sha256") == []

    def test_refresh_sees_what_another_writer_wrote(self, store):
        if store.supports_listing:
            assert store.list("refs") == []
        assert store.size("refs/later") is None
        self.side_put(store, "refs/later", b"abc")
        store.refresh()
        assert store.size("refs/later") == 3
        if store.supports_listing:
            assert store.list("refs") == ["refs/later"]

    # -- writing
    def test_write_and_overwrite(self, store):
        if not store.supports_writes:
            _refused(lambda: store.write("refs/w", b"first"), "write to a read-only store")
            assert self.side_get(store, "refs/w") is None
            return
        store.write("refs/w", b"first")
        assert self.side_get(store, "refs/w") == b"first"
        store.write("refs/w", b"second, longer")
        assert self.side_get(store, "refs/w") == b"second, longer"

    def test_create_writes_only_a_new_key(self, store):
        if not store.supports_writes:
            _refused(lambda: store.create("blobs/sha256/new", b"mine"), "create in a read-only store")
            assert self.side_get(store, "blobs/sha256/new") is None
            return
        assert store.create("blobs/sha256/new", b"mine") is True
        assert self.side_get(store, "blobs/sha256/new") == b"mine"
        assert store.create("blobs/sha256/new", b"theirs") is False
        assert self.side_get(store, "blobs/sha256/new") == b"mine"

    def test_create_has_one_winner_among_racing_writers(self, store):
        """With ``atomic_create`` exactly one of the racing writers wins; without it (a lookup
        then a write) several may, but the object is still whole and one writer's."""
        if not store.supports_writes:
            _refused(lambda: store.create("blobs/sha256/raced", b"writer"), "create in a read-only store")
            assert self.side_get(store, "blobs/sha256/raced") is None
            return
        start = threading.Barrier(6)

        def one(i):
            start.wait()
            return store.create("blobs/sha256/raced", f"writer {i}".encode() * 1000)

        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            won = list(pool.map(one, range(6)))
        held = self.side_get(store, "blobs/sha256/raced")
        if store.atomic_create:
            assert won.count(True) == 1
            assert held == f"writer {won.index(True)}".encode() * 1000
        else:
            assert won.count(True) >= 1
            assert held in [f"writer {i}".encode() * 1000 for i, w in enumerate(won) if w]

    def test_write_stream_small_and_streamed(self, store):
        data = bytes(range(256)) * 64
        chunks = [data[i:i + 1000] for i in range(0, len(data), 1000)]
        store.stream_bytes = 4096  # this instance streams anything larger (multipart on S3)
        if not store.supports_writes:
            for size, exclusive in ((len(data), False), (len(data), True), (3, False), (3, True)):
                _refused(lambda size=size, exclusive=exclusive: store.write_stream(
                    "blobs/sha256/s1", size, iter(chunks if size > 3 else [b"abc"]), exclusive=exclusive),
                    "write_stream to a read-only store")
            assert self.side_get(store, "blobs/sha256/s1") is None
            return
        for key, exclusive in (("blobs/sha256/s1", False), ("blobs/sha256/s2", True)):
            seen = []
            assert store.write_stream(key, len(data), iter(chunks), on_chunk=seen.append, exclusive=exclusive) is True
            assert self.side_get(store, key) == data and sum(seen) == len(data)
        assert store.write_stream("blobs/sha256/s2", len(data), iter([b"other"] * 1000), exclusive=True) is False
        assert self.side_get(store, "blobs/sha256/s2") == data
        assert store.write_stream("blobs/sha256/s3", 3, iter([b"abc"])) is True
        assert self.side_get(store, "blobs/sha256/s3") == b"abc"

    def test_a_failed_write_stream_leaves_nothing(self, store):
        def failing():
            yield b"z" * 3000
            yield b"z" * 3000
            raise OSError("the source went away")

        store.stream_bytes = 4096
        for size in (1000, 100_000):  # joined in memory, and streamed
            for exclusive in (False, True):
                try:
                    store.write_stream("blobs/sha256/broken", size, failing(), exclusive=exclusive)
                except StoreError:
                    pass
                except OSError:
                    assert store.supports_writes, "a read-only store refuses with StoreError, before any chunk"
                else:
                    raise AssertionError("the failure of the chunks must reach the caller")
                assert self.side_get(store, "blobs/sha256/broken") is None
        store.refresh()
        assert store.size("blobs/sha256/broken") is None

    def test_delete_removes_an_object_and_a_missing_one_is_no_error(self, store):
        if not (store.supports_writes and store.supports_delete):
            self.side_put(store, "damaged/sha256/kept", b"record")
            store.refresh()
            _refused(lambda: store.delete("damaged/sha256/kept"), "delete in a store that does not delete")
            assert self.side_get(store, "damaged/sha256/kept") == b"record"
            return
        store.write("damaged/sha256/gone", b"record")
        store.delete("damaged/sha256/gone")
        store.refresh()
        assert self.side_get(store, "damaged/sha256/gone") is None and store.size("damaged/sha256/gone") is None
        store.delete("damaged/sha256/gone")

    # -- what push and pull need of it, together
    def test_concurrent_pushes_of_overlapping_archives_lose_nothing(self, store, tmp_path):
        from reproarchive.store.listing import list_store
        from reproarchive.store.objects import MARKER_KEY
        from reproarchive.store.pull import pull
        from reproarchive.store.push import push as push_archive

        paths = _overlapping_archives(tmp_path)
        if not store.supports_writes:  # push refuses before uploading anything
            _refused(lambda: push_archive(paths[0], store, jobs=4), "push to a read-only store")
            assert self.side_get(store, MARKER_KEY) is None
            return
        start = threading.Barrier(len(paths))

        def push(path):
            start.wait()
            return push_archive(path, store, jobs=4)[0]

        with concurrent.futures.ThreadPoolExecutor(len(paths)) as pool:
            pushed = list(pool.map(push, paths))
        for path, result in zip(paths, pushed):
            out = pull(f"{store.url}/{result.name}", tmp_path / "pulled" / path.name)
            assert out.path.read_bytes() == path.read_bytes(), path.name
        if store.supports_listing:
            assert list_store(store.url)["archives"] == len(paths)


def _overlapping_archives(folder) -> list:
    """Four small archives over the same weights: two with 128 KiB frames, two with 64 KiB frames
    (so the same blob names hold different frames), each with an input of its own."""
    import torch
    from torch import fx

    from reproarchive.archive.packing import pack

    class Model(torch.nn.Module):
        def forward(self, w, b, x):
            return (x @ w + b).relu()

    weights = [torch.randn(256, 256, generator=torch.Generator().manual_seed(0)), torch.randn(256)]
    paths = []
    for i, frame_size in enumerate((128 << 10, 128 << 10, 64 << 10, 64 << 10)):
        x = torch.randn(8, 256, generator=torch.Generator().manual_seed(100 + i))
        path = folder / f"overlap-{i}.tar.zst"
        pack(fx.symbolic_trace(Model()), [*weights, x], path, frame_size=frame_size)
        paths.append(path)
    return paths


def _refused(call: Callable[[], object], what: str) -> None:
    """``call`` must fail with one ``StoreError`` (what the interface says of a capability the
    store does not claim), not succeed or fail some other way."""
    try:
        call()
    except StoreError:
        return
    raise AssertionError(f"{what} must raise StoreError")
