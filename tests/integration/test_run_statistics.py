"""Run statistics end to end: measurement in workers, the store's stat arrays, runs.jsonl,
task.report() (also from a fresh process), the worker timeline and the printed panel."""

from __future__ import annotations

import json
import math
import re
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

import bellis
from bellis import Roi
from bellis._stats._reports import validate_run_line
from bellis._tracking import NO_WORKER
from kit.blocks import make_task


def sleepy(block: Any) -> None:
    time.sleep(0.02)


def burn_child(block: Any) -> None:
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass",
        ],
        check=True,
    )


def noop(block: Any) -> None:
    pass


def _task(tmp_path: Path, fn: Any = sleepy, *, task_id: str = "t", n: int = 8, **kw: Any) -> Any:
    kw.setdefault("tracking_path", str(tmp_path / "track" / task_id))
    kw.setdefault("resource_tracking", True)
    return make_task(task_id, n, fn, max_workers=2, **kw)


def _run_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("multiprocessing", [False, True])
def test_measurements_reach_store_report_and_runs_jsonl(
    tmp_path: Path, multiprocessing: bool
) -> None:
    task = _task(tmp_path)
    assert task.report() is None
    states = bellis.run_blockwise(
        task, multiprocessing=multiprocessing, progress=False, summary=False, return_states=True
    )
    assert states["t"].completed_count == 8
    g = zarr.open_group(str(tmp_path / "track" / "t"), mode="r")
    wall = np.asarray(g["wall_seconds"][:])
    assert np.all(wall >= 0.02)  # each block sleeps 0.02 s
    assert np.all(np.isnan(np.asarray(g["gpu_util_pct"][:])))
    assert np.all(np.asarray(g["gpu_mem_bytes"][:]) == 0)
    assert np.all(np.asarray(g["peak_rss_bytes"][:]) > 1 << 20)
    ids = np.asarray(g["worker_id"][:])
    sent = np.asarray(g["sent_at"][:])
    returned = np.asarray(g["returned_at"][:])
    assert np.all(returned >= sent) and np.all(sent > 1.7e9)
    # the blocks ran inside the windows the server (or the serial loop) stamped
    assert wall.sum() <= (returned - sent).sum()
    if multiprocessing:
        assert set(ids.tolist()) <= {0, 1}
    else:
        assert np.all(ids == NO_WORKER)

    lines = _run_lines(tmp_path / "track" / "t" / "runs.jsonl")
    assert len(lines) == 1
    assert validate_run_line(lines[0]) == []
    report = task.report()
    assert report is not None
    assert report.mode == ("distributed" if multiprocessing else "serial")
    assert report.blocks.count == 8
    assert report.blocks.wall is not None and report.blocks.wall.n == 8
    assert report.blocks.wall.min >= 0.02
    assert report.blocks.wall.total == pytest.approx(float(wall.sum()), rel=1e-6)  # float32 store
    assert report.blocks.cpu is not None and report.blocks.cpu.mean < 0.015
    if multiprocessing:
        assert report.blocks.round_trip is not None and report.blocks.round_trip.n == 8
        assert report.blocks.overhead is not None
        assert report.workers.count == 2
        assert sum(r.blocks for r in report.workers.records) == 8
    else:
        assert report.workers.count == 0
    rec = report.block((3,))
    assert rec is not None and rec.stats is not None
    assert rec.stats.wall_seconds == pytest.approx(float(wall[3]), rel=1e-6)


def test_serial_and_distributed_agree(tmp_path: Path) -> None:
    reports = {}
    for mp in (False, True):
        task = _task(tmp_path, task_id=f"m{int(mp)}")
        bellis.run_blockwise(task, multiprocessing=mp, progress=False, summary=False)
        reports[mp] = task.report()
    a, b = reports[False], reports[True]
    # the workers and their streams of blocks (``locality_*``) are distributed runs' own
    distributed_only = ("worker_starts", "locality_blocks", "locality_local", "locality_steps")
    assert a.counters == {**b.counters, **dict.fromkeys(distributed_only, 0)}
    assert a.blocks.count == b.blocks.count == 8
    for field in ("wall", "cpu", "cpu_children", "peak_rss", "io_read", "io_write"):
        assert getattr(a.blocks, field).n == getattr(b.blocks, field).n == 8, field
    assert a.blocks.wall.min >= 0.02 and b.blocks.wall.min >= 0.02  # each block sleeps 0.02 s


