"""Block functions and record-file helpers for the integration tests.

Block functions live here (an importable module) so workers load them by reference. Each
one appends to a per-block record file with ``O_APPEND``: a ``start`` line when the block
begins and a ``done`` line when it returns, both with the worker's pid and wall times.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bellis


def _append(recdir: str, task_id: str, sid: int, line: str) -> None:
    path = os.path.join(recdir, f"{task_id}__{sid}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _sid(block: Any) -> int:
    return int(block.block_id[1])


def _first_time(recdir: str, marker: str) -> bool:
    """Whether the file ``marker`` is new in ``recdir`` (it is there from now on): a block's
    first attempt, where later attempts find it."""
    path = os.path.join(recdir, marker)
    if os.path.exists(path):
        return False
    open(path, "w").close()
    return True


def sleep_block(recdir: str, delay: float, block: Any) -> None:
    """Sleep ``delay`` seconds, recording start and done."""
    sid = _sid(block)
    t0 = time.time()
    _append(recdir, block.block_id[0], sid, f"start {os.getpid()} {t0:.6f}")
    time.sleep(delay)
    print(f"processed block {sid}", flush=True)
    _append(recdir, block.block_id[0], sid, f"done {os.getpid()} {t0:.6f} {time.time():.6f}")


def fail_block(recdir: str, fail_ids: tuple[int, ...], block: Any) -> None:
    """Raise for the given block ids, succeed (quickly) for the others."""
    sid = _sid(block)
    t0 = time.time()
    _append(recdir, block.block_id[0], sid, f"start {os.getpid()} {t0:.6f}")
    if not fail_ids or sid in fail_ids:
        raise ValueError(f"injected failure in block {sid}")
    _append(recdir, block.block_id[0], sid, f"done {os.getpid()} {t0:.6f} {time.time():.6f}")


def crash_block(recdir: str, block: Any) -> None:
    """Record the start, then end the worker process at once (exit code 1), every time."""
    sid = _sid(block)
    _append(recdir, block.block_id[0], sid, f"start {os.getpid()} {time.time():.6f}")
    os._exit(1)


def hang_once_block(recdir: str, hang_id: int, block: Any) -> None:
    """Block ``hang_id`` hangs on its first attempt (a marker file says so)."""
    sid = _sid(block)
    t0 = time.time()
    _append(recdir, block.block_id[0], sid, f"start {os.getpid()} {t0:.6f}")
    if sid == hang_id and _first_time(recdir, f"hung_{sid}"):
        time.sleep(60)
    _append(recdir, block.block_id[0], sid, f"done {os.getpid()} {t0:.6f} {time.time():.6f}")


def hang_once_watched_block(recdir: str, hang_id: int, within: float, block: Any) -> None:
    """Block ``hang_id`` hangs on its first attempt, after writing its pid and start time
    to ``hung``. Every later block first waits, until ``within`` seconds after that start,
    for the hung worker's process to be gone (a worker on this machine), and writes
    ``gone <seconds after the hang began>`` or ``alive`` to ``hung_worker_seen_by_<block>``."""
    from kit.procs import pid_alive

    sid = _sid(block)
    t0 = time.time()
    _append(recdir, block.block_id[0], sid, f"start {os.getpid()} {t0:.6f}")
    hung = os.path.join(recdir, "hung")
    if sid == hang_id and _first_time(recdir, f"hung_{sid}"):
        with open(hung + ".tmp", "w") as f:
            f.write(f"{os.getpid()} {t0:.6f}")
        os.replace(hung + ".tmp", hung)
        time.sleep(60)
    elif os.path.exists(hung):
        with open(hung) as f:
            pid_text, began_text = f.read().split()
        pid, began = int(pid_text), float(began_text)
        while pid_alive(pid) and time.time() < began + within:
            time.sleep(0.05)
        seen = "alive" if pid_alive(pid) else f"gone {time.time() - began:.3f}"
        with open(os.path.join(recdir, f"hung_worker_seen_by_{sid}"), "w") as f:
            f.write(seen)
    _append(recdir, block.block_id[0], sid, f"done {os.getpid()} {t0:.6f} {time.time():.6f}")


def exit_once_block(recdir: str, exit_id: int, delay: float, block: Any) -> None:
    """Block ``exit_id`` makes its worker exit 0 on its first attempt."""
    sid = _sid(block)
    t0 = time.time()
    _append(recdir, block.block_id[0], sid, f"start {os.getpid()} {t0:.6f}")
    if sid == exit_id and _first_time(recdir, f"exited_{sid}"):
        sys.exit(0)
    time.sleep(delay)
    _append(recdir, block.block_id[0], sid, f"done {os.getpid()} {t0:.6f} {time.time():.6f}")


def memory_block(recdir: str, hog_id: int, block: Any) -> None:
    """Cap the worker's address space, then block ``hog_id`` allocates 2 GB (first try)."""
    import numpy as np

    sid = _sid(block)
    t0 = time.time()
    _append(recdir, block.block_id[0], sid, f"start {os.getpid()} {t0:.6f}")
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        # current usage plus 512 MiB of headroom
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[0])
        limit = pages * os.sysconf("SC_PAGE_SIZE") + (512 << 20)
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
    if sid == hog_id and _first_time(recdir, f"hogged_{sid}"):
        data = np.ones(2 << 30, dtype=np.uint8)
        del data
    _append(recdir, block.block_id[0], sid, f"done {os.getpid()} {t0:.6f} {time.time():.6f}")


def client_worker(recdir: str) -> None:
    """A 0-arg worker function: its own ``Client()`` loop."""
    client = bellis.Client()
    while True:
        with client.acquire_block() as block:
            if block is None:
                break
            sleep_block(recdir, 0.01, block)


