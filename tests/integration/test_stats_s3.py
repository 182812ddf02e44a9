"""Per-block statistics on a store tracked on S3 (docs/cloud.md, issue 40): a pipeline with
``resource_tracking=True`` run into a moto S3 server on 127.0.0.1 and the same run into a
local basedir, distributed (2 workers) and serial; then ``task.report().block``,
``bellis status --block``, ``bellis report --trace``, ``bellis report`` and ``bellis
serve`` on each, in subprocesses, their outputs compared. The block function attaches
its own figures (``block.stats``, from its offset), so both stores hold the same figures
whatever the machine's speed; only the send/return stamps differ. One moto server and
one set of runs per module.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("boto3", reason="S3 tracking tests need boto3 (pip install boto3)")
pytest.importorskip("moto", reason="S3 tracking tests need moto[server] (pip install moto[server])")

from kit import s3 as kit_s3
from kit.live import serve, state_of
from kit.s3 import BUCKET

PIPELINE = textwrap.dedent(
    """
    import sys
    import bellis
    from funlib.geometry import Roi

    base, mode = sys.argv[1], sys.argv[2]

    def work(name):
        def process(block):
            x = block.write_roi.offset[0]
            block.stats = bellis.BlockStats(
                wall_seconds=x + 0.5, cpu_seconds=x / 4, peak_rss_bytes=(x + 1) << 20,
                io_read_bytes=x, io_write_bytes=2 * x, cpu_children_seconds=x / 8,
            )
            if name == "b" and x in (3, 7) and mode == "dist":  # serial: it would raise
                raise RuntimeError(f"bad block {x}")
        return process

    def task(name, upstream):
        return bellis.Task(
            name,
            total_roi=Roi((0,), (12,)),
            read_roi=Roi((0,), (1,)),
            write_roi=Roi((0,), (1,)),
            process_function=work(name),
            max_workers=2,
            max_retries=0,
            read_write_conflict=False,
            upstream_tasks=upstream,
            tracking_path=f"{base}/{name}",
            resource_tracking=True,
        )

    a = task("a", None)
    b = task("b", [a])
    ok = bellis.run_blockwise([a, b], multiprocessing=mode == "dist")
    print("ok" if ok else "failed", flush=True)
    """
)

S3_BASE = f"s3://{BUCKET}/stats"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The pipeline run into S3 and into a local basedir, distributed and serial: block 3
    and 7 of task b fail in the distributed run, every other block is done. The serial
    run on S3 flushes only at its end (a flush interval of an hour): its figures are one
    object per task."""
    tmp = tmp_path_factory.mktemp("stats_s3")
    script = tmp / "pipeline.py"
    script.write_text(PIPELINE)
    with kit_s3.moto_server() as (env, _server):
        bases = {}
        for mode in ("dist", "serial"):
            bases[mode] = {"s3": f"{S3_BASE}/{mode}", "local": str(tmp / mode)}
            for base in bases[mode].values():
                run_env = dict(env)
                if mode == "serial":
                    run_env["BELLIS_S3_FLUSH_SECONDS"] = "3600"
                r = subprocess.run(
                    [sys.executable, str(script), base, mode],
                    env=run_env,
                    cwd=tmp,
                    capture_output=True,
                    text=True,
                    timeout=300,
                )
                want = "failed" if mode == "dist" else "ok"
                assert r.returncode == 0 and want in r.stdout, r.stdout + r.stderr
        yield {"env": env, "tmp": tmp, "bases": bases}


def bellis(run: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bellis", *args],
        env=run["env"],
        cwd=run["tmp"],
        capture_output=True,
        text=True,
        timeout=120,
    )