def test_panel_count_equals_summary_completed(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    task = _task(tmp_path, n=12)
    bellis.run_blockwise(task, progress=False)
    out = capfd.readouterr().out
    summary_row = re.search(r"^\s+t ✔\s+(\d+)\s+(\d+)", out, re.M)
    panel_line = re.search(r"^\s+t\s+(\d+) blocks, (\d+) workers", out, re.M)
    assert summary_row is not None and panel_line is not None, out
    assert int(panel_line.group(1)) == int(summary_row.group(2)) == 12
    assert "Resource Utilization" in out
    assert out.index("Execution Summary") < out.index("Resource Utilization")
    dur = r"[\d.]+ (?:µs|ms|s)"
    rows = {
        "round trip": rf"round trip +{dur} ± {dur}$",
        "wall": rf"wall +{dur} ± {dur}$",
        "cpu": rf"cpu +{dur} ± {dur}$",
        "peak RSS": r"peak RSS +[\d.]+ (?:[KMG]i)?B ± [\d.]+ (?:[KMG]i)?B$",
        "io": r"io +read [\d.]+ (?:[KMG]i)?B +write [\d.]+ (?:[KMG]i)?B$",
        "overhead": rf"overhead +{dur} ± {dur}$",
        "trend": r"trend +\S+ [+-][\d.]+ ms/block$",
        "startup": rf"startup +{dur} ± {dur}$",
        "idle": rf"idle +{dur} ± {dur}$",
        "exits": r"exits +2 clean$",
    }
    for name, row in rows.items():
        assert re.search(r"^\s+" + row, out, re.M), (name, out)
    assert "cpu children" not in out  # no block started a child process
    # the worker table: a header, then one row per worker with its block count
    assert re.search(r"^\s+id +slot +startup +blocks +idle", out, re.M), out
    counts = [int(m) for m in re.findall(rf"^\s+[01] +[01] +{dur} +(\d+) ", out, re.M)]
    assert len(counts) == 2 and sum(counts) == 12, out


def test_panel_omitted_for_serial_run_without_resource_tracking(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    task = _task(tmp_path, noop, resource_tracking=False, tracking_path=False)
    bellis.run_blockwise(task, multiprocessing=False, progress=False)
    out = capfd.readouterr().out
    assert "Execution Summary" in out and "Resource Utilization" not in out
    # a distributed run of the same task shows round trips and workers without any store
    bellis.run_blockwise(task, progress=False)
    out = capfd.readouterr().out
    assert "Resource Utilization" in out and "round trip" in out and "peak RSS" not in out


def test_report_works_in_a_fresh_process(tmp_path: Path) -> None:
    task = _task(tmp_path)
    bellis.run_blockwise(task, progress=False, summary=False)
    code = textwrap.dedent(
        f"""
        import bellis
        from bellis import Roi
        t = bellis.Task("t", Roi((0,), (80,)), Roi((0,), (10,)), Roi((0,), (10,)),
                        tracking_path={str(tmp_path / "track" / "t")!r})
        r = t.report()
        rec = r.block((0,))
        print(r.blocks.count, r.workers.count, rec.worker_id in (0, 1), rec.returned_at > 0)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path
    ).stdout.split()
    assert out == ["8", "2", "True", "True"]


def test_resumed_run_reports_skips_and_keeps_old_stamps(tmp_path: Path) -> None:
    task = _task(tmp_path)
    bellis.run_blockwise(task, progress=False, summary=False)
    first = task.report()
    stamp = first.block((5,))
    assert stamp is not None
    bellis.run_blockwise(task, progress=False, summary=False)
    second = task.report()
    assert second.blocks.skipped == 8
    assert second.blocks.count == 0
    assert second.blocks.wall is None and second.blocks.round_trip is None
    again = second.block((5,))
    assert again is not None
    assert (again.worker_id, again.sent_at, again.returned_at) == (
        stamp.worker_id,
        stamp.sent_at,
        stamp.returned_at,
    )
    lines = _run_lines(tmp_path / "track" / "t" / "runs.jsonl")
    assert len(lines) == 2 and all(validate_run_line(d) == [] for d in lines)


def test_runs_jsonl_under_log_dir_without_store(tmp_path: Path) -> None:
    task = _task(tmp_path, noop, resource_tracking=False, tracking_path=False)
    bellis.run_blockwise(task, progress=False, summary=False)
    bellis.run_blockwise(task, progress=False, summary=False)
    path = tmp_path / "logs" / "t" / "runs.jsonl"
    lines = _run_lines(path)
    assert len(lines) == 2 and all(validate_run_line(d) == [] for d in lines)
    assert lines[-1]["workers"]["count"] >= 1
    assert lines[-1]["blocks"]["round_trip"]["n"] == 8


def test_timeline_phases_add_up(tmp_path: Path) -> None:
    task = _task(tmp_path)
    t0 = time.monotonic()
    bellis.run_blockwise(task, progress=False, summary=False)
    wall = time.monotonic() - t0
    report = task.report()
    assert 0 < report.wall_seconds <= wall
    assert report.workers.exits == {"clean": 2}
    assert sum(rec.blocks for rec in report.workers.records) == 8
    for rec in report.workers.records:
        assert rec.exit == "clean" and rec.teardown is not None
        if rec.final_wait is None:
            # a worker the run finished without: it reached the server only after the run
            # began shutting down (or never), so it never waited and did no block
            assert rec.blocks == 0
            continue
        assert rec.final_wait is not None
        # one idle gap before, and one compute span for, each block the worker did
        assert rec.idle.n == rec.compute.n == rec.blocks + rec.blocks_failed
        total = rec.startup + rec.idle.total + rec.compute.total + rec.final_wait + rec.teardown
        assert 0 < total <= report.wall_seconds
        assert rec.compute.total >= rec.blocks * 0.015
        assert rec.setup is not None and rec.launch is not None
        assert rec.setup + rec.launch == pytest.approx(rec.startup, abs=1e-6)


def test_child_process_cpu_is_its_own_field(tmp_path: Path) -> None:
    task = _task(tmp_path, burn_child, n=2)
    bellis.run_blockwise(task, progress=False, summary=False)
    g = zarr.open_group(str(tmp_path / "track" / "t"), mode="r")
    children = np.asarray(g["cpu_children_seconds"][:])
    own = np.asarray(g["cpu_seconds"][:])
    assert np.all(children >= 0.25), children
    assert np.all(own < 0.2), own
    report = task.report()
    assert report.blocks.cpu_children is not None and report.blocks.cpu_children.mean >= 0.25


def test_resource_tracking_needs_a_store(tmp_path: Path) -> None:
    task = _task(tmp_path, noop, tracking_path=False)
    with pytest.raises(bellis.ConfigurationError, match="resource_tracking=True but has no"):
        bellis.run_blockwise(task, progress=False)


def _hand_rolled_client(server: Any, task_id: str) -> tuple[socket.socket, Any]:
    """A client speaking the protocol by hand: authenticated for ``task_id``; returns the
    socket and a function that reads the next message ([] once the server closed)."""
    from bellis._protocol import HELLO, FrameDecoder, compute_mac, encode

    sock = socket.create_connection((server.hostname, server.port))
    dec = FrameDecoder()

    def recv() -> list[Any]:
        while True:
            data = sock.recv(65536)
            if not data:
                return []
            msgs = dec.feed(data)
            if msgs:
                return msgs[0]  # type: ignore[no-any-return]

    challenge = recv()
    sock.sendall(encode([HELLO, compute_mac(server.secret, challenge[1]), task_id, -1, 0, 0.0]))
    recv()
    return sock, recv


def _run_failing_on_unmeasured(task: Any, client: Any) -> None:
    """Run ``task`` with ``client(server)`` as its only worker, in a thread; the run must
    fail on an unmeasured block, naming profile_block."""
    import threading

    def on_listen(server: Any) -> None:
        threading.Thread(target=client, args=(server,), daemon=True).start()

    server = bellis.Server(external_workers=True, on_listen=on_listen)
    with pytest.raises(RuntimeError, match="profile_block"):
        server.run_blockwise(task, progress=False, summary=False)


def test_unmeasured_block_to_a_tracked_task_fails_naming_profile_block(tmp_path: Path) -> None:
    """A hand-rolled client returning a block without stats is refused with the fix."""
    from bellis._protocol import ACQUIRE, encode

    errors: list[str] = []

    def rogue(server: Any) -> None:
        sock, recv = _hand_rolled_client(server, "t")
        sock.sendall(encode([ACQUIRE]))
        sent = recv()
        sock.sendall(encode([ACQUIRE, sent[1], 2, -1, None]))
        errors.append("sent")
        # the run fails at once: this client is not served another block
        reply = recv()
        errors.append("closed" if reply == [] else f"got opcode {reply[0]}")
        sock.close()

    _run_failing_on_unmeasured(_task(tmp_path, None, n=2), rogue)
    deadline = time.monotonic() + 10
    while len(errors) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert errors == ["sent", "closed"]
    # the block the run failed on is neither done nor charged as a lost attempt
    g = zarr.open_group(str(tmp_path / "track" / "t"), mode="r")
    assert int(np.asarray(g["done"][:]).sum()) == 0
    assert int(np.asarray(g["failures"][:]).sum()) == 0


def test_a_batch_with_an_unmeasured_block_records_none_of_its_blocks(tmp_path: Path) -> None:
    """The run fails on an unmeasured success before anything of its batch is stored: a
    measured block returned with it gets neither figures nor a done marker."""
    from bellis._protocol import ACQUIRE, SEND, STATS_ROW, encode as enc

    seen: dict[str, Any] = {}
    row = STATS_ROW.pack(0.01, 0.01, 1 << 20, 0, 0, math.nan, 0, 0.0)

    def rogue(server: Any) -> None:
        sock, recv = _hand_rolled_client(server, "t")
        sock.sendall(enc([ACQUIRE]))
        first = recv()
        # a well-formed return of the first block: the next batch grows to two blocks
        sock.sendall(enc([ACQUIRE, first[1], 2, 0, None, row]))
        batch = recv()
        assert batch[0] == SEND and len(batch) >= 3, batch
        seen["first"], seen["batch"] = first[1], batch[1:3]
        a, b = batch[1], batch[2]
        sock.sendall(enc([ACQUIRE, a, 2, -1, None, b, 2, 0, None, row]))
        recv()
        sock.close()

    _run_failing_on_unmeasured(_task(tmp_path, None, n=6), rogue)
    g = zarr.open_group(str(tmp_path / "track" / "t"), mode="r")
    done = np.asarray(g["done"][:])
    wall = np.asarray(g["wall_seconds"][:])
    a, b = seen["batch"]
    assert done[seen["first"]] == 1 and wall[seen["first"]] == pytest.approx(0.01)
    assert done[a] == 0 and done[b] == 0
    assert wall[b] == 0.0  # the measured block of the failing batch was not stored
    assert done.sum() == 1
    # nor are they charged as failed attempts when the client's connection closes
    assert int(np.asarray(g["failures"][:]).sum()) == 0


def test_report_stat_relations(tmp_path: Path) -> None:
    task = _task(tmp_path, n=6)
    bellis.run_blockwise(task, progress=False, summary=False)
    r = task.report()
    rt, wall = r.blocks.round_trip, r.blocks.wall
    assert rt.n == wall.n == 6
    assert rt.mean >= wall.mean
    assert r.blocks.overhead.mean == pytest.approx(rt.mean - wall.mean, abs=1e-6)
    assert math.isfinite(r.blocks.trend)
    assert wall.min <= wall.mean <= wall.max
    assert wall.total == pytest.approx(wall.mean * wall.n)


def _writer(outdir: str) -> Any:
    def fn(block: Any) -> None:
        i = int(block.write_roi.offset[0]) // 10
        if i % 2 == 0:
            (Path(outdir) / f"{i}.bin").write_bytes(b"x" * (1 << 20))

    return fn


@pytest.mark.parametrize("multiprocessing", [False, True])
def test_back_to_back_blocks_are_charged_only_their_own_io(
    tmp_path: Path, multiprocessing: bool
) -> None:
    # 64 fast blocks: bellis's workers get them in batches and measure each block from
    # the previous block's closing readings; serial mode does the same
    outdir = tmp_path / "out"
    outdir.mkdir()
    task = _task(tmp_path, _writer(str(outdir)), n=64)
    bellis.run_blockwise(task, multiprocessing=multiprocessing, progress=False, summary=False)
    g = zarr.open_group(str(tmp_path / "track" / "t"), mode="r")
    written = np.asarray(g["io_write_bytes"][:])
    read = np.asarray(g["io_read_bytes"][:])
    assert len(list(outdir.iterdir())) == 32
    even, odd = written[0::2], written[1::2]
    assert np.all(even >= 1 << 20) and np.all(even < (1 << 20) + 4096), even
    # bellis's own /proc reads and resets between two blocks are subtracted exactly
    assert np.all(odd == 0), odd
    assert np.all(read[1::2] == 0), read


def _acquire_loop_worker(seen: str) -> Any:
    def worker() -> None:
        """A hand-written worker loop around Client.acquire_block (a 0-arg worker function)."""
        client = bellis.Client()
        while True:
            with client.acquire_block() as block:
                if block is None:
                    break
                time.sleep(0.01)
            # like profile_block, the measurement is attached to the block on the way out
            stats = block.stats
            (Path(seen) / str(block.block_id[1])).write_text(repr(stats.wall_seconds))

    return worker


def test_hand_written_acquire_block_loop_is_measured(tmp_path: Path) -> None:
    seen = tmp_path / "seen"
    seen.mkdir()
    task = bellis.Task(
        "loop",
        total_roi=Roi((0,), (80,)),
        read_roi=Roi((0,), (10,)),
        write_roi=Roi((0,), (10,)),
        process_function=_acquire_loop_worker(str(seen)),
        read_write_conflict=False,
        max_workers=2,
        tracking_path=str(tmp_path / "track" / "loop"),
        resource_tracking=True,
    )
    assert bellis.run_blockwise(task, progress=False, summary=False)
    g = zarr.open_group(str(tmp_path / "track" / "loop"), mode="r")
    wall = np.asarray(g["wall_seconds"][:])
    assert np.all(wall >= 0.01), wall
    assert np.all(np.asarray(g["peak_rss_bytes"][:]) > 1 << 20)
    # the worker's own writes of what it saw happen after each block: not in the figures
    assert np.all(np.asarray(g["io_write_bytes"][:]) == 0)
    report = task.report()
    assert report is not None and report.blocks.wall is not None and report.blocks.wall.n == 8
    seen_walls = sorted(float(p.read_text()) for p in seen.iterdir())
    assert len(seen_walls) == 8
    assert seen_walls == pytest.approx(sorted(wall.tolist()), rel=1e-5)


def _run_block_function_worker() -> None:
    """A 0-arg worker function that hands its blocks to Client.run_block_function."""
    bellis.Client().run_block_function(sleepy)


def test_client_run_block_function_as_a_worker_function(tmp_path: Path) -> None:
    task = bellis.Task(
        "rbf",
        total_roi=Roi((0,), (80,)),
        read_roi=Roi((0,), (10,)),
        write_roi=Roi((0,), (10,)),
        process_function=_run_block_function_worker,
        read_write_conflict=False,
        max_workers=2,
        tracking_path=str(tmp_path / "track" / "rbf"),
        resource_tracking=True,
    )
    states = bellis.run_blockwise(task, progress=False, summary=False, return_states=True)
    assert states["rbf"].completed_count == 8
    g = zarr.open_group(str(tmp_path / "track" / "rbf"), mode="r")
    wall = np.asarray(g["wall_seconds"][:])
    assert np.all(wall >= 0.02), wall
    assert set(np.asarray(g["worker_id"][:]).tolist()) <= {0, 1}
    assert wall.sum() <= (np.asarray(g["returned_at"][:]) - np.asarray(g["sent_at"][:])).sum()


def test_resource_arrays_that_cannot_be_created_stop_the_run_and_its_workers(
    tmp_path: Path,
) -> None:
    # a store that exists, whose resource arrays are still to be created: a dangling
    # symlink where one must go makes creating it fail (even for root), after the
    # workers have been started
    path = tmp_path / "track" / "t"
    # a first, untracked-resources run leaves the store with every block still to do
    first = _task(tmp_path, _always_fails, resource_tracking=False, max_retries=0)
    assert not bellis.run_blockwise(first, progress=False, summary=False)
    assert not (path / "wall_seconds").exists()
    (path / "wall_seconds").symlink_to(tmp_path / "nowhere" / "wall_seconds")
    task = _task(tmp_path, noop)
    with pytest.raises(bellis.TrackingError, match="wall_seconds") as raised:
        bellis.run_blockwise(task, progress=False, summary=False)
    # the run shut its workers down before raising (checked while the error, and with it
    # everything the run left behind, is still held)
    assert _live_workers() == []
    assert raised.value is not None


def _always_fails(block: Any) -> None:
    raise RuntimeError("not this time")


def _live_workers() -> list[int]:
    from bellis._worker._profiling import live_descendant_pids

    out = []
    for pid in live_descendant_pids():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if b"bellis._worker._main" in cmd and state != b"Z":
            out.append(pid)
    return out


def attach_bad_stats(block: Any) -> None:
    """Blocks 2 and 4 attach figures that cannot be recorded; the others measure normally."""
    if block.block_id[1] == 2:
        block.stats = bellis.BlockStats(wall_seconds=float("nan"), cpu_seconds=0.001)
    elif block.block_id[1] == 4:
        block.stats = {"wall_seconds": 0.1}


@pytest.mark.parametrize("multiprocessing", [False, True])
def test_unrecordable_attached_stats_fail_that_block_only(
    tmp_path: Path, multiprocessing: bool, caplog: pytest.LogCaptureFixture
) -> None:
    task = _task(tmp_path, attach_bad_stats, n=6, max_retries=0)
    with caplog.at_level("WARNING", logger="bellis"):
        states = bellis.run_blockwise(
            task, multiprocessing=multiprocessing, progress=False, summary=False, return_states=True
        )
    s = states["t"]
    assert (s.completed_count, s.failed_count) == (4, 2)
    g = zarr.open_group(str(tmp_path / "track" / "t"), mode="r")
    assert np.asarray(g["done"][:]).tolist() == [1, 1, 0, 1, 0, 1]
    assert np.isfinite(np.asarray(g["wall_seconds"][:])).all()
    assert task.report().blocks.wall.n == 4
    assert "block.stats.wall_seconds is nan; times must be finite" in caplog.text
    assert "block.stats is a dict; set it to a bellis.BlockStats" in caplog.text
    if multiprocessing:
        assert s.worker_failure_count == 0  # the block failed; its worker lived on
