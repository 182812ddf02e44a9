"""The tracking store as a user meets it: a full disk, two runs at once, a read-only
filesystem, a path whose folders do not exist yet.

Every case runs a user script in a subprocess through the public API (and the CLI), on a
real filesystem: the full-disk and read-only cases mount a small tmpfs, which needs root
(CI runs as root); elsewhere they skip and say why.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

SCRIPT = """
import os
import sys
import time

import bellis as daisy
from bellis import logging as blog

TRACK, REC, GO, LOGS = {track!r}, {rec!r}, {go!r}, {logs!r}
N, MP, RESOURCES, FILL = {n!r}, {mp!r}, {resources!r}, {fill!r}
FREE_BLOCKS, LOG_MODE = {free_blocks!r}, {log_mode!r}

blog.set_log_basedir(LOGS)
blog.set_log_mode(LOG_MODE)


def record(line):
    with open(REC, "a") as f:
        f.write(line + "\\n")


def process(block):
    i = block.block_id[1]
    record(f"start {{i}} {{os.getpid()}}")
    if i >= FREE_BLOCKS:  # hold the run open until the test says go
        deadline = time.monotonic() + 120
        while not os.path.exists(GO) and time.monotonic() < deadline:
            time.sleep(0.02)
    if FILL is not None and i == 0:  # the block's output fills the filesystem
        with open(FILL, "wb") as f:
            try:
                while True:
                    f.write(bytes(65536))
                    f.flush()
            except OSError:
                pass
    print(f"block {{i}} says hello " * 20)
    record(f"done {{i}}")


task = daisy.Task(
    "t",
    total_roi=daisy.Roi((0,), (N * 10,)),
    read_roi=daisy.Roi((0,), (10,)),
    write_roi=daisy.Roi((0,), (10,)),
    process_function=process,
    max_workers=2,
    resource_tracking=RESOURCES,
    tracking_path=TRACK,
)
ok = daisy.run_blockwise([task], multiprocessing=MP, progress=False)
print("RESULT", ok, flush=True)
sys.exit(0 if ok else 3)
"""

SIGBUS_CODES = (-signal.SIGBUS, 128 + signal.SIGBUS)
TRACKING_ERROR = "bellis.errors.TrackingError: "


def write_script(
    tmp_path: Path,
    track: Path,
    *,
    n: int = 6,
    mp: bool = False,
    resources: bool = False,
    fill: Path | None = None,
    free_blocks: int | None = None,
    logs: Path | None = None,
    log_mode: str = "file",
) -> Path:
    script = tmp_path / "driver.py"
    script.write_text(
        textwrap.dedent(SCRIPT).format(
            track=str(track),
            rec=str(tmp_path / "rec.txt"),
            go=str(tmp_path / "go"),
            logs=str(logs if logs is not None else tmp_path / "logs"),
            n=n,
            mp=mp,
            resources=resources,
            fill=None if fill is None else str(fill),
            free_blocks=n if free_blocks is None else free_blocks,
            log_mode=log_mode,
        )
    )
    return script


def start(script: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=script.parent,
    )


def run(script: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        cwd=script.parent,
        timeout=timeout,
    )


def events(tmp_path: Path) -> Counter[tuple[str, int]]:
    """How often each block started / finished, from the side-effect file."""
    rec = tmp_path / "rec.txt"
    if not rec.exists():
        return Counter()
    out: Counter[tuple[str, int]] = Counter()
    for line in rec.read_text().splitlines():
        kind, block = line.split()[:2]
        out[(kind, int(block))] += 1
    return out


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def store_done_cells(track: Path) -> list[bool]:
    """Which cells of a one-row store are done, read from `bellis status`'s map (it never
    takes the run's lock)."""
    report = status(track)
    if report.returncode != 0:
        return []
    lines = report.stdout.splitlines()
    for number, line in enumerate(lines):
        if line.strip().startswith("# done"):
            return [c == "#" for c in lines[number + 1].strip()]
    return []