def context_worker(recdir: str, *, context: Any) -> None:
    """A worker function taking ``context`` as a keyword-only argument."""
    client = bellis.Client(context)
    while True:
        with client.acquire_block() as block:
            if block is None:
                break
            sleep_block(recdir, 0.01, block)


@dataclass
class Attempt:
    kind: str
    pid: int
    t0: float
    t1: float | None


def read_records(recdir: str | Path) -> dict[tuple[str, int], list[Attempt]]:
    """``{(task_id, block_id): [attempts in file order]}``."""
    out: dict[tuple[str, int], list[Attempt]] = {}
    for p in Path(recdir).iterdir():
        if "__" not in p.name:
            continue
        task_id, sid = p.name.rsplit("__", 1)
        rows = []
        for line in p.read_text().splitlines():
            parts = line.split()
            t1 = float(parts[3]) if len(parts) > 3 else None
            rows.append(Attempt(parts[0], int(parts[1]), float(parts[2]), t1))
        out[(task_id, int(sid))] = rows
    return out


def done_ids(records: dict[tuple[str, int], list[Attempt]], task_id: str) -> list[int]:
    return sorted(
        sid
        for (t, sid), rows in records.items()
        if t == task_id and any(a.kind == "done" for a in rows)
    )


def done_count(records: dict[tuple[str, int], list[Attempt]], task_id: str, sid: int) -> int:
    return sum(1 for a in records.get((task_id, sid), []) if a.kind == "done")


def peak_concurrency(attempts: Iterable[Attempt]) -> int:
    """Most ``done`` attempts whose [t0, t1] intervals overlap at one instant."""
    events = []
    for a in attempts:
        if a.kind == "done" and a.t1 is not None:
            events.append((a.t0, 1))
            events.append((a.t1, -1))
    events.sort(key=lambda e: (e[0], e[1]))
    cur = peak = 0
    for _t, d in events:
        cur += d
        peak = max(peak, cur)
    return peak


def all_attempts(records: dict[tuple[str, int], list[Attempt]]) -> list[Attempt]:
    return [a for rows in records.values() for a in rows]


def total_roi(n: int, size: int = 10) -> tuple[Any, Any, Any]:
    """A 1-D task of ``n`` blocks of ``size``: (total, read, write) Rois."""
    roi = bellis.Roi
    return roi((0,), (n * size,)), roi((0,), (size,)), roi((0,), (size,))


def make_task(task_id: str, n: int, fn: Any, **kwargs: Any) -> Any:
    total, read, write = total_roi(n)
    kwargs.setdefault("read_write_conflict", False)
    return bellis.Task(task_id, total, read, write, process_function=fn, **kwargs)


def connect_and_return() -> None:
    """A 0-arg worker function that connects, then returns without asking for a block."""
    bellis.Client().close()


def env_sleep_block(block: Any) -> None:
    """``sleep_block`` with its record directory from ``$BELLIS_TEST_RECDIR`` (for the CLI)."""
    sleep_block(os.environ["BELLIS_TEST_RECDIR"], 0.01, block)


def stop_once_block(recdir: str, stop_id: int, block: Any) -> None:
    """Block ``stop_id`` stops its own worker (``SIGSTOP``) on its first attempt, a hang no
    timer inside the worker can end, after writing its pid to ``stopped_pid``. Every other
    block then waits up to 1.5 s (half the test's block timeout) for that worker to be gone
    and writes ``gone`` or ``alive`` to ``stopped_worker_seen_by_<block>``: only the
    server's kill can end it while the run lasts."""
    sid = _sid(block)
    t0 = time.time()
    _append(recdir, block.block_id[0], sid, f"start {os.getpid()} {t0:.6f}")
    pid_file = os.path.join(recdir, "stopped_pid")
    if sid == stop_id and _first_time(recdir, f"stopped_{sid}"):
        with open(pid_file + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(pid_file + ".tmp", pid_file)
        os.kill(os.getpid(), signal.SIGSTOP)
    if sid != stop_id and os.path.exists(pid_file):
        with open(pid_file) as f:
            pid = int(f.read())
        end = time.monotonic() + 1.5
        while _running(pid) and time.monotonic() < end:
            time.sleep(0.05)
        with open(os.path.join(recdir, f"stopped_worker_seen_by_{sid}"), "w") as f:
            f.write("alive" if _running(pid) else "gone")
    _append(recdir, block.block_id[0], sid, f"done {os.getpid()} {t0:.6f} {time.time():.6f}")


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that is neither a zombie nor gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] != b"Z"


def hang_block(recdir: str, block: Any) -> None:
    """Never finishes in time."""
    _append(recdir, block.block_id[0], _sid(block), f"start {os.getpid()} {time.time():.6f}")
    time.sleep(60)


def detach_and_return() -> None:
    """A 0-arg worker function that starts its worker detached and returns at once (the
    fire-and-forget mistake): the worker connects only after the function returned."""
    code = (
        "import time, bellis\n"
        "time.sleep(1.0)\n"
        "client = bellis.Client()\n"
        "while True:\n"
        "    with client.acquire_block() as block:\n"
        "        if block is None:\n"
        "            break\n"
    )
    subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def slow_first_attempt(recdir: str, seconds: float, block: Any) -> None:
    """Block 0 sleeps ``seconds`` (past a job's time limit) on its first attempt only (a
    marker file ``slept`` says so); then every block runs as ``sleep_block`` with no delay."""
    marker = Path(recdir) / "slept"
    if block.block_id[1] == 0 and not marker.exists():
        marker.touch()
        time.sleep(seconds)
    sleep_block(recdir, 0.0, block)
