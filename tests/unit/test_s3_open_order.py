"""A new S3 store is written while the run starts (``_tracking._s3open``): the open
returns after the lock's round trip, and every write of the store waits for its
metadata. Pure: an in-memory object store stands in for S3 at the client interface
(``_s3http.Requests``), with conditional writes as S3 answers them; no sockets. The
requests against a real S3 server are the integration tests' (``test_pipeline_s3.py``).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator

import pytest

from bellis._tracking import StoreLayout, _s3io
from bellis._tracking._layout import dump_metadata, group_metadata, layout_hash, layout_record
from bellis._tracking._s3 import S3Store
from bellis.errors import LayoutMismatch, TrackingError

URL = "s3://bucket/run/a"
GROUP = "run/a/zarr.json"
LOCK = "run/a/bellis.lock"
LAYOUT = StoreLayout((0,), (8,), (0,), (1,), (0,), (1,), "valid")


class MemoryS3:
    """Objects in a dict; a PUT conditional on an ETag (None: create-only) answers None
    where S3 answers 412. ``hold[key]``: that key's PUT waits for the event."""

    def __init__(self) -> None:
        self.objects: dict[str, tuple[bytes, str]] = {}
        self.log: list[tuple[str, str]] = []
        self.hold: dict[str, threading.Event] = {}
        self._mutex = threading.Lock()
        self._n = 0

    def get(self, bucket: str, key: str) -> tuple[bytes, str] | None:
        with self._mutex:
            self.log.append(("GET", key))
            return self.objects.get(key)

    def put(self, bucket: str, key: str, data: bytes, etag: str | None) -> str | None:
        held = self.hold.get(key)
        if held is not None:
            assert held.wait(30), f"{key} was held for 30 s"
        with self._mutex:
            now = self.objects.get(key)
            if (now is not None) if etag is None else (now is None or now[1] != etag):
                self.log.append(("412", key))
                return None
            self._n += 1
            tag = f'"{self._n}"'
            self.objects[key] = (bytes(data), tag)
            self.log.append(("PUT", key))
            return tag

    def delete(self, bucket: str, key: str, etag: str | None = None) -> bool:
        with self._mutex:
            now = self.objects.get(key)
            if now is None or (etag is not None and now[1] != etag):
                return False
            del self.objects[key]
            self.log.append(("DELETE", key))
            return True

    def delete_many(self, bucket: str, keys: list[str]) -> list[tuple[str, str]]:
        for key in keys:
            self.delete(bucket, key)
        return []

    def list(self, bucket: str, prefix: str, delimiter: str) -> tuple[list[str], list[str]]:
        with self._mutex:
            return sorted(k for k in self.objects if k.startswith(prefix)), []

    def writes(self) -> list[str]:
        with self._mutex:
            return [key for what, key in self.log if what in ("PUT", "DELETE")]


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[MemoryS3]:
    """The process's S3 client (``_s3io._client``) for this environment: a MemoryS3."""
    memory = MemoryS3()
    key = tuple(os.environ.get(name) for name in _s3io._CLIENT_ENV)
    monkeypatch.setitem(_s3io._clients, key, memory)
    yield memory


def _record() -> dict[str, str]:
    return {"hash": "f" * 64}


def test_the_open_returns_before_the_group_and_every_write_waits_for_it(s3: MemoryS3) -> None:
    s3.hold[GROUP] = threading.Event()
    store = S3Store.open(URL, LAYOUT)
    try:
        assert store.created
        assert ("PUT", LOCK) in s3.log and ("PUT", GROUP) not in s3.log
        # the code version (the run's first write) from another thread, as the run loop's
        # start does: it must not reach the bucket while the group is still to come
        used: list[int] = []
        user = threading.Thread(target=lambda: used.append(store.use_code(_record(), 1.0)))
        user.start()
        user.join(0.5)
        assert user.is_alive(), "use_code wrote before the store's group existed"
        assert "run/a/code_versions.json" not in s3.writes()
        s3.hold[GROUP].set()
        user.join(30)
        assert used == [1]
        store.record_success(3, None, 0, 0.0, 0.0)
    finally:
        s3.hold[GROUP].set()
        store.close()
    writes = s3.writes()
    group = writes.index(GROUP)
    # the arrays before their group; the table, the code array, the chunks after it
    assert {"run/a/done/zarr.json", "run/a/failures/zarr.json"} <= set(writes[:group])
    after = writes[group + 1 :]
    for key in (
        "run/a/code_versions.json",
        "run/a/code_version/zarr.json",
        "run/a/code_version/c/0",
        "run/a/done/c/0",
    ):
        assert key in after, (key, writes)
    assert after.index("run/a/code_version/c/0") < after.index("run/a/done/c/0")
    assert writes[-1] == LOCK and LOCK not in s3.objects  # released last
    assert s3.objects["run/a/done/c/0"][0] == bytes([0, 0, 0, 1, 0, 0, 0, 0])