REPORT = textwrap.dedent(
    """
    import json, sys
    import bellis
    from funlib.geometry import Roi
    found = {}
    for base in sys.argv[1:]:  # one process for every store: an interpreter costs seconds
        t = bellis.Task("b", total_roi=Roi((0,), (12,)), read_roi=Roi((0,), (1,)),
                        write_roi=Roi((0,), (1,)), process_function=lambda b: None,
                        tracking_path=base + "/b")
        r = t.report()
        out = found[base] = {}
        for x in (0, 3, 5, 11):  # each block() reads the store again
            rec = r.block((x,))
            out[x] = None if rec is None or rec.stats is None else [
                rec.stats.wall_seconds, rec.stats.cpu_seconds, rec.stats.peak_rss_bytes,
                rec.stats.io_read_bytes, rec.stats.io_write_bytes,
                rec.stats.cpu_children_seconds, rec.worker_id is not None,
                rec.sent_at is not None and rec.returned_at >= rec.sent_at > 0,
            ]
    print(json.dumps(found))
    """
)


def test_task_report_blocks_on_s3_hold_the_local_figures(runs: dict[str, Any]) -> None:
    script = runs["tmp"] / "report_blocks.py"
    script.write_text(REPORT)
    bases = [b for mode in ("dist", "serial") for b in runs["bases"][mode].values()]
    r = subprocess.run(
        [sys.executable, str(script), *bases],
        env=runs["env"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    found = json.loads(r.stdout)
    for mode in ("dist", "serial"):
        _same_figures(mode, {w: found[b] for w, b in runs["bases"][mode].items()})


def _same_figures(mode: str, out: dict[str, Any]) -> None:
    assert out["s3"] == out["local"]
    figures = out["s3"]
    if mode == "dist":
        assert figures["3"] is None  # failed: not done
    assert figures["11"][:6] == [11.5, 2.75, 12 << 20, 11, 22, 1.375]
    # the block's own figures; a worker id in distributed mode only; its stamps
    assert figures["5"] == [5.5, 1.25, 6 << 20, 5, 10, 0.625, mode == "dist", True]


def _block_json(d: dict[str, Any]) -> tuple[Any, ...]:
    """``status --block --json`` without what the runs do not share (times, pids, logs)."""
    attempts = [(x.get("kind"), x.get("type"), x.get("message")) for x in d["attempts"]]
    return (d["block"], d["id"], d["done"], d["failed_attempts_counted"], attempts)


def test_status_block_on_s3_equals_the_local_one(runs: dict[str, Any]) -> None:
    bases = runs["bases"]["dist"]
    s3 = bellis(runs, "status", f"{bases['s3']}/b", "--block", "3", "--json")
    local = bellis(runs, "status", f"{bases['local']}/b", "--block", "3", "--json")
    assert s3.returncode == 0 and local.returncode == 0, s3.stderr + local.stderr
    a, b = json.loads(s3.stdout), json.loads(local.stdout)
    assert a["path"] == f"{bases['s3']}/b"
    assert _block_json(a) == _block_json(b)
    assert _block_json(a)[2:4] == (False, 1)  # block 3: failed once, not done
    assert [x[1:] for x in _block_json(a)[4]] == [("RuntimeError", "bad block 3")]
    text = bellis(runs, "status", bases["s3"], "--block", "4")  # a prefix of stores
    local = bellis(runs, "status", bases["local"], "--block", "4")
    assert text.returncode == 0, text.stderr
    assert f"block (4) (id 4) in {bases['s3']}/b: done" in text.stdout
    heads = [line for line in text.stdout.splitlines() if line.startswith("block ")]
    local_heads = [line for line in local.stdout.splitlines() if line.startswith("block ")]
    assert [h.replace(bases["s3"], "B") for h in heads] == [
        h.replace(bases["local"], "B") for h in local_heads
    ]


def _events(trace: dict[str, Any]) -> list[tuple[Any, ...]]:
    """The block events without their times and workers (which the runs do not share)."""
    out = []
    for e in trace["traceEvents"]:
        if e.get("ph") != "X" or e.get("cat") not in ("block", "failed_attempt"):
            continue
        volatile = ("worker_id", "sent_at", "returned_at")
        args = {k: v for k, v in e["args"].items() if k not in volatile}
        assert e["dur"] >= 0 and e["args"]["returned_at"] >= e["args"]["sent_at"] > 0
        out.append((e["cat"], e["name"], json.dumps(args, sort_keys=True)))
    return sorted(out)


@pytest.mark.parametrize("mode", ["dist", "serial"])
def test_trace_on_s3_equals_the_local_one(runs: dict[str, Any], mode: str) -> None:
    bases, tmp = runs["bases"][mode], runs["tmp"]
    traces, said = {}, {}
    for where, base in bases.items():
        out, page = tmp / f"{mode}-{where}.json", tmp / f"{mode}-{where}.html"
        r = bellis(runs, "report", base, "--trace", str(out), "-o", str(page))
        assert r.returncode == 0, r.stdout + r.stderr
        said[where] = r.stdout.replace(str(out), "OUT").replace(str(page), "PAGE")
        traces[where] = json.loads(out.read_text())
        # the HTML report of the same stores: their times, as on a local store
        assert "written without resource tracking" not in page.read_text()
        assert "No block has time stamps" not in page.read_text()
    assert said["s3"] == said["local"]
    done = 22 if mode == "dist" else 24  # task b's blocks 3 and 7 fail when distributed
    assert f"{done} blocks" in said["s3"], said
    a, b = traces["s3"], traces["local"]
    assert _events(a) == _events(b)
    assert sum(1 for e in _events(a) if e[0] == "block") == done
    assert '"wall_seconds": 5.5' in " ".join(e[2] for e in _events(a))
    stores = (
        [{k: v for k, v in s.items() if k != "path"} for s in a["otherData"]["stores"]],
        [{k: v for k, v in s.items() if k != "path"} for s in b["otherData"]["stores"]],
    )
    assert stores[0] == stores[1]
    assert [s["path"] for s in a["otherData"]["stores"]] == [f"{bases['s3']}/a", f"{bases['s3']}/b"]


def test_stats_are_one_object_per_flush(runs: dict[str, Any]) -> None:
    """The serial run flushed only at its end: one statistics object per task for its 12
    blocks, not one per block; the distributed run's objects are under stats/ too."""
    c = kit_s3.client(runs["env"])
    for task in ("a", "b"):
        listed = c.list_objects_v2(Bucket=BUCKET, Prefix=f"stats/serial/{task}/stats/")
        keys = [o["Key"] for o in listed.get("Contents", [])]
        assert len(keys) == 1, keys
        assert keys[0].endswith("-000000.bin")
        dist = c.list_objects_v2(Bucket=BUCKET, Prefix=f"stats/dist/{task}/stats/")
        assert 1 <= len(dist.get("Contents", [])) <= 12


def test_serve_on_s3_shows_the_local_counts_and_lanes(
    runs: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, runs["env"][key])
    monkeypatch.setenv("AWS_DEFAULT_REGION", runs["env"]["AWS_DEFAULT_REGION"])
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    bases = runs["bases"]["dist"]
    states = {}
    for where, base in bases.items():
        with serve(base) as url:
            states[where] = state_of(url)
    a, b = states["s3"], states["local"]
    assert a["finished"] is True and b["finished"] is True
    keys = ("name", "blocks", "done", "failed", "untouched", "retried", "failed_attempts")
    assert [{k: t[k] for k in keys} for t in a["tasks"]] == [
        {k: t[k] for k in keys} for t in b["tasks"]
    ]
    assert [t["path"] for t in a["tasks"]] == [f"{bases['s3']}/a", f"{bases['s3']}/b"]
    task_b = a["tasks"][1]
    assert (task_b["done"], task_b["failed"]) == (10, 2)
    assert task_b["resources"] is True
    recent = task_b["recent"]
    assert isinstance(recent, dict) and "lanes" in recent, recent
    lanes = b["tasks"][1]["recent"]["lanes"]
    assert sum(len(x["blocks"]) for x in recent["lanes"]) == sum(len(x["blocks"]) for x in lanes)
    assert {g["title"] for g in task_b["errors"]} == {g["title"] for g in b["tasks"][1]["errors"]}
