"""A server holding 1,000 simulated external workers at once hands each block out exactly once.

The server is what a user runs to serve external workers: a script calling
``bellis.Server(external_workers=True, on_listen=...)``, whose callback writes
``Server.worker_context(task_id)`` to a file. The workers are
``benchmarks/_simworkers.py`` (the capacity benchmark's clients) run as a command: four
asyncio processes holding 1,000 authenticated connections that speak the wire protocol
themselves, without bellis's client, and return every block they get as done with no
work. No connection asks for a block before all 1,000 are in, so every one of them takes
part in the hand-out. Outcomes only: no speed is asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import zarr

SIMWORKERS = Path(__file__).resolve().parents[2] / "benchmarks" / "_simworkers.py"

CONNECTIONS = 1000
BLOCKS = 20_000

SERVER = r"""
import json, os, resource, sys
ctx_file, store, blocks = sys.argv[1], sys.argv[2], int(sys.argv[3])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if soft != resource.RLIM_INFINITY and soft < 2048:
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(2048, hard), hard))
import bellis

task = bellis.Task(
    "capacity",
    bellis.Roi((0,), (blocks,)),
    bellis.Roi((0,), (1,)),
    bellis.Roi((0,), (1,)),
    None,
    read_write_conflict=False,
    max_retries=0,
    tracking_path=store,
)


def on_listen(server):
    with open(ctx_file + ".tmp", "w") as f:
        f.write(server.worker_context("capacity"))
    os.replace(ctx_file + ".tmp", ctx_file)


server = bellis.Server(external_workers=True, on_listen=on_listen)
states = server.run_blockwise([task], progress=False, summary=False)
s = states["capacity"]
print(json.dumps({"total": s.total_block_count, "completed": s.completed_count,
                  "failed": s.failed_count, "orphaned": s.orphaned_count}))
"""


def test_a_thousand_connections_get_every_block_exactly_once(tmp_path: Path) -> None:
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    ctx_file = tmp_path / "context"
    store = tmp_path / "store"
    server = subprocess.Popen(
        [sys.executable, str(script), str(ctx_file), str(store), str(BLOCKS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not ctx_file.exists():
            assert server.poll() is None, server.communicate()
            assert time.monotonic() < deadline, "the server never listened"
            time.sleep(0.05)
        seen = tmp_path / "clients.json"
        clients = subprocess.run(
            [
                sys.executable,
                str(SIMWORKERS),
                "--context-file",
                str(ctx_file),
                "--connections",
                str(CONNECTIONS),
                "--processes",
                "4",
                "--barrier",
                # workers that start over a moment: the server's cap on connections in
                # their handshake (256) is never reached, so none is dropped on a loaded host
                "--handshakes",
                "50",
                "--timeout",
                "240",
                "--json",
                str(seen),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        out, err = server.communicate(timeout=120)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert clients.returncode == 0, clients.stderr
    assert server.returncode == 0, err
    record = json.loads(seen.read_text())
    # every connection authenticated, took part and was told to stop, with no error
    assert record["error_count"] == 0, record["errors"]
    assert record["welcomed"] == CONNECTIONS
    assert record["served_first_block"] == CONNECTIONS
    assert record["shutdowns"] == CONNECTIONS
    # every block handed out exactly once
    assert record["blocks_received"] == BLOCKS
    assert record["blocks"] == list(range(BLOCKS))
    # ... and recorded exactly once: the task's counts and its tracking store
    states = json.loads(out.strip().splitlines()[-1])
    assert states == {"total": BLOCKS, "completed": BLOCKS, "failed": 0, "orphaned": 0}
    done = zarr.open_group(str(store), mode="r")["done"][:]
    assert done.shape == (BLOCKS,)
    assert int(done.sum()) == BLOCKS
    # the run ended cleanly: nothing dropped or failed on the server's side
    assert "dropping client" not in err, err
    assert "block lost" not in err and "failed" not in err, err
    assert not os.path.exists(str(ctx_file) + ".tmp")
