"""``dist_noop_w2`` tracked on S3 against tracked on local disk (issue #40). Not in the suite.

The shared harness's ``dist_noop_w2`` shape (10,000 2-D blocks of 100 x 100, two local
workers, ``read_write_conflict=False``, an empty block function) with a tracking store,
each run timed around ``run_blockwise`` in a fresh interpreter, the two interleaved
(local, s3, local, s3, ...: the load of the shared machine falls on both alike):

``local``
    ``tracking_path`` a fresh local folder;
``s3``
    ``tracking_path`` a fresh prefix on a moto S3 server on 127.0.0.1 (started once, by
    this script), ``BELLIS_S3_FLUSH_SECONDS`` the default 5.

``--rt`` adds ``resource_tracking=True`` to both (the per-flush statistics objects on
S3). Prints each pair, the paired ratios s3 / local and their median, and the load
average; ``--json`` writes the record.

    .venv/bin/python -m compileall -q src
    .venv/bin/python benchmarks/bench_s3_noop.py --pairs 10 --rt
    .venv/bin/python benchmarks/bench_s3_noop.py --pairs 10
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_s3_requests import _start_moto  # noqa: E402

_CHILD = r"""
import json, sys, time
import bellis
from bellis import Roi

path, blocks, rt = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"

def noop(block):
    pass

side = 100
task = bellis.Task(
    "noop",
    total_roi=Roi((0, 0), (side, blocks // side)),
    read_roi=Roi((0, 0), (1, 1)),
    write_roi=Roi((0, 0), (1, 1)),
    process_function=noop,
    max_workers=2,
    read_write_conflict=False,
    tracking_path=path,
    resource_tracking=rt,
)
t0 = time.perf_counter()
ok = bellis.run_blockwise([task])
print(json.dumps({"ok": bool(ok), "seconds": time.perf_counter() - t0}))
"""


def _one(path: str, blocks: int, rt: bool, env: dict[str, str]) -> float:
    r = subprocess.run(
        [sys.executable, "-c", _CHILD, path, str(blocks), "1" if rt else "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if r.returncode != 0:
        raise SystemExit(f"a run failed ({path}):\n{r.stdout}\n{r.stderr}")
    got = json.loads(r.stdout.strip().splitlines()[-1])
    if not got["ok"]:
        raise SystemExit(f"a run was not ok ({path}):\n{r.stderr}")
    return float(got["seconds"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=10)
    p.add_argument("--blocks", type=int, default=10_000)
    p.add_argument("--rt", action="store_true", help="resource_tracking=True on both")
    p.add_argument("--json", default=None)
    args = p.parse_args()

    server, endpoint = _start_moto()
    try:
        env = dict(os.environ)
        env.update(
            AWS_ENDPOINT_URL=endpoint,
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_DEFAULT_REGION="us-east-1",
        )
        env.pop("AWS_PROFILE", None)
        import boto3

        boto3.session.Session().client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        ).create_bucket(Bucket="bellis-bench")
        load = [os.getloadavg()[0]]
        pairs: list[tuple[float, float]] = []
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.pairs):
                local = _one(os.path.join(tmp, f"t{i}"), args.blocks, args.rt, env)
                s3 = _one(f"s3://bellis-bench/{uuid.uuid4().hex}", args.blocks, args.rt, env)
                pairs.append((local, s3))
                print(
                    f"pair {i}: local {local:.2f} s, s3 {s3:.2f} s, ratio {s3 / local:.3f}",
                    flush=True,
                )
        load.append(os.getloadavg()[0])
        ratios = [s / lo for lo, s in pairs]
        record = {
            "blocks": args.blocks,
            "resource_tracking": args.rt,
            "pairs": pairs,
            "ratios": ratios,
            "median_ratio": statistics.median(ratios),
            "median_local": statistics.median(lo for lo, _ in pairs),
            "median_s3": statistics.median(s for _, s in pairs),
            "loadavg_start_end": load,
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        }
        print(
            f"median local {record['median_local']:.2f} s, median s3 {record['median_s3']:.2f} s, "
            f"paired median ratio s3/local {record['median_ratio']:.3f} "
            f"(range {min(ratios):.2f}-{max(ratios):.2f}); load average {load[0]:.1f} -> "
            f"{load[1]:.1f}"
        )
        if args.json:
            with open(args.json, "w") as f:
                json.dump(record, f, indent=1)
        return 0
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    sys.exit(main())
