"""A run killed midway under new code, then resumed (issue 26): the driver is SIGKILLed
once under version 1 of the code and once under version 2; the done blocks of both
versions are accounted for (the store's arrays, ``bellis status``, which blocks ran), and
the resume finishes the rest under version 2's fingerprint. Serial and distributed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from kit.user_script import run_script

SCRIPT = """
import os
import sys
import time

import bellis as daisy
from funlib.geometry import Roi

VERSION = 1


def work(block):
    time.sleep(0.2)
    folder = os.environ["RECORDS"]
    os.makedirs(folder, exist_ok=True)
    open(os.path.join(folder, f"{block.block_id[1]}_v{VERSION}"), "w").close()


daisy.set_tracking_basedir("tracking")
t = daisy.Task("K", Roi((0,), (300,)), Roi((0,), (10,)), Roi((0,), (10,)), work,
               read_write_conflict=False, max_workers=2,
               on_code_change=os.environ.get("POLICY", "warn"))
ok = daisy.run_blockwise([t], multiprocessing=os.environ["MODE"] == "dist", progress=False)
sys.exit(0 if ok else 3)
"""

N = 30
V2 = SCRIPT.replace("VERSION = 1", "VERSION = 2")


def _arrays(store: Path) -> tuple[np.ndarray, np.ndarray]:
    """(done, code_version) per block, read with zarr."""
    if not (store / "code_version" / "zarr.json").exists():
        return np.zeros(N, dtype=bool), np.zeros(N, dtype=np.uint16)
    g = zarr.open_group(str(store), mode="r")
    return np.asarray(g["done"][:]) != 0, np.asarray(g["code_version"][:])


def _ran(tmp_path: Path, records: str) -> dict[int, str]:
    folder = tmp_path / records
    if not folder.exists():
        return {}
    out = {}
    for p in folder.iterdir():
        sid, version = p.name.split("_")
        out[int(sid)] = version
    return out


def _run_and_kill(tmp_path: Path, text: str, records: str, mode: str, at_least: int) -> None:
    """Start the script; SIGKILL its driver once ``at_least`` blocks are done."""
    (tmp_path / "killed.py").write_text(text)
    env = {**os.environ, "RECORDS": records, "MODE": mode}
    proc = subprocess.Popen(
        [sys.executable, "killed.py"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    store = tmp_path / "tracking" / "K"
    deadline = time.monotonic() + 300
    try:
        while int(np.count_nonzero(_arrays(store)[0])) < at_least:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the run never got that far"
            time.sleep(0.02)
    finally:
        proc.kill()  # SIGKILL the driver: the crash
        proc.wait(timeout=60)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # and its workers, if any are left
        except ProcessLookupError:
            pass
        if proc.stderr is not None:
            proc.stderr.close()


def _status_versions(store: Path) -> dict[int, int]:
    proc = subprocess.run(
        [sys.executable, "-m", "bellis", "status", str(store)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return {
        int(m.group(1)): int(m.group(2))
        for m in re.finditer(r"version (\d+): (\d+) blocks", proc.stdout)
    }


@pytest.mark.parametrize("mode", ["serial", "dist"])
def test_killed_under_new_code_then_resumed(tmp_path: Path, mode: str) -> None:
    store = tmp_path / "tracking" / "K"
    _run_and_kill(tmp_path, SCRIPT, "run1", mode, at_least=4)
    done1, codes1 = _arrays(store)
    k1 = int(np.count_nonzero(done1))
    assert 4 <= k1 < N - 8, f"{k1} of {N} blocks were done when run 1 was killed"
    assert set(codes1[done1].tolist()) == {1}
    ran1 = _ran(tmp_path, "run1")
    assert set(np.flatnonzero(done1).tolist()) <= set(ran1)  # done means it ran

    # version 2, killed too: v1's done blocks are kept (the default), new ones are v2's
    _run_and_kill(tmp_path, V2, "run2", mode, at_least=k1 + 4)
    done2, codes2 = _arrays(store)
    assert np.array_equal(done2 & done1, done1) and np.array_equal(codes2[done1], codes1[done1])
    new = done2 & ~done1
    assert int(np.count_nonzero(new)) >= 4 and set(codes2[new].tolist()) == {2}
    ran2 = _ran(tmp_path, "run2")
    assert set(np.flatnonzero(new).tolist()) <= set(ran2)
    assert not set(np.flatnonzero(done1).tolist()) & set(ran2)  # v1's blocks never reran
    assert set(ran2.values()) == {"v2"}
    table = json.loads((store / "code_versions.json").read_text())["versions"]
    assert [e["index"] for e in table] == [1, 2] and table[0]["hash"] != table[1]["hash"]
    assert _status_versions(store) == {1: k1, 2: int(np.count_nonzero(new))}

    # the resume finishes the rest under version 2's fingerprint, and says what it kept
    todo = set(np.flatnonzero(~done2).tolist())
    proc = run_script(tmp_path, V2, name="resume.py", env={"RECORDS": "run3", "MODE": mode})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{k1} block(s) skipped as done were made by other code" in proc.stdout
    assert set(_ran(tmp_path, "run3")) == todo
    done3, codes3 = _arrays(store)
    assert done3.all()
    assert np.array_equal(codes3[done1], codes1[done1])
    table = json.loads((store / "code_versions.json").read_text())["versions"]
    assert table[2]["same_as"] == 2 and table[2]["hash"] == table[1]["hash"]
    assert set(codes3[~done1].tolist()) <= {2, 3}
    assert _status_versions(store) == {1: k1, 2: N - k1}
    line = json.loads((store / "runs.jsonl").read_text().splitlines()[-1])
    assert line["code"] == {"hash": table[1]["hash"], "index": 3}
    assert line["counters"]["skipped"] == N - len(todo)

    # and "rerun" redoes exactly version 1's blocks
    proc = run_script(
        tmp_path, V2, name="resume.py", env={"RECORDS": "run4", "MODE": mode, "POLICY": "rerun"}
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert set(_ran(tmp_path, "run4")) == set(np.flatnonzero(done1).tolist())
    assert _status_versions(store) == {1: 0, 2: N}
