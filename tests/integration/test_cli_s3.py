"""The CLI on a store tracked on S3 (docs/cloud.md): one 2-task pipeline run into a moto
S3 server on 127.0.0.1 and the same run into a local basedir, then ``bellis status``
(text, ``--json``, ``--watch``), ``bellis report``, ``bellis plan`` and ``bellis verify``
on each, in subprocesses; the outputs compared (counts, ROIs, failures, code versions).
The readers never take the run lock: they run while a live lease of another run is in
the bucket, and leave it there. One moto server and one pair of runs per module.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("boto3", reason="S3 tracking tests need boto3 (pip install boto3)")
pytest.importorskip("moto", reason="S3 tracking tests need moto[server] (pip install moto[server])")

from kit import s3 as kit_s3
from kit.s3 import BUCKET

PIPELINE = textwrap.dedent(
    """
    import sys
    import bellis
    from funlib.geometry import Roi

    base = sys.argv[1]

    def work(name):
        def process(block):
            x = block.write_roi.offset[0]
            if name == "b" and x in (3, 7):
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
        )

    a = task("a", None)
    b = task("b", [a])
    ok = bellis.run_blockwise([a, b])
    print("ok" if ok else "failed", flush=True)
    """
)

S3_BASE = f"s3://{BUCKET}/cli"
#: a lock object of another run whose lease is alive: a reader must not take it
LIVE_LOCK = {"run": "someone", "host": "elsewhere", "pid": 1, "started": "2026-01-01T00:00:00"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The same pipeline run into S3 and into a local basedir (distributed, 2 workers):
    block 3 and 7 of task b fail, every other block is done."""
    tmp = tmp_path_factory.mktemp("cli_s3")
    script = tmp / "pipeline.py"
    script.write_text(PIPELINE)
    local = tmp / "local"
    with kit_s3.moto_server() as (env, _server):
        for base in (S3_BASE, str(local)):
            r = subprocess.run(
                [sys.executable, str(script), base],
                env=env,
                cwd=tmp,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert r.returncode == 0 and "failed" in r.stdout, r.stdout + r.stderr
        yield {"env": env, "tmp": tmp, "local": str(local), "script": script}


def bellis(
    run: dict[str, Any], *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bellis", *args],
        env=run["env"],
        cwd=run["tmp"],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _same(text: str, base: str) -> str:
    """``text`` with the store's base and the code's first-seen time made neutral."""
    text = text.replace(base, "BASE")
    return re.sub(r"first seen [0-9-]+ [0-9:]+ UTC", "first seen T", text)


def _lock(env: dict[str, str]) -> Any:
    try:
        body = kit_s3.client(env).get_object(Bucket=BUCKET, Key="cli/b/bellis.lock")["Body"]
    except Exception:
        return None
    return json.loads(body.read())


@pytest.fixture
def live_lease(runs: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Another run's live lock on s3 store b while the test runs; checked left as it was."""
    record = {**LIVE_LOCK, "expires": time.time() + 3600}
    c = kit_s3.client(runs["env"])
    c.put_object(Bucket=BUCKET, Key="cli/b/bellis.lock", Body=json.dumps(record).encode())
    try:
        yield record
        assert _lock(runs["env"]) == record  # no reader took, renewed or removed it
    finally:
        c.delete_object(Bucket=BUCKET, Key="cli/b/bellis.lock")


def test_status_of_a_basedir_on_s3_equals_the_local_one(runs: dict[str, Any]) -> None:
    s3 = bellis(runs, "status", S3_BASE)
    local = bellis(runs, "status", runs["local"])
    assert s3.returncode == 0 and local.returncode == 0, s3.stderr + local.stderr
    assert f"block tracking at {S3_BASE}/a" in s3.stdout  # the URL, its // kept
    assert "s3:/" + BUCKET not in s3.stdout
    assert "done        10" in s3.stdout and "failed      2" in s3.stdout
    assert "###x###x####" in s3.stdout
    assert _same(s3.stdout, S3_BASE) == _same(local.stdout, runs["local"])


def test_status_json_on_s3_equals_the_local_one(
    runs: dict[str, Any], live_lease: dict[str, Any]
) -> None:
    s3 = bellis(runs, "status", f"{S3_BASE}/b", "--json")
    local = bellis(runs, "status", f"{runs['local']}/b", "--json")
    assert s3.returncode == 0 and local.returncode == 0, s3.stderr + local.stderr
    a, b = json.loads(s3.stdout), json.loads(local.stdout)
    assert a["path"] == f"{S3_BASE}/b"
    assert (a["done"], a["failed"], a["untouched"], a["failed_attempts"]) == (10, 2, 0, 2)
    assert a["runs"] == 1
    for d in (a, b):
        d.pop("path")
        for v in d["code_versions"]:
            v.pop("first_seen")
    assert a == b


def test_status_watch_on_s3_ends_when_no_run_holds_the_store(runs: dict[str, Any]) -> None:
    """Two blocks failed, so the count never reaches the total: the watch ends because the
    store's lock object says no run holds it (before, it redrew forever)."""
    s3 = bellis(runs, "status", f"{S3_BASE}/b", "--watch", "0.1", timeout=60)
    local = bellis(runs, "status", f"{runs['local']}/b", "--watch", "0.1", timeout=60)
    assert s3.returncode == 0 and local.returncode == 0, s3.stderr + local.stderr
    for out in (s3.stdout, local.stdout):
        assert "10 of 12 blocks done (83.3%), 2 failed" in out
        assert "no run in progress" in out
        assert out.rstrip().endswith("no run holds the store")
    first = re.compile(r"^\d\d:\d\d:\d\d  ")
    assert _same(first.sub("", s3.stdout), S3_BASE) == _same(
        first.sub("", local.stdout), runs["local"]
    )


def test_status_watch_on_s3_sees_a_live_lease_as_a_run_in_progress(
    runs: dict[str, Any], live_lease: dict[str, Any]
) -> None:
    """While another run's lease is alive the watch redraws and says so; it is ended
    from outside (the run would end it by releasing its lock)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bellis", "status", f"{S3_BASE}/b", "--watch", "0.1"],
        env=runs["env"],
        cwd=runs["tmp"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "run in progress" in line and "no run in progress" not in line, line
        assert proc.poll() is None  # still watching
    finally:
        proc.kill()
        proc.communicate()


def test_report_on_s3_shows_the_local_counts_and_failures(
    runs: dict[str, Any], live_lease: dict[str, Any]
) -> None:
    tmp = runs["tmp"]
    s3 = bellis(runs, "report", S3_BASE, "-o", str(tmp / "s3.html"))
    local = bellis(runs, "report", runs["local"], "-o", str(tmp / "local.html"))
    assert s3.returncode == 0 and local.returncode == 0, s3.stderr + local.stderr
    page = (tmp / "s3.html").read_text()
    assert f"{S3_BASE}/a" in page and f"{S3_BASE}/b" in page
    assert "s3:/" + BUCKET not in page  # no URL folded by Path
    assert "a run is in flight (run someone" in page  # the live lease, read not taken
    assert "RuntimeError" in page and "bad block 3" in page and "bad block 7" in page
    assert f"{S3_BASE}/b/errors/" in page
    local_page = (tmp / "local.html").read_text()
    for task, counts in (("a", ("12", "0", "0", "0")), ("b", ("10", "2", "0", "2"))):
        # the tasks table: done, failed, untouched, failed attempts, ..., the store
        row = r"<td>(\d+)</td><td>(\d+)</td><td>(\d+)</td><td>(\d+)</td><td>[^<]*</td><td>{}</td>"
        on_s3 = re.search(row.format(re.escape(f"{S3_BASE}/{task}")), page)
        on_disk = re.search(row.format(re.escape(f"{runs['local']}/{task}")), local_page)
        assert on_s3 is not None and on_disk is not None, task
        assert on_s3.groups() == on_disk.groups() == counts


def test_plan_on_s3_counts_what_the_local_plan_counts(runs: dict[str, Any]) -> None:
    tmp = runs["tmp"]
    plans = {}
    for name, base in (("s3", S3_BASE), ("local", runs["local"])):
        out = tmp / f"{name}.plan"
        r = bellis(runs, "plan", "--out", str(out), "--", sys.executable, str(runs["script"]), base)
        assert r.returncode == 0, r.stdout + r.stderr
        plans[name] = [json.loads(line)["plan"] for line in out.read_text().splitlines()]
        text = r.stdout
        if name == "s3":
            assert f"store {S3_BASE}/b (exists): on S3" in text
    (s3,), (local,) = plans["s3"], plans["local"]
    keys = ("task_id", "blocks", "done", "failed_before", "left", "store_exists")
    assert [{k: t[k] for k in keys} for t in s3["tasks"]] == [
        {k: t[k] for k in keys} for t in local["tasks"]
    ]
    assert [t["store"] for t in s3["tasks"]] == [f"{S3_BASE}/a", f"{S3_BASE}/b"]
    b = s3["tasks"][1]
    assert (b["done"], b["failed_before"], b["left"]) == (10, 2, 2)
    assert _lock(runs["env"]) is None  # the dry run took no lock


def test_verify_on_s3_of_a_task_without_outputs_says_so_as_locally(runs: dict[str, Any]) -> None:
    r = bellis(runs, "verify", f"{S3_BASE}/b")
    local = bellis(runs, "verify", f"{runs['local']}/b")
    assert r.returncode == local.returncode == 2, r.stderr + local.stderr
    assert f"block tracking at {S3_BASE}/b records no declared outputs (outputs.json)" in r.stderr
    assert _same(r.stderr, S3_BASE) == _same(local.stderr, runs["local"])
    assert r.stdout == ""


def test_tracking_basedir_on_s3_keeps_the_url(tmp_path: Path) -> None:
    """set_tracking_basedir("s3://...") and a task's resolved path keep the URL's //."""
    code = textwrap.dedent(
        f"""
        import bellis
        from funlib.geometry import Roi
        bellis.set_tracking_basedir("s3://{BUCKET}/runs/")
        t = bellis.Task("seg", total_roi=Roi((0,), (4,)), read_roi=Roi((0,), (1,)),
                        write_roi=Roi((0,), (1,)), process_function=lambda b: None)
        u = bellis.Task("u", total_roi=Roi((0,), (4,)), read_roi=Roi((0,), (1,)),
                        write_roi=Roi((0,), (1,)), process_function=lambda b: None,
                        tracking_path="s3://{BUCKET}//x/")
        print(repr(bellis.get_tracking_basedir()))
        print(repr(t.resolved_tracking_path()))
        print(repr(u.resolved_tracking_path()))
        """
    )
    script = tmp_path / "resolve.py"
    script.write_text(code)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        f"'s3://{BUCKET}/runs'",
        f"'s3://{BUCKET}/runs/seg'",
        f"'s3://{BUCKET}//x'",
    ]


def test_task_report_on_s3_keeps_the_url_and_reads_the_errors(runs: dict[str, Any]) -> None:
    code = textwrap.dedent(
        """
        import sys
        import bellis
        from funlib.geometry import Roi
        t = bellis.Task("b", total_roi=Roi((0,), (12,)), read_roi=Roi((0,), (1,)),
                        write_roi=Roi((0,), (1,)), process_function=lambda b: None,
                        tracking_path=sys.argv[1] + "/b")
        r = t.report()
        print(repr(r.store_path))
        print(sorted(e.coord for e in r.errors()))
        """
    )
    script = runs["tmp"] / "task_report.py"
    script.write_text(code)
    out = {}
    for name, base in (("s3", S3_BASE), ("local", runs["local"])):
        r = subprocess.run(
            [sys.executable, str(script), base],
            env=runs["env"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        out[name] = r.stdout.splitlines()
    assert out["s3"][0] == repr(f"{S3_BASE}/b")
    assert out["s3"][1] == out["local"][1] == "[(3,), (7,)]"


def test_status_failed_on_s3_lists_the_local_failures(runs: dict[str, Any]) -> None:
    """``bellis status --failed`` reads a store's errors/ objects on S3 (a store or a
    prefix of them) and finds what the same run's local errors.jsonl holds (``--block``:
    test_stats_s3.py)."""
    s3 = bellis(runs, "status", f"{S3_BASE}/b", "--failed", "--json")
    local = bellis(runs, "status", f"{runs['local']}/b", "--failed", "--json")
    assert s3.returncode == 0 and local.returncode == 0, s3.stderr + local.stderr
    a, b = json.loads(s3.stdout), json.loads(local.stdout)
    assert a["path"] == f"{S3_BASE}/b"

    def groups(d: dict[str, Any]) -> list[tuple[Any, ...]]:
        return sorted(
            (g["kind"], g["title"], g["count"], sorted(map(tuple, g["blocks"])))
            for g in d["errors"]
        )

    assert groups(a) == groups(b)
    assert sorted(x for g in a["errors"] for x in map(tuple, g["blocks"])) == [(3,), (7,)]
    (group,) = a["errors"]  # one error, two messages
    assert group["title"] == "RuntimeError (2 distinct messages)"
    assert {m["message"] for m in group["messages"]} == {"bad block 3", "bad block 7"}
    text = bellis(runs, "status", S3_BASE, "--failed")  # a prefix: every store under it
    assert text.returncode == 0, text.stderr
    assert f"errors in {S3_BASE}/a: none recorded" in text.stdout
    assert f"errors in {S3_BASE}/b (run of " in text.stdout and "2 failed attempts" in text.stdout
