"""A batch system on this machine, for the LSF and PBS stand-ins (``lsf/`` and ``pbs/``).

The stand-in commands (``bsub``, ``bjobs``, ``bkill``; ``qsub``, ``qstat``, ``qdel``) read
their options the way the vendors document them, keep one JSON record per job under
``$BELLIS_STANDIN_STATE`` and print what the real commands print. Each submission starts a
detached *supervisor* (``python3 _engine.py supervise <id>``) that runs the job script (or
an array's elements, at most ``cap`` at once) as local processes in their own sessions,
with the submitting environment, and enforces the job's limits as the systems do:

* memory: the resident memory of the job's process group, sampled every 0.2 s; over the
  limit, the group is killed (SIGKILL) and the job ends as the system records it
  (LSF ``TERM_MEMLIMIT``; PBS ``Exit_status=-27`` and MoM's line in the error file);
* walltime: at the limit the group gets the system's signal (``limit_signal`` in the
  record: SIGUSR2 for LSF, SIGTERM for PBS), then SIGKILL ``limit_grace_s`` later (LSF's
  ten minutes, scaled; 2 s for PBS) (LSF ``TERM_RUNLIMIT``; PBS ``Exit_status=271`` and
  MoM's line); a job whose record has a ``clock_shift`` gets a ``date`` first on its PATH
  that reads that many seconds early (the LSF stand-in's scaled clock, see ``_lsf``);
* cancellation: ``bkill``/``qdel`` mark the job and signal its group (LSF ``TERM_OWNER``;
  PBS ``Exit_status=271``, or 265 with ``-W force``); an element not started yet never starts.

Only the standard library: the commands run under whatever ``python3`` is first on PATH.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

Record = dict[str, Any]


def state_dir() -> Path:
    root = os.environ.get("BELLIS_STANDIN_STATE")
    if not root:
        print("stand-in: BELLIS_STANDIN_STATE is not set", file=sys.stderr)
        sys.exit(2)
    path = Path(root)
    (path / "jobs").mkdir(parents=True, exist_ok=True)
    return path


def new_id() -> int:
    root = state_dir()
    with locked(root / "counter.lock"):
        counter = root / "counter"
        n = int(counter.read_text()) + 1 if counter.exists() else 100
        counter.write_text(str(n))
    return n


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def record_path(key: str) -> Path:
    return state_dir() / "jobs" / f"{key}.json"


def read(key: str) -> Record | None:
    try:
        data: Record = json.loads(record_path(key).read_text())
    except (OSError, ValueError):
        return None
    return data


def write(record: Record) -> None:
    path = record_path(record["key"])
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)


def update(key: str, **changes: Any) -> Record:
    with locked(record_path(key).with_suffix(".lock")):
        record = read(key) or {}
        record.update(changes)
        write(record)
        return record


def all_records() -> list[Record]:
    out = []
    for path in sorted((state_dir() / "jobs").glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            out.append(json.loads(path.read_text()))
    return out


def elements(job: int) -> list[Record]:
    """The records of job ``job``: itself, or each element of an array."""
    return [r for r in all_records() if r["job"] == job]


def submit(
    *,
    name: str,
    argv: list[str],
    out: str,
    err: str,
    indices: list[int] | None,
    cap: int | None,
    mem_mb: int | None,
    walltime_s: int | None,
    system: str,
    extra: Record,
) -> int:
    """Record a job (or array) and start its supervisor; its number."""
    job = new_id()
    keys = [str(job)] if indices is None else [f"{job}_{i}" for i in indices]
    for key, index in zip(keys, indices or [None], strict=True):
        write(
            {
                "key": key,
                "job": job,
                "index": index,
                "name": name,
                "argv": argv,
                "out": out,
                "err": err,
                "mem_mb": mem_mb,
                "walltime_s": walltime_s,
                "system": system,
                "state": "pending",
                "submitted": time.time(),
                **extra,
            }
        )
    write_meta(job, {"keys": keys, "cap": cap, "cwd": os.getcwd()})
    subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "supervise", str(job)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )
    return job


def write_meta(job: int, meta: Record) -> None:
    (state_dir() / "jobs" / f"{job}.meta").write_text(json.dumps(meta))


def read_meta(job: int) -> Record:
    data: Record = json.loads((state_dir() / "jobs" / f"{job}.meta").read_text())
    return data


def cancel(key: str, hard: bool) -> bool:
    """Cancel one job or element; False if there is no such job or it has ended."""
    with locked(record_path(key).with_suffix(".lock")):
        record = read(key)
        if record is None or record["state"] == "done":
            return False
        record["cancel"] = "KILL" if hard else "TERM"
        if record["state"] == "pending":
            record.update(state="done", how="cancelled", signal=None, code=None, end=time.time())
        write(record)
    pid = record.get("pid")
    if record["state"] == "running" and pid:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL if hard else signal.SIGTERM)
    return True


# -- the supervisor ------------------------------------------------------------------------
def _group_rss_kb(pgid: int) -> int:
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:
                continue
            with open(f"/proc/{entry}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total


def _expand(path: str, record: Record) -> str:
    index = "" if record["index"] is None else str(record["index"])
    return (
        path.replace("%J", str(record["job"])).replace("%I", index).replace("^array_index^", index)
    )


def _start(record: Record) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    if record.get("mem_mb"):
        env["BELLIS_STANDIN_MEM_MB"] = str(record["mem_mb"])  # the stand-ins' own
    if record["system"] == "lsf":
        env["LSB_JOBID"] = str(record["job"])
        env["LSB_JOBINDEX"] = str(record["index"] or 0)
        env["LSB_JOBNAME"] = (
            record["name"] if record["index"] is None else f"{record['name']}[{record['index']}]"
        )
        env["LSB_QUEUE"] = str(record.get("queue", ""))
        env["LSB_HOSTS"] = os.uname().nodename
    else:
        index = "" if record["index"] is None else f"[{record['index']}]"
        env["PBS_JOBID"] = f"{record['job']}{index}.standin"
        if record["index"] is not None:
            env["PBS_ARRAY_INDEX"] = str(record["index"])
    if record.get("clock_shift"):
        env["PATH"] = f"{_early_date(record)}{os.pathsep}{env.get('PATH', '')}"
    out = open(_expand(record["out"], record), "ab")
    err = open(_expand(record["err"], record), "ab")
    try:
        return subprocess.Popen(
            record["argv"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        out.close()
        err.close()


def _early_date(record: Record) -> str:
    """A folder with a ``date`` that reads the clock ``clock_shift`` seconds early (GNU
    ``date -d @<epoch>``, the options given passed on)."""
    real = shutil.which("date")
    if real is None:
        raise RuntimeError("stand-in: no date command on PATH")
    folder = state_dir() / "clock" / record["key"]
    folder.mkdir(parents=True, exist_ok=True)
    shim = folder / "date"
    shim.write_text(
        "#!/bin/sh\n"
        f"# the stand-in's scaled clock: {record['clock_shift']} s early\n"
        f'now=$({real} +%s)\nexec {real} -d "@$((now - {int(record["clock_shift"])}))" "$@"\n'
    )
    shim.chmod(0o755)
    return str(folder)


def _note(record: Record, line: str) -> None:
    """A line the system writes to the job's error file (PBS MoM) or output report (LSF)."""
    target = record["err"] if record["system"] == "pbs" else record["out"]
    with open(_expand(target, record), "a") as f:
        f.write(line + "\n")