def test_the_lock_is_released_only_after_the_group_is_written(s3: MemoryS3) -> None:
    s3.hold[GROUP] = threading.Event()
    store = S3Store.open(URL, LAYOUT)
    closer = threading.Thread(target=store.close)
    closer.start()
    closer.join(0.5)
    assert LOCK in s3.objects, "the lock was released while the store was being made"
    s3.hold[GROUP].set()
    closer.join(30)
    assert not closer.is_alive()
    assert s3.log[-1] == ("DELETE", LOCK)
    assert ("PUT", GROUP) in s3.log[:-1]


def test_a_group_made_between_the_read_and_the_lock_stops_the_run_unwritten(
    s3: MemoryS3,
) -> None:
    """The open read no group, so this run holds empty markers; a run that held the
    store in between made it (here put by the test while the group's PUT is held): this
    run must not write over it, and says to run again."""
    s3.hold[GROUP] = threading.Event()
    store = S3Store.open(URL, LAYOUT)
    made = group_metadata(layout_hash(LAYOUT), layout_record(LAYOUT))
    theirs = (dump_metadata(made), '"theirs"')
    s3.objects[GROUP] = theirs
    s3.objects["run/a/done/c/0"] = (bytes([1] * 8), '"their-done"')
    s3.hold[GROUP].set()
    with pytest.raises(TrackingError, match="another run created this store") as raised:
        store.use_code(_record(), 1.0)
    assert "Run again" in str(raised.value) and URL in str(raised.value)
    with pytest.raises(TrackingError, match="another run created this store"):
        store.close()
    assert s3.objects[GROUP] == theirs
    assert s3.objects["run/a/done/c/0"] == (bytes([1] * 8), '"their-done"')
    assert "run/a/code_versions.json" not in s3.objects
    assert LOCK not in s3.objects  # released: the next run takes it and resumes
    resumed = S3Store.open(URL, LAYOUT)
    try:
        assert not resumed.created and resumed.is_done(0)
    finally:
        resumed.close()


def test_an_existing_store_is_read_before_the_open_returns(s3: MemoryS3) -> None:
    first = S3Store.open(URL, LAYOUT)
    first.record_success(5, None, 0, 0.0, 0.0)
    first.close()
    s3.log.clear()
    again = S3Store.open(URL, LAYOUT)
    try:
        assert not again.created and again.is_done(5) and not again.is_done(4)
        assert s3.writes() == [LOCK]  # nothing written but the lock
    finally:
        again.close()


def test_another_layout_is_refused_with_the_aws_command_that_deletes_it(s3: MemoryS3) -> None:
    S3Store.open(URL, LAYOUT).close()
    other = StoreLayout((0,), (9,), (0,), (1,), (0,), (1,), "valid")
    with pytest.raises(LayoutMismatch) as refused:
        S3Store.open(URL, other)
    assert str(refused.value).endswith(
        f"Delete it to start fresh:\n    aws s3 rm --recursive {URL}"
    )
    assert LOCK not in s3.objects  # released again: the fixed run is not refused


