"""The PBS stand-in commands: ``qsub``, ``qstat`` and ``qdel`` (see ``_engine``).

They take the options bellis passes and print what Altair documents for PBS Professional:
``qsub`` prints the job id (``<n>.<server>``, ``<n>[].<server>`` for an array);
``qstat -x -f -F json -t`` prints ``{"timestamp": ..., "pbs_version": ..., "pbs_server":
..., "Jobs": {id: attributes}}`` with ``job_state`` (Q, R, F; X for a finished subjob; B for
an array that has begun), ``Exit_status`` once finished (0-255 the script's code, 256 + n
killed by signal n, -27 memory limit), ``Resource_List`` and the array attributes;
an unknown id gets ``qstat: Unknown Job Id <id>`` on stderr and exit status 153.

With ``BELLIS_STANDIN_PBS_HISTORY=0`` the server keeps no job history, as PBS's default
``job_history_enable=False``: a finished job is unknown to ``qstat -x`` (153), and a
finished subjob of an array that still runs shows ``X`` with no ``Exit_status``.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time

import _engine

SERVER = "standin"
_WITH_VALUE = {"-N", "-q", "-A", "-l", "-J", "-o", "-e", "-j", "-r", "-W"}


def _hms(text: str) -> int:
    parts = [int(p) for p in text.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    return (parts[0] * 60 + parts[1]) * 60 + parts[2]


def qsub(args: list[str]) -> int:
    opts: dict[str, list[str]] = {}
    i = 0
    while i < len(args) - 1:
        if args[i] == "-V":
            opts["-V"] = []
            i += 1
            continue
        if args[i] not in _WITH_VALUE:
            print(f"qsub: invalid option -- '{args[i]}'", file=sys.stderr)
            return 2
        opts.setdefault(args[i], []).append(args[i + 1])
        i += 2
    if i != len(args) - 1:
        print("qsub: no script file given", file=sys.stderr)
        return 2
    script = args[-1]
    resources: dict[str, str] = {}
    for item in opts.get("-l", []):
        key, _, value = item.partition("=")
        resources[key] = value
    chunk: dict[str, str] = {}
    for part in resources.get("select", "1").split(":")[1:]:
        key, _, value = part.partition("=")
        chunk[key] = value
    indices = cap = None
    if "-J" in opts:
        m = re.fullmatch(r"(\d+)-(\d+)(?::(\d+))?(?:%(\d+))?", opts["-J"][0])
        if m is None or int(m[2]) <= int(m[1]):
            print("qsub: illegal -J value", file=sys.stderr)
            return 2
        indices = list(range(int(m[1]), int(m[2]) + 1, int(m[3] or 1)))
        cap = int(m[4]) if m[4] else None
    if "-o" not in opts or "-e" not in opts:
        print("stand-in: bellis must always pass -o and -e", file=sys.stderr)
        return 2
    mem = chunk.get("mem")
    walltime = resources.get("walltime")
    name = opts.get("-N", [os.path.basename(script)])[0]
    job = _engine.submit(
        name=name,
        argv=["/bin/sh", script],
        out=opts["-o"][0],
        err=opts["-e"][0],
        indices=indices,
        cap=cap,
        mem_mb=None if mem is None else _engine.parse_mem_mb(mem),
        walltime_s=None if walltime is None else _hms(walltime),
        system="pbs",
        extra={
            "queue": opts.get("-q", ["workq"])[0],
            "resources": resources,
            "chunk": chunk,
        },
    )
    print(f"{job}[].{SERVER}" if indices is not None else f"{job}.{SERVER}")
    return 0


def _pbs_id(record: _engine.Record) -> str:
    if record["index"] is None:
        return f"{record['job']}.{SERVER}"
    return f"{record['job']}[{record['index']}].{SERVER}"


def _exit_status(record: _engine.Record) -> int | None:
    how = record.get("how")
    if how == "memory":
        return -27
    if how == "cancelled" and record.get("pid") is None:
        return None  # deleted before it ran
    if record.get("signal"):
        return 256 + int(record["signal"])
    code = record.get("code")
    return None if code is None else int(code)


def _history() -> bool:
    return os.environ.get("BELLIS_STANDIN_PBS_HISTORY", "1") != "0"


def _attributes(record: _engine.Record) -> dict[str, object]:
    state = {"pending": "Q", "running": "R"}.get(record["state"], "F")
    if state == "F" and record["index"] is not None:
        state = "X"
    attrs: dict[str, object] = {
        "Job_Name": record["name"],
        "Job_Owner": f"{os.environ.get('USER', 'user')}@{os.uname().nodename}",
        "job_state": state,
        "queue": record["queue"],
        "server": SERVER,
        "Resource_List": {
            "ncpus": int(record["chunk"].get("ncpus", 1)),
            "nodect": 1,
            "select": record["resources"].get("select", "1"),
            **({"mem": record["chunk"]["mem"]} if "mem" in record["chunk"] else {}),
            **(
                {"walltime": record["resources"]["walltime"]}
                if "walltime" in record["resources"]
                else {}
            ),
        },
        "ctime": time.ctime(record["submitted"]),
        "Rerunable": "False",
    }
    if record["state"] == "pending":
        attrs["comment"] = "Not Running: Insufficient amount of resource: ncpus"
    elif record["state"] == "running":
        attrs["comment"] = f"Job run at {time.ctime(record.get('start', 0))} on (standin:ncpus=1)"
    else:
        status = _exit_status(record) if _history() else None
        if status is not None:
            attrs["Exit_status"] = status
        attrs["comment"] = f"Job run at {time.ctime(record.get('start', 0))} and finished"
    if record["index"] is not None:
        attrs["array_id"] = f"{record['job']}[].{SERVER}"
        attrs["array_index"] = record["index"]
    return attrs


def _array_attributes(records: list[_engine.Record]) -> dict[str, object]:
    first = records[0]
    done = all(r["state"] == "done" for r in records)
    indices = [r["index"] for r in records]
    return {
        "Job_Name": first["name"],
        "job_state": "F" if done else "B",
        "queue": first["queue"],
        "server": SERVER,
        "array": "True",
        "array_indices_submitted": f"{min(indices)}-{max(indices)}",
        "array_state_count": " ".join(
            f"{name}:{sum(r['state'] == s for r in records)}"
            for name, s in (("Queued", "pending"), ("Running", "running"), ("Exiting", "-"))
        )
        + f" Expired:{sum(r['state'] == 'done' for r in records)}",
    }


def qstat(args: list[str]) -> int:
    flags = {a for a in args if a.startswith("-")}
    ids = [a for a in args if not a.startswith("-") and a != "json"]
    if not {"-f", "-F"} <= flags or "json" not in args:
        print("stand-in: only qstat -f -F json is implemented", file=sys.stderr)
        return 2
    show_finished = "-x" in flags
    subjobs = "-t" in flags
    jobs: dict[str, object] = {}
    status = 0
    for wanted in ids:
        m = re.fullmatch(r"(\d+)(\[(\d*)\])?(?:\.\S+)?", wanted)
        found = [] if m is None else _engine.elements(int(m[1]))
        if not _history() and all(r["state"] == "done" for r in found):
            found = []  # no history: a job (an array) that has ended is gone
        if m is not None and m[3]:
            found = [r for r in found if r["index"] == int(m[3])]
        if not show_finished:
            found = [r for r in found if r["state"] != "done"]
        if not found:
            print(f"qstat: Unknown Job Id {wanted}", file=sys.stderr)
            status = 153
            continue
        if m is not None and m[2] == "[]":
            jobs[f"{m[1]}[].{SERVER}"] = _array_attributes(found)
            if not subjobs:
                continue
        for record in found:
            jobs[_pbs_id(record)] = _attributes(record)
    out = {"timestamp": int(time.time()), "pbs_version": "2022.1.1", "pbs_server": SERVER}
    out["Jobs"] = jobs
    print(json.dumps(out, indent=4))
    return status


def qdel(args: list[str]) -> int:
    hard = False
    ids: list[str] = []
    i = 0
    while i < len(args):
        if args[i] == "-W":
            hard = args[i + 1] == "force"
            i += 2
            continue
        ids.append(args[i])
        i += 1
    status = 0
    for wanted in ids:
        m = re.fullmatch(r"(\d+)(\[(\d*)\])?(?:\.\S+)?", wanted)
        found = [] if m is None else _engine.elements(int(m[1]))
        if m is not None and m[3]:
            found = [r for r in found if r["index"] == int(m[3])]
        if not found:
            print(f"qdel: Unknown Job Id {wanted}", file=sys.stderr)
            status = 153
            continue
        for record in found:
            if not _engine.cancel(record["key"], hard):
                print(f"qdel: Job has finished {wanted}", file=sys.stderr)
                status = 35
    return status


if __name__ == "__main__":
    command = {"qsub": qsub, "qstat": qstat, "qdel": qdel}[os.path.basename(sys.argv[1])]
    sys.exit(command(sys.argv[2:]))
