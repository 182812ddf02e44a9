"""The per-flush statistics objects of an S3 store (``_tracking/_s3stats``, docs/cloud.md):
what a flush takes from the driver's log, the object's bytes, and the readers' merge."""

from __future__ import annotations

import math

import pytest

from bellis._tracking._layout import NO_WORKER, STAT_ARRAYS
from bellis._tracking._s3stats import StatsLog, encode_stats, merge_stats
from bellis.errors import TrackingError

URL = "s3://b/p"


def test_a_flush_takes_each_cell_once_with_its_latest_figures() -> None:
    log = StatsLog(10)
    log.record_block(3, (1.0, 2.0, 30, 4, 5, 6.0, 7, 0.5), 1, 100.0, 101.0)
    log.record_block(3, (9.0, 2.0, 30, 4, 5, 6.0, 7, 0.5), 0, 102.0, 103.0)  # run again
    log.record_block(8, (1.5, 0.5, 10, 0, 0), -1, 10.0, 11.0)  # a 5-figure tuple, no worker
    log.record("memory_grant_mb", 8, 2**40)  # saturates
    (group, grant) = sorted(log.take(), key=lambda t: len(t[0]), reverse=True)
    names, cells, values = group
    assert names == STAT_ARRAYS and cells.tolist() == [3, 8]
    assert values["wall_seconds"].tolist() == [9.0, 1.5]
    assert values["worker_id"].tolist() == [0, NO_WORKER]
    assert math.isnan(float(values["gpu_util_pct"][1]))
    assert grant[2]["memory_grant_mb"].tolist() == [2**32 - 1]
    assert not log.has_pending() and log.take() == []  # taken: nothing twice


def test_the_object_holds_what_was_taken_and_merges_in_key_order() -> None:
    log = StatsLog(6)
    log.record_block(1, (1.0, 1.0, 1, 1, 1, 0.0, 0, 0.0), 0, 1.0, 2.0)
    first = encode_stats(log.take())
    log.record_block(1, (5.0, 1.0, 1, 1, 1, 0.0, 0, 0.0), 1, 3.0, 4.0)  # a later attempt
    log.record_cache(2, (3, 4, 5, 6))
    log.record_stamps(4, 1, 7.0, 8.0)  # a failed attempt of a block not done
    second = encode_stats(log.take())
    merged = merge_stats(URL, 6, [("stats/a-000000.bin", first), ("stats/a-000001.bin", second)])
    assert merged["wall_seconds"].tolist() == [0, 5.0, 0, 0, 0, 0]
    assert merged["worker_id"].tolist() == [0, 1, 0, 0, 1, 0]
    assert merged["returned_at"].tolist() == [0, 4.0, 0, 0, 8.0, 0]
    assert merged["cache_misses"].tolist() == [0, 0, 4, 0, 0, 0]
    # 8 bytes of cell and 68 of figures per measured block, past the header
    assert len(first) - first.index(b"\n", 15) - 1 == 8 + 68


def test_a_declared_group_with_no_cell_says_the_store_has_the_arrays() -> None:
    log = StatsLog(4)
    log.declare(STAT_ARRAYS)
    assert log.has_pending()
    merged = merge_stats(URL, 4, [("k", encode_stats(log.take()))])
    assert sorted(merged) == sorted(STAT_ARRAYS)
    assert not any(a.any() for a in merged.values())


def test_what_could_not_be_written_goes_out_with_the_next_flush() -> None:
    log = StatsLog(4)
    log.record("output_checksum", 2, (1 << 32) | 7)
    taken = log.take()
    log.record("output_checksum", 3, (1 << 32) | 9)
    log.restore(taken)  # the PUT failed
    ((_names, cells, values),) = log.take()
    assert cells.tolist() == [2, 3]
    assert values["output_checksum"].tolist() == [(1 << 32) | 7, (1 << 32) | 9]


def test_a_cell_outside_the_grid_is_left_out_and_a_bad_object_is_named() -> None:
    log = StatsLog(10)
    log.record("memory_grant_mb", 9, 5)
    data = encode_stats(log.take())
    assert merge_stats(URL, 4, [("k", data)])["memory_grant_mb"].tolist() == [0, 0, 0, 0]
    with pytest.raises(TrackingError, match=r"stats/x\.bin is not readable.*shorter"):
        merge_stats(URL, 10, [("stats/x.bin", data[:-3])])
    with pytest.raises(TrackingError, match="no BELLIS-STATS header"):
        merge_stats(URL, 10, [("stats/y.bin", b"junk")])
    assert merge_stats(URL, 10, []) == {}  # no object: no array
