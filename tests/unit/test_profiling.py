"""profile_block and the start-up clock, without sleeping or spawning (_worker._profiling)."""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

import pytest
from funlib.geometry import Roi

from bellis._block import Block, BlockStats
from bellis._worker._profiling import (
    PROCESS_START,
    SETUP_ORIGIN,
    profile_block,
    setup_seconds_since_start,
)

LINUX = sys.platform.startswith("linux")


def _block() -> Block:
    r = Roi((0,), (10,))
    return Block(r, r, r, task_id="t")


def _burn(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_attaches_stats_to_the_block() -> None:
    b = _block()
    with profile_block(b) as p:
        _burn(0.05)
    s = b.stats
    assert isinstance(s, BlockStats) and p.stats is s
    assert s.wall_seconds >= 0.045
    assert s.cpu_seconds >= 0.04
    assert s.cpu_children_seconds == 0.0
    assert math.isnan(s.gpu_util_pct) and s.gpu_mem_bytes == 0
    if LINUX:
        assert s.peak_rss_bytes > 1 << 20


def test_the_first_measurement_attached_wins() -> None:
    b = _block()
    with profile_block(b) as outer:
        _burn(0.03)
        with profile_block(b) as inner:
            _burn(0.01)
    assert b.stats is inner.stats
    assert outer.stats is not None and inner.stats is not None
    assert outer.stats.cpu_seconds > inner.stats.cpu_seconds
    preset = BlockStats(wall_seconds=123.0)
    b2 = _block()
    b2.stats = preset
    with profile_block(b2):
        pass
    assert b2.stats is preset


def test_exceptions_propagate_and_the_measurement_is_kept() -> None:
    b = _block()
    p = profile_block(b)
    with pytest.raises(KeyError, match="boom"), p:
        _burn(0.01)
        raise KeyError("boom")
    assert b.stats is not None and b.stats.cpu_seconds > 0.0
    assert p.__exit__(None, None, None) is False


def test_io_counts_file_reads_and_writes(tmp_path: Path) -> None:
    data = os.urandom(1 << 20)
    path = tmp_path / "payload.bin"
    b = _block()
    with profile_block(b):
        path.write_bytes(data)
    assert b.stats is not None
    if LINUX:
        assert b.stats.io_write_bytes >= len(data)
        assert b.stats.io_write_bytes < len(data) + 64 * 1024
    b2 = _block()
    with profile_block(b2):
        assert path.read_bytes() == data
    assert b2.stats is not None
    if LINUX:
        assert b2.stats.io_read_bytes >= len(data)
        assert b2.stats.io_write_bytes == 0


@pytest.mark.skipif(not LINUX, reason="/proc/self/io is Linux only")
def test_an_empty_block_reads_no_bytes() -> None:
    b = _block()
    with profile_block(b):
        pass
    assert b.stats is not None
    assert b.stats.io_read_bytes == 0 and b.stats.io_write_bytes == 0


def test_deltas_never_go_negative() -> None:
    for _ in range(200):
        b = _block()
        with profile_block(b):
            pass
        assert b.stats is not None
        t = b.stats.to_tuple()
        assert all(v >= 0 for v in t if not math.isnan(v))


def test_setup_clock() -> None:
    a = setup_seconds_since_start()
    b = setup_seconds_since_start()
    assert 0.0 < a <= b
    assert a >= time.perf_counter() - PROCESS_START - 1e-3
    assert SETUP_ORIGIN in ("process", "import")
    if LINUX:
        assert SETUP_ORIGIN == "process"
        # the interpreter started before this module was imported
        assert a > time.perf_counter() - PROCESS_START