def test_a_code_table_left_by_a_cut_short_delete_is_added_to(s3: MemoryS3) -> None:
    """A delete stopped after the group (``_backends.delete_store``) leaves the code
    table: the next run makes the store anew and adds its entry to that table (read
    while the store is made), rather than refuse it as another writer's."""
    first = S3Store.open(URL, LAYOUT)
    assert first.use_code(_record(), 1.0) == 1
    first.close()
    left = s3.objects["run/a/code_versions.json"]
    for key in [k for k in s3.objects if k != "run/a/code_versions.json"]:
        del s3.objects[key]
    again = S3Store.open(URL, LAYOUT)
    try:
        assert again.created
        assert again.use_code({"hash": "e" * 64}, 2.0) == 2
    finally:
        again.close()
    table = json.loads(s3.objects["run/a/code_versions.json"][0])
    assert [v["index"] for v in table["versions"]] == [1, 2]
    # found by the create-only write, read, then written on its ETag
    key = "run/a/code_versions.json"
    tail = [(what, k) for what, k in s3.log if k == key][-3:]
    assert tail == [("412", key), ("GET", key), ("PUT", key)]
    assert s3.objects["run/a/code_versions.json"] != left
    assert LOCK not in s3.objects


def test_a_first_run_reads_only_the_group_and_writes_each_object_once(s3: MemoryS3) -> None:
    """A new store costs the group's read and one write of each object: no read of a
    code-version table it cannot have (a leftover is found by the table's create-only
    write, the test above), no second write."""
    store = S3Store.open(URL, LAYOUT)
    try:
        assert store.use_code(_record(), 1.0) == 1
        store.record_success(3, None, 0, 0.0, 0.0)
    finally:
        store.close()
    assert [key for what, key in s3.log if what == "GET"] == [GROUP]
    assert sorted(s3.log) == sorted(
        [("GET", GROUP), ("DELETE", LOCK)]
        + [
            ("PUT", f"run/a/{name}")
            for name in (
                "bellis.lock",
                "done/zarr.json",
                "failures/zarr.json",
                "zarr.json",
                "code_version/zarr.json",
                "code_versions.json",
                "code_version/c/0",
                "done/c/0",
            )
        ]
    ), s3.log


def test_a_group_put_answered_412_for_its_own_retry_goes_on(s3: MemoryS3) -> None:
    """The group's PUT reached the bucket but its answer was lost, and the retry is
    refused: the group there is this run's own, with no marker beside it, so the run
    goes on as the store's maker."""
    s3.hold[GROUP] = threading.Event()
    store = S3Store.open(URL, LAYOUT)
    made = group_metadata(layout_hash(LAYOUT), layout_record(LAYOUT))
    s3.objects[GROUP] = (dump_metadata(made), '"first-try"')  # the lost answer's write
    s3.hold[GROUP].set()
    try:
        assert store.use_code(_record(), 1.0) == 1
        store.record_success(2, None, 0, 0.0, 0.0)
    finally:
        store.close()
    assert s3.objects["run/a/done/c/0"][0] == bytes([0, 0, 1, 0, 0, 0, 0, 0])
    assert LOCK not in s3.objects


def test_an_object_beside_the_arrays_waits_for_the_group_and_is_dropped_on_failure(
    s3: MemoryS3,
) -> None:
    """``after_open`` (the runner's ``outputs.json``): written after a new store's group,
    by the thread that made it; never when making it failed."""
    s3.hold[GROUP] = threading.Event()
    store = S3Store.open(URL, LAYOUT)
    written: list[str] = []
    store.after_open(lambda: written.append("outputs"))
    assert written == []  # the open returned; the group is still to come
    s3.hold[GROUP].set()
    store.close()
    assert written == ["outputs"]
    opened_again = S3Store.open(URL, LAYOUT)
    try:  # an existing store: written at once
        opened_again.after_open(lambda: written.append("again"))
        assert written == ["outputs", "again"]
    finally:
        opened_again.close()

    other = "s3://bucket/run/b"
    wrong = dump_metadata({"zarr_format": 3, "node_type": "array", "shape": [3]})
    s3.objects["run/b/done/zarr.json"] = (wrong, '"theirs"')
    s3.hold["run/b/done/zarr.json"] = threading.Event()  # queued before the failure
    failed = S3Store.open(other, LAYOUT)
    failed.after_open(lambda: written.append("never"))
    s3.hold["run/b/done/zarr.json"].set()
    with pytest.raises(TrackingError, match=r"done/zarr\.json is another array's"):
        failed.close()
    assert written == ["outputs", "again"]
    assert "run/b/zarr.json" not in s3.objects and "run/b/bellis.lock" not in s3.objects
