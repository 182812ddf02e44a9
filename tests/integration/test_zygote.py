"""Local workers forked from the run's zygote (issue 18 item 6): what a forked worker holds
(descriptors, threads, memory figures), and that the zygote goes away with the run, with the
driver, and falls back to spawning when it is gone.

Each test writes a driver script into ``tmp_path`` and runs it with ``sys.executable``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import zarr

from kit.procs import pid_alive
from kit.user_script import run_script

HEAD = """
import json, os, resource, sys, threading
import bellis

OUT = sys.argv[1]


def record(block, extra=None):
    fds = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            fds[name] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            pass  # the listing's own descriptor, closed by now
    ppid = os.getppid()
    with open(f"/proc/{ppid}/cmdline", "rb") as f:
        parent_cmd = f.read().replace(b"\\0", b" ").decode()
    row = {
        "block": block.block_id[1],
        "pid": os.getpid(),
        "ppid": ppid,
        "parent_cmd": parent_cmd,
        "parent_threads": len(os.listdir(f"/proc/{ppid}/task")),
        "fds": fds,
        "threads": len(os.listdir("/proc/self/task")),
        "thread_names": sorted(t.name for t in threading.enumerate()),
        "maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "cwd": os.getcwd(),
        "env": os.environ.get("ZYGOTE_TEST_VAR"),
    }
    with open(os.path.join(OUT, f"{os.getpid()}-{block.block_id[1]}.json"), "w") as f:
        json.dump(row, f)


def task(name, n, fn, **kw):
    return bellis.Task(
        name,
        bellis.Roi((0,), (n,)),
        bellis.Roi((0,), (1,)),
        bellis.Roi((0,), (1,)),
        process_function=fn,
        **kw,
    )
"""


#: every worker forked (the default policy spawns the workers of a run that has a core for
#: each; tests/integration/test_start_policy.py covers that choice)
FORK_ALL = {"BELLIS_WORKER_START": "fork"}


def _run(tmp_path: Path, body: str, env: dict[str, str] | None = None) -> list[dict]:
    out = tmp_path / "out"
    out.mkdir()
    text = textwrap.dedent(HEAD) + textwrap.dedent(body)
    proc = run_script(
        tmp_path, text, str(out), name="driver.py", timeout=300, env=FORK_ALL | (env or {})
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]


def test_a_forked_worker_holds_its_own_descriptors_and_no_inherited_thread(
    tmp_path: Path,
) -> None:
    rows = _run(
        tmp_path,
        """
        # a descriptor of the driver's, open while the run goes on: no worker may hold it
        held = open(os.path.join(OUT, "driver-held.txt"), "w")
        os.environ["ZYGOTE_TEST_VAR"] = "set-by-driver"
        os.mkdir("elsewhere")
        os.chdir("elsewhere")
        state = bellis.run_blockwise(
            [task("t", 6, record, max_workers=2)], progress=False, return_states=True
        )["t"]
        assert state.completed_count == 6, state
        print(os.getpid())
        """,
    )
    assert len(rows) == 6
    for row in rows:
        # forked from the zygote, which is one thread, not from the driver
        assert "bellis._launchers._zygote import serve" in row["parent_cmd"], row
        assert row["parent_threads"] == 1, row
        fds = row["fds"]
        assert fds["0"].startswith("pipe:"), fds  # the payload pipe, read to its end
        slot = fds["1"].rsplit("worker_", 1)[1].split(".")[0]
        assert fds["1"].endswith(f"daisy_logs/t/worker_{slot}.out"), fds
        assert fds["2"].endswith(f"daisy_logs/t/worker_{slot}.err"), fds
        for fd, target in fds.items():
            if int(fd) > 2:
                # the worker's own connection to the server; nothing of the zygote (its
                # socket, pidfds) or the driver (its files)
                assert target.startswith("socket:"), fds
        assert not any("driver-held" in t for t in fds.values())
        # its threads are its own: the main one and bellis's block-timeout watchdog
        assert set(row["thread_names"]) <= {"MainThread", "bellis-watchdog"}, row
        assert row["threads"] == len(row["thread_names"]), row
        assert row["cwd"] == str(tmp_path / "elsewhere")
        assert row["env"] == "set-by-driver"
    # each slot's log has the worker's output, nothing of the zygote's
    err = (tmp_path / "elsewhere" / "daisy_logs" / "t" / "worker_0.err").read_text()
    assert "Traceback" not in err


def test_peak_rss_is_the_workers_own_not_the_zygotes(tmp_path: Path) -> None:
    """The driver holds 400 MiB when the zygote starts: an exec'd process inherits that as
    its ``ru_maxrss`` (a spawned worker, the zygote), a forked one does not; and the
    recorded per-block peak is each block's own (one block allocates 64 MiB)."""
    track = tmp_path / "track"
    rows = _run(
        tmp_path,
        f"""
        ballast = bytearray(400 << 20)
        for i in range(0, len(ballast), 4096):
            ballast[i] = 1
        bellis.set_tracking_basedir({str(track)!r})

        def fn(block):
            if block.block_id[1] == 3:
                big = bytearray(64 << 20)
                for i in range(0, len(big), 4096):
                    big[i] = 1
                del big
            record(block)

        state = bellis.run_blockwise(
            [task("rss", 6, fn, max_workers=2, resource_tracking=True)],
            progress=False,
            return_states=True,
        )["rss"]
        assert state.completed_count == 6, state
        """,
    )
    assert len(rows) == 6
    for row in rows:
        assert "bellis._launchers._zygote" in row["parent_cmd"]
        assert row["maxrss_bytes"] < 200 << 20, row  # not the driver's 400 MiB
    peaks = np.asarray(zarr.open_group(str(track / "rss"), mode="r")["peak_rss_bytes"][:])
    assert peaks[3] >= 64 << 20
    others = np.delete(peaks, 3)
    assert np.all(others > 1 << 20) and np.all(others < 150 << 20), peaks


