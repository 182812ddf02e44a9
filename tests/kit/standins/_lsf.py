"""The LSF stand-in commands: ``bsub``, ``bjobs`` and ``bkill`` (see ``_engine``).

They take the options bellis passes and print what IBM documents: ``bsub`` says ``Job <n>
is submitted to queue <q>.``; ``bjobs -o "..." -json`` prints ``{"COMMAND": "bjobs",
"JOBS": n, "RECORDS": [...]}`` with one record per job or array element, its keys the
upper-cased field names, and ``{"JOBID": ..., "ERROR": "Job <n> is not found"}`` for an
unknown job; ``bkill`` says ``Job <n> is being terminated``. With
``BELLIS_STANDIN_REQUIRE_PROJECT=1`` a ``bsub`` without ``-P`` is refused (exit 255), as
sites that bill by project do.

Run limits (``-W [hour:]minute``) are enforced as LSF does for UNIX jobs: at the limit the
job's processes get SIGUSR2 (a process that does not handle it ends at once, and ``bjobs``
then shows ``EXIT``, exit code 140 = 128 + 12, ``TERM_RUNLIMIT``); one still running ten
minutes later is killed (SIGKILL). LSF counts run limits in whole minutes; with
``BELLIS_STANDIN_SECONDS_PER_MINUTE=s`` (read by ``bsub`` when the job is submitted, by the
stand-in only) a minute of a run limit, and of that grace, lasts ``s`` seconds, so a ``-W 1``
job is stopped after ``s`` seconds. Such a job sees its run limit scaled the same way: LSF
tells a job nothing of its limit, a job script that wants its end reads the clock at its
start (``date +%s``) and adds the ``-W`` it asked for; the stand-in's ``date`` (first on the
job's PATH) is set back by the minutes' difference (``-W`` x (60 - s) seconds), so that
start plus the unscaled limit is when the stand-in stops the job.
"""

from __future__ import annotations

import json
import os
import re
import sys

import _engine

_WITH_VALUE = {"-J", "-q", "-P", "-n", "-R", "-M", "-W", "-gpu", "-o", "-e", "-oo", "-eo"}


def bsub(args: list[str]) -> int:
    opts: dict[str, list[str]] = {}
    i = 0
    while i < len(args) and args[i].startswith("-"):
        if args[i] not in _WITH_VALUE or i + 1 >= len(args):
            print(f"{args[i]}: Illegal option. Job not submitted.", file=sys.stderr)
            return 255
        opts.setdefault(args[i], []).append(args[i + 1])
        i += 2
    command = args[i:]
    if not command:
        print("No command is specified. Job not submitted.", file=sys.stderr)
        return 255
    if os.environ.get("BELLIS_STANDIN_REQUIRE_PROJECT") == "1" and "-P" not in opts:
        print(
            "You must specify a project with -P <project> for each job.\n"
            "Request aborted by esub. Job not submitted.",
            file=sys.stderr,
        )
        return 255
    if "-o" not in opts or "-e" not in opts:
        print("stand-in: bellis must always pass -o and -e", file=sys.stderr)
        return 255
    name = opts.get("-J", ["NONAME"])[0]
    indices = cap = None
    m = re.fullmatch(r"(.*)\[([\d,\-]+)\](?:%(\d+))?", name)
    if m is not None:
        name, ranges, cap_text = m[1], m[2], m[3]
        indices = []
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            indices += range(int(lo), int(hi or lo) + 1)
        if min(indices) < 1:
            print("Bad job name. Job not submitted.", file=sys.stderr)
            return 255
        cap = int(cap_text) if cap_text else None
    mem = opts.get("-M", [None])[0]
    per_minute = _seconds_per_minute()
    if per_minute is None:
        return 255
    walltime = None
    clock_shift = 0
    if "-W" in opts:
        hours, _, minutes = opts["-W"][0].rpartition(":")
        total_minutes = int(hours or 0) * 60 + int(minutes)
        walltime = total_minutes * per_minute
        clock_shift = total_minutes * 60 - walltime
    queue = opts.get("-q", ["normal"])[0]
    job = _engine.submit(
        name=name,
        argv=command,
        out=opts["-o"][0],
        err=opts["-e"][0],
        indices=indices,
        cap=cap,
        mem_mb=None if mem is None else _engine.parse_mem_mb(mem),
        walltime_s=walltime,
        system="lsf",
        extra={
            "queue": queue,
            "options": opts,
            "clock_shift": clock_shift,
            # LSF's kill sequence for a run limit: SIGUSR2, SIGKILL ten minutes later
            "limit_signal": "SIGUSR2",
            "limit_grace_s": 10 * per_minute,
        },
    )
    print(f"Job <{job}> is submitted to queue <{queue}>.")
    return 0


