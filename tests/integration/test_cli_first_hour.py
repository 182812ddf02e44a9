"""Issue 24 item 7: the `bellis` command's rough edges, each as a new user meets it, from a
subprocess: help and version, `status` of a basedir, `--watch` before the run has made its
store and piped into `head`, the trace file's mode, and the demo's volume at a large size."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

BELLIS = [sys.executable, "-m", "bellis"]

#: a user's pipeline: two tasks with tracking under a basedir; the blocks of `second` wait
#: until the file named by argv[2] exists (so a run can be held in progress), if given
PIPELINE = textwrap.dedent(
    """
    import os, sys, time
    import bellis
    from bellis import Roi

    base, gate = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else None)

    def first(block):
        pass

    def second(block):
        while gate is not None and not os.path.exists(gate):
            time.sleep(0.02)

    bellis.set_tracking_basedir(base)
    a = bellis.Task("first", total_roi=Roi((0, 0), (40, 40)), read_roi=Roi((0, 0), (10, 10)),
                    write_roi=Roi((0, 0), (10, 10)), process_function=first, max_workers=1,
                    read_write_conflict=False)
    b = bellis.Task("second", total_roi=Roi((0, 0), (20, 30)), read_roi=Roi((0, 0), (10, 10)),
                    write_roi=Roi((0, 0), (10, 10)), process_function=second, max_workers=1,
                    read_write_conflict=False)
    ok = bellis.run_blockwise([a, b], progress=False, summary=False)
    sys.exit(0 if ok else 1)
    """
)


def _script(tmp_path: Path) -> Path:
    path = tmp_path / "pipeline.py"
    path.write_text(PIPELINE)
    return path


def _run(*args: str, cwd: Path | None = None, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*BELLIS, *args], capture_output=True, text=True, timeout=120, cwd=cwd, **kw
    )  # type: ignore[call-overload, no-any-return]


def test_help_is_plain_text_and_there_is_a_version() -> None:
    from importlib.metadata import version

    helped = _run("--help")
    assert helped.returncode == 0
    assert "``" not in helped.stdout and ":mod:" not in helped.stdout
    assert "status" in helped.stdout and "report" in helped.stdout
    shown = _run("--version")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == f"bellis {version('bellis')}"


def test_status_of_a_basedir_shows_every_task(tmp_path: Path) -> None:
    base = tmp_path / "tracking"
    done = subprocess.run(
        [sys.executable, str(_script(tmp_path)), str(base)], capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    proc = _run("status", str(base))
    assert proc.returncode == 0, proc.stderr
    heads = [line for line in proc.stdout.splitlines() if line.startswith("block tracking at")]
    assert [h.rsplit("/", 1)[-1] for h in heads] == ["first", "second"]
    rows = [line.split() for line in proc.stdout.splitlines()]
    assert ["done", "16"] in rows and ["done", "6"] in rows  # 4x4 and 2x3 blocks
    # --watch follows one store: a basedir is refused, naming what it holds
    watched = _run("status", str(base), "--watch", "0.1")
    assert watched.returncode == 2
    assert "first, second" in watched.stderr and "Traceback" not in watched.stderr


def test_watch_waits_for_the_store_and_a_closed_pipe_ends_it_quietly(tmp_path: Path) -> None:
    base, gate = tmp_path / "tracking", tmp_path / "gate"
    store = base / "second"
    watch = subprocess.Popen(
        [*BELLIS, "status", str(store), "--watch", "0.05"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    head = subprocess.Popen(["head", "-n", "1"], stdin=watch.stdout, stdout=subprocess.PIPE)
    assert watch.stdout is not None and watch.stderr is not None
    watch.stdout.close()  # head holds the pipe now, as in `bellis status ... | head -n 1`
    # the store does not exist yet: the watch says it waits, and does not exit
    waiting = watch.stderr.readline().decode()
    assert "no tracking store at" in waiting and "waiting for a run" in waiting
    assert watch.poll() is None
    run = subprocess.Popen(
        [sys.executable, str(_script(tmp_path)), str(base), str(gate)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        first_line = head.communicate(timeout=120)[0].decode()
        # the run is held in progress by the gate: the watch keeps writing into a closed
        # pipe, and must end at once, without a traceback
        rc = watch.wait(timeout=60)
        rest = watch.stderr.read().decode()
        assert " of 6 blocks done" in first_line, first_line
        assert "Traceback" not in rest and "BrokenPipeError" not in rest, rest
        assert rc == 128 + signal.SIGPIPE
        assert run.poll() is None  # the run was still going: the pipe, not the run, ended it
    finally:
        gate.touch()
        run.communicate(timeout=120)
        if watch.poll() is None:
            watch.kill()
        watch.wait()
        watch.stderr.close()
    assert run.returncode == 0


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_the_trace_and_the_report_get_the_users_umask(
    tmp_path: Path, umask: int, mode: int
) -> None:
    base = tmp_path / "tracking"
    done = subprocess.run(
        [sys.executable, str(_script(tmp_path)), str(base)], capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    trace, page = tmp_path / "trace.json", tmp_path / "report.html"
    proc = _run(
        "report",
        str(base),
        "--trace",
        str(trace),
        "-o",
        str(page),
        preexec_fn=lambda: os.umask(umask),
    )
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(trace.stat().st_mode) == mode
    assert stat.S_IMODE(page.stat().st_mode) == mode


def _blobs_ground_truth(n: int, seed: int = 0) -> np.ndarray:
    """The demo volume as the demo's docstring defines it, over the whole volume at once."""
    rng = np.random.default_rng(seed)
    zz, yy, xx = np.meshgrid(*(np.arange(n),) * 3, indexing="ij")
    vol = np.zeros((n, n, n), dtype=np.float64)
    for _ in range(max(4, n // 6)):
        c = rng.uniform(0, (n, n, n))
        r = rng.uniform(3, 9)
        vol += np.exp(-((zz - c[0]) ** 2 + (yy - c[1]) ** 2 + (xx - c[2]) ** 2) / (2 * r * r))
    vol += rng.normal(0, 0.05, (n, n, n))
    return vol


def test_the_demo_says_what_it_builds_and_builds_the_same_volume(tmp_path: Path) -> None:
    import zarr

    proc = subprocess.Popen(
        [*BELLIS, "demo", "--workdir", str(tmp_path / "demo"), "--size", "70", "--serial"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    lines = [line for line in err.splitlines() if line.startswith("bellis demo:")]
    assert "building the 70x70x70 volume" in lines[0]
    # one line per slab of 32 planes, the last at the full depth
    assert [line.split()[3] for line in lines[1:]] == ["32", "64", "70"]
    raw = zarr.open_group(str(tmp_path / "demo" / "demo.zarr"), mode="r")["raw"][:]
    truth = _blobs_ground_truth(70)
    assert np.abs(raw - truth).max() < 1e-5
    assert np.array_equal(raw > 0.25, truth > 0.25)
    assert "Wrote" in out


def test_a_large_demo_reports_progress_while_it_builds(tmp_path: Path) -> None:
    """`bellis demo --size 320` used to be silent for half a minute: now the first progress
    line comes before the volume is done, and each slab says so."""
    proc = subprocess.Popen(
        [*BELLIS, "demo", "--workdir", str(tmp_path / "demo"), "--size", "320"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    try:
        seen = [proc.stderr.readline() for _ in range(3)]
        assert "building the 320x320x320 volume (125 MiB)" in seen[0]
        assert seen[1].split()[3:] == ["32", "of", "320", "planes"]
        assert seen[2].split()[3:] == ["64", "of", "320", "planes"]
    finally:
        # killed, not interrupted: a suite run as a background job (`pytest ... &`) starts
        # every process with SIGINT ignored, and the demo would then build on for a minute
        proc.kill()
        proc.communicate()


def test_status_of_a_basedir_with_a_broken_store_shows_the_others(tmp_path: Path) -> None:
    base = tmp_path / "tracking"
    done = subprocess.run(
        [sys.executable, str(_script(tmp_path)), str(base)], capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    (base / "first" / "done" / "zarr.json").write_text("{not json")
    proc = _run("status", str(base))
    assert proc.returncode == 2
    assert str(base / "first") in proc.stderr and "Traceback" not in proc.stderr
    heads = [line for line in proc.stdout.splitlines() if line.startswith("block tracking at")]
    assert [h.rsplit("/", 1)[-1] for h in heads] == ["second"]
    missing = _run("status", str(tmp_path / "nothing"))
    assert missing.returncode == 2 and "no block tracking at" in missing.stderr


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["demo", "--size", "-3"], "--size"),
        (["demo", "--workers", "0"], "--workers"),
        (["status", ".", "--block", ""], "--block"),
        (["status", ".", "--watch", "-1"], "--watch"),
    ],
)
def test_bad_cli_input_is_a_clear_error(tmp_path: Path, args: list[str], names: str) -> None:
    proc = _run(*args, cwd=tmp_path)
    assert proc.returncode == 2
    assert names in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "bellis-demo").exists()