def test_spawn_is_the_fallback_when_asked(tmp_path: Path) -> None:
    rows = _run(
        tmp_path,
        """
        state = bellis.run_blockwise(
            [task("t", 2, record, max_workers=1)], progress=False, return_states=True
        )["t"]
        assert state.completed_count == 2, state
        """,
        env={"BELLIS_WORKER_START": "spawn"},
    )
    assert rows and all("bellis._launchers._zygote" not in r["parent_cmd"] for r in rows)
    assert all("driver.py" in r["parent_cmd"] for r in rows)


def test_a_run_survives_its_zygote_being_killed(tmp_path: Path) -> None:
    """Whoever kills the zygote mid-run costs its workers (stopped, their blocks retried),
    not the run: the replacements are spawned."""
    rows = _run(
        tmp_path,
        """
        import signal, time

        def fn(block):
            record(block)
            with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
                forked = b"bellis._launchers._zygote" in f.read()
            if block.block_id[1] == 2 and forked:
                os.kill(os.getppid(), signal.SIGKILL)  # the zygote
                time.sleep(30)  # stopped by the driver long before this ends
            time.sleep(0.05)

        state = bellis.run_blockwise(
            [task("t", 12, fn, max_workers=2, max_retries=3)],
            progress=False,
            return_states=True,
        )["t"]
        assert state.completed_count == 12 and state.failed_count == 0, state
        """,
    )
    spawned = [r for r in rows if "driver.py" in r["parent_cmd"]]
    assert spawned, rows
    assert {r["block"] for r in rows} == set(range(12))


def test_the_zygote_and_its_workers_end_with_the_driver(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "driver.py"
    script.write_text(
        textwrap.dedent(HEAD)
        + textwrap.dedent(
            """
            import time

            def fn(block):
                record(block)
                time.sleep(60)

            bellis.run_blockwise([task("t", 4, fn, max_workers=2)], progress=False)
            """
        )
    )
    proc = subprocess.Popen(
        [sys.executable, str(script), str(out)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **FORK_ALL},
    )
    try:
        deadline = time.monotonic() + 120
        while len(list(out.glob("*.json"))) < 2:
            assert proc.poll() is None
            assert time.monotonic() < deadline, "the workers never started"
            time.sleep(0.05)
        rows = [json.loads(p.read_text()) for p in out.glob("*.json")]
        pids = {r["pid"] for r in rows} | {r["ppid"] for r in rows}
        assert all(pid_alive(p) for p in pids)
        proc.kill()  # the driver dies without a chance to clean up
        proc.wait()
        deadline = time.monotonic() + 10
        while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [p for p in pids if pid_alive(p)]
        for p in left:
            os.kill(p, signal.SIGKILL)
        assert not left, f"left behind: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
