"""Where the time of one ``dist_noop_w2`` run goes, tracked on local disk and on S3
(issue #40). Not in the suite; a diagnostic, not a benchmark: one run per line.

Each run is a fresh interpreter (the shape of ``bench_s3_noop.py``: 10,000 2-D blocks,
two local workers, an empty block function) that wraps a few of bellis's private
functions to stamp when each stage of the run begins and ends, in ms from the call of
``run_blockwise``: the stores' open, the workers' launch (``carry_out``), the first
worker's connection (``first_accept``), the stop (``stop``: the last flush and the
workers' exit), the reports and the stores' close; and, on S3, every request with its
thread (``bellis-s3-create``: a new store's metadata; ``bellis-flush``: the last
markers, while the workers exit). A moto S3 server on 127.0.0.1 is started once.

    .venv/bin/python -m compileall -q src
    .venv/bin/python benchmarks/timeline_s3_noop.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_s3_noop import _start_latency_proxy
from bench_s3_requests import _moto_env, _start_moto

_CHILD = r"""
import json, sys, threading, time
import bellis
from bellis import Roi
from bellis._run import _runner, _server
from bellis._tracking import _s3io

requests, marks = [], {}
T0 = 0.0

def stamp(key):
    marks.setdefault(key, time.perf_counter())

def wrap(owner, name, key, first=False):
    inner = getattr(owner, name)
    def stamped(*args, **kwargs):
        stamp(key + ">")
        try:
            return inner(*args, **kwargs)
        finally:
            if first:  # the first call's end only (carry_out: the workers' launch)
                stamp(key + "<")
            else:
                marks[key + "<"] = time.perf_counter()
    setattr(owner, name, stamped)

call = _s3io.Bucket._call
def timed_call(self, what, fn):
    start = time.perf_counter()
    try:
        return call(self, what, fn)
    finally:
        requests.append((start, time.perf_counter(), what, threading.current_thread().name))
_s3io.Bucket._call = timed_call

accept = _server.RunLoop._accept
def first_accept(self):
    stamp("first_accept")
    return accept(self)
_server.RunLoop._accept = first_accept
wrap(_server.RunLoop, "_carry_out", "carry_out", first=True)
wrap(_server.RunLoop, "_stop_workers", "stop")
wrap(_runner, "_open_stores", "open")
wrap(_runner, "_write_reports", "reports")
wrap(_runner, "_close_stores", "close")
wrap(_runner, "record_code", "record_code")

def noop(block):
    pass

task = bellis.Task(
    "noop", total_roi=Roi((0, 0), (100, 100)), read_roi=Roi((0, 0), (1, 1)),
    write_roi=Roi((0, 0), (1, 1)), process_function=noop, max_workers=2,
    read_write_conflict=False, tracking_path=sys.argv[1],
)
T0 = time.perf_counter()
bellis.run_blockwise([task], progress=False, summary=False)
wall = time.perf_counter() - T0
ms = lambda t: round((t - T0) * 1000, 1)
print(json.dumps({
    "wall_ms": round(wall * 1000, 1),
    "marks": {k: ms(v) for k, v in sorted(marks.items(), key=lambda kv: kv[1])},
    "requests": [(ms(a), ms(b), what, thread) for a, b, what, thread in sorted(requests)],
}))
"""


def _stages(got: dict[str, Any]) -> dict[str, float]:
    """The run's stages, in ms, from its marks."""
    m = got["marks"]
    return {
        "before the open": m["open>"],
        "open": m["open<"] - m["open>"],
        "open to the launch": m["carry_out>"] - m["open<"],
        "launch to the first worker": m["first_accept"] - m["carry_out>"],
        "  of which record_code": m["record_code<"] - m["record_code>"],
        "  record_code's end to it": m["first_accept"] - m["record_code<"],
        "first worker to the stop": m["stop>"] - m["first_accept"],
        "stop (flush, exits)": m["stop<"] - m["stop>"],
        "stop to the close": m["close>"] - m["stop<"],
        "close": m["close<"] - m["close>"],
        "wall": got["wall_ms"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3, help="pairs of runs (local, then s3)")
    p.add_argument("--quiet", action="store_true", help="the stage medians only")
    p.add_argument(
        "--server-core",
        type=int,
        default=None,
        help="the S3 server on this core, the runs on the others",
    )
    p.add_argument(
        "--latency-ms",
        type=float,
        default=0.0,
        help="each byte to and from the S3 server held this long (bench_s3_noop.py's proxy)",
    )
    args = p.parse_args()
    stages: dict[str, dict[str, list[float]]] = {"local": {}, "s3": {}}
    server, endpoint = _start_moto()
    cores = None
    if args.server_core is not None:
        cores = os.sched_getaffinity(0) - {args.server_core}
        os.sched_setaffinity(server.pid, {args.server_core})
    try:
        env = _moto_env(endpoint, "bench-timeline")
        if args.latency_ms:
            env["AWS_ENDPOINT_URL"] = _start_latency_proxy(endpoint, args.latency_ms)
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(args.runs):
                for path in (
                    os.path.join(tmp, uuid.uuid4().hex),
                    f"s3://bench-timeline/{uuid.uuid4().hex}",
                ):
                    r = subprocess.run(
                        [sys.executable, "-c", _CHILD, path],
                        env=env,
                        cwd=tmp,
                        capture_output=True,
                        text=True,
                        check=False,
                        preexec_fn=None
                        if cores is None
                        else (lambda: os.sched_setaffinity(0, cores)),
                    )
                    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
                    if r.returncode != 0 or not lines:
                        raise SystemExit(f"the run failed:\n{r.stderr[-3000:]}")
                    got = json.loads(lines[-1])
                    kind = "s3" if path.startswith("s3://") else "local"
                    for stage, ms in _stages(got).items():
                        stages[kind].setdefault(stage, []).append(ms)
                    if args.quiet:
                        continue
                    print(f"{kind:5} wall {got['wall_ms']} ms  {got['marks']}")
                    for start, end, what, thread in got["requests"]:
                        print(f"        {start:7.1f} -> {end:7.1f} ms  {what}  [{thread}]")
        print(f"stages over {args.runs} runs of each, ms: median (mean), s3 - local")
        for stage, local in stages["local"].items():
            s3 = stages["s3"][stage]
            a, b = statistics.median(local), statistics.median(s3)
            ma, mb = statistics.fmean(local), statistics.fmean(s3)
            print(
                f"  {stage:28} local {a:6.1f} ({ma:6.1f})  s3 {b:6.1f} ({mb:6.1f})  "
                f"{b - a:+6.1f} ({mb - ma:+6.1f})"
            )
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()