def status(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bellis", "status", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


# -- a small real filesystem ------------------------------------------------------------


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs mounted for the test (root only), unmounted after it."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    mnt = tmp_path / "fs"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def free_bytes(directory: Path) -> int:
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def fill(directory: Path, leave_bytes: int) -> Path:
    """Fill ``directory``'s filesystem with one file until ENOSPC, then give back
    ``leave_bytes``."""
    filler = directory / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(bytes(65536))
                f.flush()
        except OSError:
            pass
    size = filler.stat().st_size
    os.truncate(filler, max(0, size - leave_bytes))
    assert free_bytes(directory) <= leave_bytes + 65536
    return filler


# -- defect 3: a full disk -----------------------------------------------------------------


@pytest.mark.parametrize("mp", [False, True], ids=["serial", "distributed"])
def test_full_disk_is_a_tracking_error_at_open(tmp_path: Path, small_fs: Path, mp: bool) -> None:
    n = 10_000
    track = small_fs / "store"
    filler = fill(small_fs, 96 * 1024)
    script = write_script(tmp_path, track, n=n, mp=mp, resources=True)
    done = run(script)
    assert done.returncode not in SIGBUS_CODES, "killed by SIGBUS"
    assert done.returncode != 0
    message = last_line(done.stderr)
    assert message.startswith(TRACKING_ERROR), done.stderr[-3000:]
    assert f"not enough disk space for block tracking at {track}" in message
    assert "tracking_path=" in message
    figures = re.search(r"needs (\d+) more bytes .* has (\d+) bytes .* free", message)
    assert figures is not None, message
    needed, free = int(figures.group(1)), int(figures.group(2))
    # 73 bytes per block with resource tracking, minus what is already there
    assert needed > free and needed >= 60 * n
    assert events(tmp_path) == Counter()  # no block ran

    # nothing is corrupt: with room again the same script runs every block once
    filler.unlink()
    done = run(script)
    assert done.returncode == 0, done.stderr[-3000:]
    counts = events(tmp_path)
    assert all(counts[("done", i)] == 1 for i in range(n)), "a block ran twice or never"
    report = status(track)
    assert report.returncode == 0, report.stderr
    assert re.search(rf"done\s+{n}\b", report.stdout), report.stdout


@pytest.mark.parametrize("log_mode", ["file", "both"])
@pytest.mark.parametrize("mp", [False, True], ids=["serial", "distributed"])
def test_full_disk_after_open_costs_the_logs_not_the_run(
    tmp_path: Path, small_fs: Path, mp: bool, log_mode: str
) -> None:
    # the store fits; block 0 then fills the filesystem that also holds the worker logs
    # and runs.jsonl
    n = 6
    track = small_fs / "store"
    script = write_script(
        tmp_path,
        track,
        n=n,
        mp=mp,
        fill=small_fs / "output",
        logs=small_fs / "logs",
        log_mode=log_mode,
    )
    done = run(script)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "RESULT True" in done.stdout
    assert "could not append this run's report" in done.stderr
    assert "worker log" in done.stderr  # the lost log output is reported too
    assert "Traceback" not in done.stderr
    if log_mode == "both":  # the terminal still gets every block's output
        assert all(f"block {i} says hello" in done.stdout + done.stderr for i in range(n))
    counts = events(tmp_path)
    assert all(counts[("done", i)] == 1 for i in range(n)), counts
    report = status(track)
    assert re.search(rf"done\s+{n}\b", report.stdout), report.stdout

    # the block states were kept: a second run does nothing
    (small_fs / "output").unlink()
    again = run(script)
    assert again.returncode == 0, again.stderr[-3000:]
    assert events(tmp_path) == counts


# -- defect 4: two runs on one store -------------------------------------------------------


@pytest.mark.parametrize("mp", [False, True], ids=["serial", "distributed"])
def test_two_drivers_at_once_only_one_runs(tmp_path: Path, mp: bool) -> None:
    n = 6
    track = tmp_path / "track" / "t"
    # every block waits for the go file, so the two drivers surely overlap
    script = write_script(tmp_path, track, n=n, mp=mp, free_blocks=0)
    first, second = start(script), start(script)
    procs = {first.pid: first, second.pid: second}
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and all(p.poll() is None for p in procs.values()):
            time.sleep(0.05)
        (tmp_path / "go").touch()
        outputs = {pid: p.communicate(timeout=300) for pid, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    codes = {pid: p.returncode for pid, p in procs.items()}
    winners = [pid for pid, code in codes.items() if code == 0]
    losers = [pid for pid, code in codes.items() if code != 0]
    assert len(winners) == 1 and len(losers) == 1, (codes, outputs)
    message = last_line(outputs[losers[0]][1])
    assert message.startswith(TRACKING_ERROR), outputs[losers[0]][1][-3000:]
    assert f"block tracking at {track} is in use by another run" in message
    assert f"pid {winners[0]} on host " in message
    assert re.search(r"started \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", message), message
    counts = events(tmp_path)
    assert all(counts[("done", i)] == 1 for i in range(n)), counts
    assert all(counts[("start", i)] == 1 for i in range(n)), counts


RESET = """
import bellis as daisy

task = daisy.Task(
    "t",
    total_roi=daisy.Roi((0,), (40,)),
    read_roi=daisy.Roi((0,), (10,)),
    write_roi=daisy.Roi((0,), (10,)),
    process_function=lambda block: None,
    tracking_path={track!r},
)
print("RESET", task.reset())
"""


def test_a_store_a_run_holds_is_read_but_not_reset(tmp_path: Path) -> None:
    track = tmp_path / "track" / "t"
    script = write_script(tmp_path, track, n=4, free_blocks=2)
    reset = tmp_path / "reset.py"
    reset.write_text(textwrap.dedent(RESET).format(track=str(track)))
    proc = start(script)
    try:
        deadline = time.monotonic() + 120
        while events(tmp_path)[("start", 2)] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        report = status(track)  # not blocked by the run's lock
        assert report.returncode == 0, report.stderr
        assert re.search(r"done\s+2\b", report.stdout), report.stdout
        refused = run(reset)  # Task.reset() would delete the run's records
        assert refused.returncode != 0
        message = last_line(refused.stderr)
        assert message.startswith(TRACKING_ERROR), refused.stderr[-3000:]
        assert f"pid {proc.pid} on host " in message
        assert (track / "done").is_dir()
    finally:
        (tmp_path / "go").touch()
        _out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert all(events(tmp_path)[("done", i)] == 1 for i in range(4))
    done = run(reset)  # the run is over: the store can go
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"RESET {track}" in done.stdout
    assert not track.exists()


@pytest.mark.parametrize("mp", [False, True], ids=["serial", "distributed"])
def test_after_the_holder_is_killed_a_new_run_resumes(tmp_path: Path, mp: bool) -> None:
    n = 8
    track = tmp_path / "track" / "t"
    script = write_script(tmp_path, track, n=n, mp=mp, free_blocks=3)
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            counts = events(tmp_path)
            if all(counts[("done", i)] for i in range(3)) and counts[("start", 3)]:
                break
            time.sleep(0.05)
        else:
            pytest.fail(f"the first run never reached block 3: {events(tmp_path)}")
        # a worker reports finished blocks with its next request, so in distributed mode
        # the store may lag the side-effect file: wait (bounded) until it shows them
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and store_done_cells(track)[:3] != [True] * 3:
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its workers
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    killed = events(tmp_path)
    recorded = [i for i, is_done in enumerate(store_done_cells(track)) if is_done]
    assert recorded, "the killed run recorded no finished block in its store"
    (tmp_path / "go").touch()
    done = run(script)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "in use by another run" not in done.stderr
    counts = events(tmp_path)
    # every block finished; the blocks the killed run recorded as done did not run again
    assert all(counts[("done", i)] >= 1 for i in range(n)), counts
    assert all(counts[("done", i)] == 1 for i in recorded), (recorded, counts)
    # blocks the killed run had not finished ran in the new one
    assert all(counts[("start", i)] > killed[("start", i)] for i in range(3, n)), counts


# -- a read-only filesystem, a path that does not exist yet --------------------------------


def test_store_on_a_read_only_filesystem(tmp_path: Path, small_fs: Path) -> None:
    track = small_fs / "store"
    script = write_script(tmp_path, track, n=5)
    first = run(script)
    assert first.returncode == 0, first.stderr[-3000:]
    remount = subprocess.run(
        ["mount", "-o", "remount,ro", str(small_fs)], capture_output=True, text=True
    )
    if remount.returncode != 0:
        pytest.skip(f"cannot remount the tmpfs read-only: {remount.stderr.strip()}")
    again = run(script)
    assert again.returncode != 0
    message = last_line(again.stderr)
    assert message.startswith(TRACKING_ERROR), again.stderr[-3000:]
    assert f"block tracking at {track} is on a read-only filesystem" in message
    assert "tracking_path=" in message
    report = status(track)
    assert report.returncode == 0, report.stderr
    assert re.search(r"done\s+5\b", report.stdout), report.stdout
    assert events(tmp_path)[("done", 0)] == 1


def test_tracking_path_in_folders_that_do_not_exist(tmp_path: Path) -> None:
    track = tmp_path / "not" / "there" / "yet" / "t"
    script = write_script(tmp_path, track, n=4, mp=True)
    done = run(script)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (track / "zarr.json").is_file()
    again = run(script)
    assert again.returncode == 0, again.stderr[-3000:]
    assert all(events(tmp_path)[("done", i)] == 1 for i in range(4))