def supervise(job: int) -> None:
    meta = read_meta(job)
    os.chdir(meta["cwd"])
    keys: list[str] = meta["keys"]
    cap: int = meta["cap"] or len(keys)
    running: dict[str, tuple[subprocess.Popen[bytes], float]] = {}
    killing: dict[str, tuple[str, float]] = {}  # key -> (why, when SIGKILL follows)
    waiting = list(keys)
    while waiting or running:
        while waiting and len(running) < cap:
            key = waiting.pop(0)
            with locked(record_path(key).with_suffix(".lock")):
                record = read(key) or {}
                if record.get("state") != "pending":
                    continue
                proc = _start(record)
                record.update(state="running", pid=proc.pid, start=time.time())
                write(record)
            running[key] = (proc, time.monotonic())
        time.sleep(0.2)
        for key, (proc, started) in list(running.items()):
            record = read(key) or {}
            code = proc.poll()
            if code is None:
                limit = record.get("mem_mb")
                if limit and key not in killing:
                    rss = _group_rss_kb(proc.pid)
                    if rss > limit * 1024:
                        killing[key] = ("memory", time.monotonic())
                        update(key, used_kb=rss)
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(proc.pid, signal.SIGKILL)
                walltime = record.get("walltime_s")
                if walltime and key not in killing and time.monotonic() - started > walltime:
                    grace = float(record.get("limit_grace_s", 2.0))
                    killing[key] = ("walltime", time.monotonic() + grace)
                    sent = getattr(signal, record.get("limit_signal", "SIGTERM"))
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, sent)
                why = killing.get(key)
                if why is not None and time.monotonic() > why[1]:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                continue
            # the job's script ended: whatever it left in its session goes with it
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            del running[key]
            why_killed = killing.pop(key, (None, 0.0))[0]
            how = why_killed or ("cancelled" if record.get("cancel") else "exited")
            sig = -code if code < 0 else None
            elapsed = time.monotonic() - started
            if how == "memory":
                _note(record, _memory_note(record))
            elif how == "walltime":
                _note(record, _walltime_note(record, elapsed))
            update(
                key,
                state="done",
                how=how,
                code=code if code >= 0 else None,
                signal=sig,
                end=time.time(),
            )


def _memory_note(record: Record) -> str:
    if record["system"] == "pbs":
        used = record.get("used_kb", 0)
        return f"=>> PBS: job killed: mem {used}kb exceeded limit {record['mem_mb'] * 1024}kb"
    return "TERM_MEMLIMIT: job killed after reaching LSF memory usage limit."


def _walltime_note(record: Record, elapsed: float) -> str:
    if record["system"] == "pbs":
        return f"=>> PBS: job killed: walltime {int(elapsed)} exceeded limit {record['walltime_s']}"
    return "TERM_RUNLIMIT: job killed after reaching LSF run time limit."


def parse_mem_mb(text: str) -> int:
    """``4096MB``, ``4GB``, ``4096mb``, ``500kb``, or a number of MB."""
    t = text.strip().lower()
    units = {"kb": 1 / 1024, "k": 1 / 1024, "mb": 1, "m": 1, "gb": 1024, "g": 1024, "tb": 1 << 20}
    for unit in sorted(units, key=len, reverse=True):
        if t.endswith(unit):
            return max(1, int(float(t[: -len(unit)]) * units[unit]))
    return int(t)


if __name__ == "__main__":
    if sys.argv[1:2] == ["supervise"]:
        supervise(int(sys.argv[2]))