def _seconds_per_minute() -> int | None:
    """How long a minute of a run limit lasts: ``BELLIS_STANDIN_SECONDS_PER_MINUTE``, else 60;
    None (and a message) for a value that is not a whole number of seconds >= 1."""
    text = os.environ.get("BELLIS_STANDIN_SECONDS_PER_MINUTE", "60")
    if not text.isdigit() or int(text) < 1:
        print(
            f"stand-in: BELLIS_STANDIN_SECONDS_PER_MINUTE={text!r} is not whole seconds >= 1",
            file=sys.stderr,
        )
        return None
    return int(text)


def _lsf_id(record: _engine.Record) -> str:
    return str(record["job"]) if record["index"] is None else f"{record['job']}[{record['index']}]"


def _fields(record: _engine.Record) -> dict[str, str]:
    state = {"pending": "PEND", "running": "RUN"}.get(record["state"], "")
    code = reason = ""
    if record["state"] == "done":
        how = record.get("how")
        signal = record.get("signal")
        exit_code = record.get("code")
        if how == "exited" and exit_code == 0:
            state = "DONE"
        else:
            state = "EXIT"
            code = str(exit_code if exit_code is not None else 128 + (signal or 9))
            if how == "memory":
                reason = "TERM_MEMLIMIT: job killed after reaching LSF memory usage limit"
            elif how == "walltime":
                reason = "TERM_RUNLIMIT: job killed after reaching LSF run time limit"
            elif how == "cancelled":
                reason = "TERM_OWNER: job killed by owner"
                if record.get("pid") is None:
                    code = ""
    return {
        "JOBID": str(record["job"]),
        "JOBINDEX": str(record["index"] or 0),
        "STAT": state,
        "EXIT_CODE": code,
        "EXIT_REASON": reason,
        "PEND_REASON": "New job is waiting for scheduling;" if state == "PEND" else "",
        "JOB_NAME": record["name"]
        if record["index"] is None
        else f"{record['name']}[{record['index']}]",
    }


def bjobs(args: list[str]) -> int:
    fields: list[str] | None = None
    as_json = show_all = False
    ids: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "-o":
            fields = args[i + 1].split()
            i += 2
            continue
        if a == "-json":
            as_json = True
        elif a == "-a":
            show_all = True
        elif a.startswith("-"):
            print(f"{a}: Illegal option.", file=sys.stderr)
            return 255
        else:
            ids.append(a)
        i += 1
    if not as_json or fields is None:
        print("stand-in: only bjobs -o '...' -json is implemented", file=sys.stderr)
        return 255
    records: list[dict[str, str]] = []
    for wanted in ids:
        m = re.fullmatch(r"(\d+)(?:\[(\d+)\])?", wanted)
        found = [] if m is None else _engine.elements(int(m[1]))
        if m is not None and m[2] is not None:
            found = [r for r in found if r["index"] == int(m[2])]
        if not show_all:
            found = [r for r in found if r["state"] != "done"]
        if not found:
            records.append({"JOBID": wanted, "ERROR": f"Job <{wanted}> is not found"})
            continue
        for record in found:
            row = _fields(record)
            records.append({f.upper(): row.get(f.upper(), "") for f in fields})
    print(json.dumps({"COMMAND": "bjobs", "JOBS": len(records), "RECORDS": records}, indent=2))
    return 0


def bkill(args: list[str]) -> int:
    hard = False
    ids: list[str] = []
    i = 0
    while i < len(args):
        if args[i] == "-s":
            hard = args[i + 1] in ("KILL", "9", "SIGKILL")
            i += 2
            continue
        ids.append(args[i])
        i += 1
    status = 0
    for wanted in ids:
        m = re.fullmatch(r"(\d+)(?:\[(\d+)\])?", wanted)
        found = [] if m is None else _engine.elements(int(m[1]))
        if m is not None and m[2] is not None:
            found = [r for r in found if r["index"] == int(m[2])]
        if not found:
            print(f"Job <{wanted}>: No matching job found", file=sys.stderr)
            status = 255
            continue
        for record in found:
            if _engine.cancel(record["key"], hard):
                print(f"Job <{_lsf_id(record)}> is being terminated")
            else:
                print(f"Job <{_lsf_id(record)}>: Job has already finished", file=sys.stderr)
                status = 255
    return status


if __name__ == "__main__":
    command = {"bsub": bsub, "bjobs": bjobs, "bkill": bkill}[os.path.basename(sys.argv[1])]
    sys.exit(command(sys.argv[2:]))
