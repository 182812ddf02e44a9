"""``Task(setup=...)`` at two edges (issue 37): a SIGTERM in the instant between a setup's
``__enter__`` returning and its teardown's registration, and a setup that runs longer
than ``stall_timeout`` (which bounds blocks, not setups). As a user runs bellis: scripts
in subprocesses, real worker processes on 127.0.0.1, real files. Setups and teardowns
write a file named by their process's pid, one line per call.
"""

from __future__ import annotations

import json
from pathlib import Path

from kit.user_script import run_script

#: how long a run may take on a loaded machine, at most: never a figure the outcome
#: depends on
PATIENCE = 120.0


def _calls(rec: Path, kind: str) -> dict[int, int]:
    """Per pid, how many times ``kind`` (setup, teardown, sigterm) ran in it."""
    return {
        int(p.name.split("_")[1]): len(p.read_text().splitlines())
        for p in rec.iterdir()
        if p.name.startswith(kind + "_")
    }


def _records(tmp_path: Path, task: str) -> list[dict[str, object]]:
    path = tmp_path / "tracking" / task / "errors.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


# -- a SIGTERM just after the setup returned ----------------------------------------------

# The window is a few bytecodes wide; the first worker's setup opens it on purpose: it
# installs a profile function (sys.setprofile, plain Python) that, at the return of
# contextlib's __enter__ (the setup's generator has reached its yield and the value goes
# back to bellis, which has not registered the teardown yet), sends the process its
# SIGTERM. raise_signal delivers it to the calling thread at once: no race.
GAP = """
import contextlib
import os
import signal
import sys
from pathlib import Path

import bellis
from bellis import Roi

HERE = Path(__file__).parent
REC = HERE / "records"
DONE = HERE / "done"
ARMED = HERE / "armed"


def note(kind):
    with open(REC / f"{kind}_{os.getpid()}", "a") as f:
        f.write("x\\n")


def sigterm_as_enter_returns(frame, event, arg):
    if (
        event == "return"
        and frame.f_code.co_name == "__enter__"
        and frame.f_globals.get("__name__") == "contextlib"
    ):
        sys.setprofile(None)
        note("sigterm")
        signal.raise_signal(signal.SIGTERM)


@contextlib.contextmanager
def warm():
    note("setup")
    if not ARMED.exists():  # the first worker only
        ARMED.touch()
        sys.setprofile(sigterm_as_enter_returns)
    try:
        yield os.getpid()
    finally:
        note("teardown")


def process(block, pid):
    assert pid == os.getpid()
    (DONE / f"{block.block_id[1]}_{pid}").touch()


def main():
    REC.mkdir()
    DONE.mkdir()
    bellis.logging.set_log_basedir(HERE / "logs")
    bellis.set_tracking_basedir(HERE / "tracking")
    task = bellis.Task(
        "t",
        total_roi=Roi((0,), (4,)),
        read_roi=Roi((0,), (1,)),
        write_roi=Roi((0,), (1,)),
        process_function=process,
        setup=warm,
        read_write_conflict=False,
        max_workers=1,
        max_worker_restarts=1,
    )
    ok = bellis.run_blockwise([task], progress=False)
    sys.exit(0 if ok else 3)


if __name__ == "__main__":
    main()
"""


def test_a_sigterm_as_the_setups_enter_returns_runs_its_teardown_once(tmp_path: Path) -> None:
    proc = run_script(tmp_path, GAP, name="gap.py", timeout=PATIENCE)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    rec = tmp_path / "records"
    (first,) = _calls(rec, "sigterm")  # the SIGTERM came in one worker
    setups, teardowns = _calls(rec, "setup"), _calls(rec, "teardown")
    # that worker's setup completed: its teardown ran, exactly once, and it took no block
    assert setups[first] == 1 and teardowns.get(first) == 1, (setups, teardowns)
    done = sorted(p.name for p in (tmp_path / "done").iterdir())
    (second,) = set(setups) - {first}  # its replacement did the blocks
    assert done == [f"{i}_{second}" for i in range(4)], done
    assert setups == {first: 1, second: 1} and teardowns == {first: 1, second: 1}


# -- a setup longer than stall_timeout ----------------------------------------------------

# The setup idles (a sleep: no CPU, no IO, no heartbeat) for several stall_timeouts, well
# within the task's timeout: it must not be ended as stalled.
IDLE_SETUP = """
import os
import sys
import time
from pathlib import Path

import bellis
from bellis import Roi

HERE = Path(__file__).parent
REC = HERE / "records"
DONE = HERE / "done"


def open_volume():
    with open(REC / f"setup_{os.getpid()}", "a") as f:
        f.write("x\\n")
    time.sleep(float(os.environ["SETUP_SECONDS"]))  # idle, as a setup waiting on a server
    return "volume"


def process(block, volume):
    (DONE / f"{block.block_id[1]}_{volume}_{os.getpid()}").touch()


def main():
    REC.mkdir()
    DONE.mkdir()
    bellis.logging.set_log_basedir(HERE / "logs")
    bellis.set_tracking_basedir(HERE / "tracking")
    task = bellis.Task(
        "A",
        total_roi=Roi((0,), (4,)),
        read_roi=Roi((0,), (1,)),
        write_roi=Roi((0,), (1,)),
        process_function=process,
        read_write_conflict=False,
        max_workers=1,
        max_worker_restarts=0,
        timeout=PATIENCE_TIMEOUT,
        stall_timeout=0.2,
        setup=open_volume,
    )
    ok = bellis.run_blockwise([task], progress=False)
    sys.exit(0 if ok else 3)


if __name__ == "__main__":
    main()
"""


def test_a_setup_longer_than_stall_timeout_is_not_ended(tmp_path: Path) -> None:
    script = IDLE_SETUP.replace("PATIENCE_TIMEOUT", repr(PATIENCE))
    proc = run_script(
        tmp_path, script, name="idle.py", env={"SETUP_SECONDS": "1.0"}, timeout=PATIENCE
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    (pid,) = _calls(tmp_path / "records", "setup")  # one worker: no restart
    done = sorted(p.name for p in (tmp_path / "done").iterdir())
    assert done == [f"{i}_volume_{pid}" for i in range(4)], done
    assert _records(tmp_path, "A") == []
    assert "stalled" not in out, out
