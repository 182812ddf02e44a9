"""Requests per block of a run tracked on S3 (issue #40, docs/cloud.md). Not in the suite.

Starts a moto S3 server on 127.0.0.1 (``python -m moto.server``), runs one task of
``--blocks`` no-op blocks with ``tracking_path="s3://.../bench"`` in this process (the
driver: only it talks to the bucket), then runs it again (every block done: the
resume). Every request the driver's client sends is counted by operation: this script
wraps the methods of the process's one client (``bellis._tracking._s3io._client``,
bellis's own or botocore's, ``_s3http.Requests``) before the run.

Prints, per phase, the requests by operation, the chunk writes of ``done/c/0`` (the
flushes), and requests per block; ``--json`` writes them as one record.
``--resource-tracking`` runs the task with ``resource_tracking=True``: the figures go
out as one ``stats/`` object per flush (``_tracking/_s3stats``); the PUTs are counted
per folder, and a third phase, ``read``, counts what a reader
(``open_readonly(url).stats``, as ``bellis status``/``report`` read them) asks: one
listing of ``stats/`` and one GET per object.

    .venv/bin/python -m compileall -q src
    .venv/bin/python benchmarks/bench_s3_requests.py --blocks 10000
    .venv/bin/python benchmarks/bench_s3_requests.py --blocks 10000 --distributed
    .venv/bin/python benchmarks/bench_s3_requests.py --blocks 10000 --block-ms 1 \
        --flush-seconds 0.5
    .venv/bin/python benchmarks/bench_s3_requests.py --blocks 1000000 --resource-tracking

Needs boto3 and moto[server] (``pip install -e '.[test]'``).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Any


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _moto_env(endpoint: str, bucket: str) -> dict[str, str]:
    """This process's environment for a child that reaches the moto server at
    ``endpoint`` with static test credentials (no AWS profile or config file), after
    making ``bucket`` there."""
    env = dict(os.environ)
    env.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
    )
    for name in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        env.pop(name, None)
    import boto3

    boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    ).create_bucket(Bucket=bucket)
    return env


def _start_moto() -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return server, f"http://127.0.0.1:{port}"
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the moto server did not start") from None
            time.sleep(0.2)


#: the store's requests (``_s3http.Requests``) and the S3 operation each one is
_OPERATIONS = {
    "get": "GetObject",
    "put": "PutObject",
    "delete": "DeleteObject",
    "delete_many": "DeleteObjects",
    "list": "ListObjectsV2",
}


class Counter:
    """Requests by operation name, and the PUTs by key: it wraps the methods of the
    process's one S3 client (bellis's or botocore's, ``_s3http.Requests``)."""

    def __init__(self) -> None:
        self.ops: collections.Counter[str] = collections.Counter()
        self.puts: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()  # the open and the close send requests at once

    def hook(self, client: Any) -> None:
        for method, operation in _OPERATIONS.items():
            setattr(client, method, self._counting(getattr(client, method), operation))

    def _counting(self, fn: Any, operation: str) -> Any:
        def counted(bucket: str, key: str, *rest: Any) -> Any:
            with self._lock:
                self.ops[operation] += 1
                if operation == "PutObject":
                    name = key.rsplit("bench/", 1)[-1]
                    if name.startswith(("stats/", "runs/", "errors/")):
                        name = name.split("/", 1)[0] + "/"  # one object per flush or run
                    self.puts[name] += 1
            return fn(bucket, key, *rest)

        return counted

    def take(self) -> dict[str, Any]:
        out = {
            "ops": dict(self.ops),
            "puts": dict(self.puts),
            "total": sum(self.ops.values()),
        }
        self.ops.clear()
        self.puts.clear()
        return out


def _run(blocks: int, url: str, distributed: bool, block_ms: float, rt: bool) -> tuple[bool, float]:
    from funlib.geometry import Roi

    import bellis

    def process(block: Any) -> None:
        if block_ms:
            time.sleep(block_ms / 1000)

    task = bellis.Task(
        "bench",
        total_roi=Roi((0,), (blocks,)),
        read_roi=Roi((0,), (1,)),
        write_roi=Roi((0,), (1,)),
        process_function=process,
        max_workers=2,
        read_write_conflict=False,
        tracking_path=url,
        resource_tracking=rt,
    )
    t0 = time.perf_counter()
    ok = bellis.run_blockwise([task], multiprocessing=distributed)
    return bool(ok), time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=10_000)
    p.add_argument("--distributed", action="store_true", help="2 local workers (default serial)")
    p.add_argument("--flush-seconds", default="5", help="BELLIS_S3_FLUSH_SECONDS (default 5)")
    p.add_argument(
        "--block-ms",
        type=float,
        default=0.0,
        help="each block sleeps this long (so the run spans several flush intervals)",
    )
    p.add_argument(
        "--resource-tracking", action="store_true", help="resource_tracking=True (stats/)"
    )
    p.add_argument("--json", default=None, help="write the record to this file")
    args = p.parse_args()

    server, endpoint = _start_moto()
    try:
        os.environ.update(
            AWS_ENDPOINT_URL=endpoint,
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_DEFAULT_REGION="us-east-1",
            BELLIS_S3_FLUSH_SECONDS=args.flush_seconds,
        )
        os.environ.pop("AWS_PROFILE", None)
        from bellis._tracking._s3io import _client

        url = "s3://bellis-bench/bench"
        import boto3

        boto3.session.Session().client("s3", endpoint_url=endpoint).create_bucket(
            Bucket="bellis-bench"
        )
        counter = Counter()
        counter.hook(_client(url))  # the one the driver's store will use
        record: dict[str, Any] = {
            "blocks": args.blocks,
            "mode": "distributed" if args.distributed else "serial",
            "flush_seconds": float(args.flush_seconds),
            "block_ms": args.block_ms,
            "resource_tracking": args.resource_tracking,
            "loadavg": os.getloadavg()[0],
        }
        for phase in ("run", "resume", "read"):
            if phase == "read":
                if not args.resource_tracking:
                    continue
                from bellis._tracking import open_readonly

                t0 = time.perf_counter()
                with open_readonly(url) as store:
                    stamps = store.stats["returned_at"]
                    ok = int((stamps > 0).sum()) == args.blocks  # every block's figures
                seconds = time.perf_counter() - t0
            else:
                ok, seconds = _run(
                    args.blocks, url, args.distributed, args.block_ms, args.resource_tracking
                )
            got = counter.take()
            got.update(
                ok=ok,
                seconds=round(seconds, 2),
                flushes=got["puts"].get("done/c/0", 0),
                per_block=got["total"] / args.blocks,
            )
            record[phase] = got
            print(
                f"{phase}: {got['total']} requests for {args.blocks} blocks "
                f"({got['per_block']:.4f} per block), {got['flushes']} flushes of done/c/0, "
                f"{seconds:.1f} s, ok={ok}; by operation {json.dumps(got['ops'], sort_keys=True)}; "
                f"PUTs {json.dumps(got['puts'], sort_keys=True)}"
            )
        print(f"load average (1 min) at the start: {record['loadavg']:.2f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(record, f, indent=1)
        return 0 if record["run"]["ok"] and record["resume"]["ok"] else 1
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    sys.exit(main())
