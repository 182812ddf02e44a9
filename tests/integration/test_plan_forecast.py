"""Issue 28, item 2: ``bellis.plan(tasks, sample=N)`` really runs a sample of blocks on the
task's launcher, records them done (the real run skips them), and forecasts the rest.

A user script plans a two-task pipeline with a sample, then runs it for real. Every block
appends its id to a file when it runs, so the test sees which blocks ran when, and how
often. A downstream block checks that the upstream blocks it reads have run (a sampled
downstream block needs its upstream blocks sampled too) and fails otherwise.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from kit import browser
from kit.slurm import job_prefix, needs_slurm
from kit.user_script import run_script

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    import bellis
    from bellis import Roi

    mode, launcher = sys.argv[1], sys.argv[2]
    base = os.getcwd()
    W = 10

    def log(name, block):
        fd = os.open(os.path.join(base, name), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(fd, (str(block.block_id[1]) + "\\n").encode())
        os.close(fd)

    def up(block):
        time.sleep(0.002)
        log("ran_a", block)
        o = [int(v) for v in block.write_roi.offset]
        open(os.path.join(base, "out_a", f"{o[0]}_{o[1]}"), "w").close()

    def down(block):
        r = block.read_roi
        for x in range(int(r.begin[0]), int(r.end[0]), W):
            for y in range(int(r.begin[1]), int(r.end[1]), W):
                if not os.path.exists(os.path.join(base, "out_a", f"{x}_{y}")):
                    raise RuntimeError(f"upstream output {x}_{y} missing")
        log("ran_b", block)

    def main(kw):
        os.makedirs(os.path.join(base, "out_a"), exist_ok=True)
        total = Roi((0, 0), (200, 200))
        a = bellis.Task("a", total, Roi((0, 0), (W, W)), Roi((0, 0), (W, W)),
                        process_function=up, max_workers=2, max_retries=0,
                        resource_tracking=True, **kw)
        b = bellis.Task("b", Roi((0, 0), (200, 200)), Roi((0, 0), (3 * W, 3 * W)),
                        Roi((W, W), (W, W)), process_function=down, max_workers=2,
                        read_write_conflict=False, max_retries=0, **kw)
        bellis.set_tracking_basedir(os.path.join(base, "tracking"))
        distributed = mode == "distributed"
        plan = bellis.plan(a + b, sample=25, multiprocessing=distributed, seed=3)
        with open(os.path.join(base, "plan.json"), "w") as f:
            json.dump(plan.to_json(), f)
        for name in ("ran_a", "ran_b"):
            os.replace(os.path.join(base, name), os.path.join(base, name + "_sample"))
        ok = bellis.run_blockwise(a + b, multiprocessing=distributed, progress=False,
                                  summary=False)
        print("@@" + json.dumps({"ok": ok}))

    if __name__ == "__main__":
        if launcher == "slurm":
            main({"launcher": bellis.SlurmLauncher(
                job_name_prefix=sys.argv[3], poll_interval=0.5, time_limit=10, mem="1M",
                partition="oversub")})
        elif launcher == "dask":
            from distributed import Client, LocalCluster

            with LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                              dashboard_address=":0", scheduler_port=0, host="127.0.0.1",
                              silence_logs=40) as lc, Client(lc) as client:
                main({"launcher": bellis.DaskLauncher(client)})
        else:
            main({})
    """
)

RUN_FIELDS = {
    "blocks_left",
    "blocks_done",
    "done_before",
    "sampled",
    "start_delay_seconds",
    "warm_up_seconds",
    "round_trip_seconds",
    "overhead_seconds_per_block",
    "workers",
    "wall",
    "core_hours",
    "worker_hours",
    "alternatives",
}
TASK_FIELDS = {
    "sampled",
    "sampled_done",
    "sample_failed",
    "sample_asked",
    "sample_picked",
    "sample_found_done",
    "done_before",
    "left_before",
    "cost_model",
    "block_wall",
    "block_cpu",
    "peak_rss",
    "time_limit",
    "wall",
    "core_hours",
}
STAT_FIELDS = {"mean", "p50", "p95", "p99", "max"}


def _ids(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def _interval_ok(d: dict[str, float]) -> None:
    assert set(d) == {"estimate", "low", "high"}
    assert 0 <= d["low"] <= d["estimate"] <= d["high"]


def _check(tmp_path: Path, proc: Any, launcher: str) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plan = json.loads((tmp_path / "plan.json").read_text())
    a, b = plan["tasks"]
    sample_a, sample_b = _ids(tmp_path / "ran_a_sample"), _ids(tmp_path / "ran_b_sample")
    # the sample ran, each block once; b's sampled blocks brought the upstream blocks they
    # read into a's sample, so none of them failed
    assert len(set(sample_b)) == len(sample_b) == 25
    assert len(set(sample_a)) == len(sample_a) >= 25
    assert b["forecast"]["sampled"] == b["forecast"]["sampled_done"] == 25
    assert a["forecast"]["sampled"] == a["forecast"]["sampled_done"] == len(sample_a)
    assert a["forecast"]["sample_failed"] == b["forecast"]["sample_failed"] == 0
    # ... and was recorded done: the plan counts it, and the real run skips it
    assert (a["done"], a["left"]) == (len(sample_a), 400 - len(sample_a))
    assert (b["done"], b["left"]) == (25, b["blocks"] - 25)
    assert '"ok": true' in proc.stdout
    real_a, real_b = _ids(tmp_path / "ran_a"), _ids(tmp_path / "ran_b")
    assert len(real_a) + len(sample_a) == 400 and not set(real_a) & set(sample_a)
    assert len(real_b) + len(sample_b) == b["blocks"] and not set(real_b) & set(sample_b)
    # every field of the forecast
    f = plan["forecast"]
    assert set(f) == RUN_FIELDS
    assert f["blocks_left"] == a["left"] + b["left"]
    assert f["sampled"] == len(sample_a) + len(sample_b)
    for key in ("wall", "core_hours", "worker_hours"):
        _interval_ok(f[key])
    assert f["wall"]["estimate"] > 0.002 * a["left"] / 2  # at least the sleeps on 2 workers
    if plan["mode"] == "distributed":
        assert [alt["scale"] for alt in f["alternatives"]] == [0.5, 2.0, 4.0]
        for alt in f["alternatives"]:
            _interval_ok(alt["wall"])
        walls = [alt["wall"]["estimate"] for alt in f["alternatives"]]
        assert walls[0] >= f["wall"]["estimate"] >= walls[1] >= walls[2]
    else:
        assert f["alternatives"] == []
    for t in (a, b):
        tf = t["forecast"]
        assert set(tf) == TASK_FIELDS
        assert set(tf["block_wall"]) == set(tf["block_cpu"]) == STAT_FIELDS
        assert tf["block_wall"]["p50"] > 0
        rss = tf["peak_rss"]
        assert set(rss) == STAT_FIELDS | {"request", "ladder", "configured"}
        assert 0 < rss["p50"] <= rss["p95"] <= rss["p99"] <= rss["max"] < rss["request"]
        assert rss["ladder"][0] == rss["request"] and rss["ladder"] == sorted(rss["ladder"])
        _interval_ok(tf["wall"])
        _interval_ok(tf["core_hours"])
        assert (tf["time_limit"] is None) == (launcher != "slurm")
    _check_scored(tmp_path, plan)
    return plan


def _check_scored(tmp_path: Path, plan: dict[str, Any]) -> None:
    """The real run took each task's forecast and scored it in its run line."""
    for t, tracked in zip(plan["tasks"], (True, False), strict=True):
        store = tmp_path / "tracking" / t["task_id"]
        assert not (store / "forecast.json").exists()  # taken by the run
        sample_line, run_line = (
            json.loads(x) for x in (store / "runs.jsonl").read_text().splitlines()
        )
        assert "forecast" not in sample_line
        scored = run_line["forecast"]
        assert scored["wall"] == plan["forecast"]["wall"]
        assert scored["task_wall"] == t["forecast"]["wall"]
        assert scored["core_hours"] == t["forecast"]["core_hours"]
        assert scored["peak_rss_p99"] == t["forecast"]["peak_rss"]["p99"]
        assert (scored["blocks_left"], scored["sampled"]) == (t["left"], t["forecast"]["sampled"])
        actual, err = scored["actual"], scored["error_pct"]
        assert actual["wall"] == run_line["wall_seconds"] > 0
        assert actual["blocks"] == t["left"]
        assert err["wall"] == pytest.approx(
            100 * (scored["wall"]["estimate"] - actual["wall"]) / actual["wall"]
        )
        if tracked:  # resource tracking: CPU and memory measured too
            cpu = run_line["blocks"]["cpu"]["total"] + run_line["blocks"]["cpu_children"]["total"]
            assert actual["core_hours"] == pytest.approx(cpu / 3600)
            assert 0 < actual["peak_rss_p99"] <= run_line["blocks"]["peak_rss"]["max"]
            assert err["peak_rss_p99"] == pytest.approx(
                100 * (scored["peak_rss_p99"] - actual["peak_rss_p99"]) / actual["peak_rss_p99"]
            )
        else:
            assert actual["core_hours"] is actual["peak_rss_p99"] is None
            assert err["core_hours"] is err["peak_rss_p99"] is None


@pytest.mark.parametrize("mode", ["serial", "distributed"])
def test_a_forecast_runs_its_sample_records_it_done_and_says_everything(
    tmp_path: Path, mode: str
) -> None:
    proc = run_script(tmp_path, SCRIPT, mode, "local")
    plan = _check(tmp_path, proc, "local")
    assert "forecast (from the sample" in proc.stdout
    assert plan["tasks"][0]["launcher"] == ("local" if mode == "distributed" else "serial")
    _check_report(tmp_path)


def _check_report(tmp_path: Path) -> None:
    """``bellis report`` shows the scored forecasts, one row per task, in Chromium."""
    out = tmp_path / "report.html"
    proc = subprocess.run(
        [sys.executable, "-m", "bellis", "report", str(tmp_path / "tracking"), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Forecast vs actual" in out.read_text(encoding="utf-8")
    if browser.chromium() is None:
        return
    probe = """
    var rows = [];
    document.querySelectorAll('#forecast table tr').forEach(function (tr) {
      rows.push(Array.prototype.map.call(tr.children, function (c) { return c.textContent; }));
    });
    return {title: document.querySelector('#forecast h2').textContent, rows: rows};
    """
    found = browser.load(out, probe)
    assert found["errors"] == [] and found["rendered"] == "yes"
    rows = found["result"]["rows"]
    assert found["result"]["title"] == "Forecast vs actual"
    assert rows[0][:6] == ["task", "run", "started (UTC)", "wall forecast", "wall actual", "error"]
    body = {r[0]: r for r in rows[1:]}
    assert set(body) == {"a", "b"} and len(rows) == 3
    for task in ("a", "b"):
        line = json.loads((tmp_path / "tracking" / task / "runs.jsonl").read_text().splitlines()[1])
        err = line["forecast"]["error_pct"]["wall"]
        assert body[task][1] == "2"  # the second run line: the real run
        assert body[task][5] == f"{err:+.1f}%"
    assert body["a"][8].endswith("%") and body["b"][8] == "-"  # core-hours: a was tracked


@pytest.mark.dask
def test_a_forecast_runs_its_sample_on_dask_workers(tmp_path: Path) -> None:
    pytest.importorskip("distributed", reason="dask.distributed is not installed")
    proc = run_script(tmp_path, SCRIPT, "distributed", "dask")
    plan = _check(tmp_path, proc, "dask")
    assert [t["launcher"] for t in plan["tasks"]] == ["dask", "dask"]


@pytest.mark.parametrize("marks", [pytest.param(0, marks=needs_slurm())])
def test_a_forecast_on_slurm_gives_a_time_limit_and_warns_of_a_low_memory_request(
    tmp_path: Path, marks: int
) -> None:
    proc = run_script(tmp_path, SCRIPT, "distributed", "slurm", job_prefix(tmp_path, "pf"))
    plan = _check(tmp_path, proc, "slurm")
    for t in plan["tasks"]:
        assert t["launcher"] == "slurm"
        assert t["forecast"]["peak_rss"]["configured"] == 1 << 20
    assert any("the memory request 1.0 MiB is below the sampled p99" in w for w in plan["warnings"])


SLOW = textwrap.dedent(
    """
    import json, os, sys, time
    import bellis
    from bellis import Roi

    def slow(block):
        time.sleep(0.3)

    launcher = bellis.SlurmLauncher(job_name_prefix=sys.argv[1], poll_interval=0.5,
                                    time_limit=1, partition="oversub")
    t = bellis.Task("slow", Roi((0,), (500,)), Roi((0,), (1,)), Roi((0,), (1,)),
                    process_function=slow, max_workers=2, max_worker_restarts=0,
                    launcher=launcher)
    bellis.set_tracking_basedir("tracking")
    plan = bellis.plan(t, sample=10)
    print("@@" + json.dumps(plan.to_json()))
    """
)


@pytest.mark.parametrize("marks", [pytest.param(0, marks=needs_slurm())])
def test_a_forecast_warns_when_the_run_would_outlast_the_job_time_limit(
    tmp_path: Path, marks: int
) -> None:
    # 490 blocks of 0.3 s on 2 workers: over a minute, and each worker is one 1-minute job
    proc = run_script(tmp_path, SLOW, job_prefix(tmp_path, "pt"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("@@"))
    plan = json.loads(line[2:])
    (t,) = plan["tasks"]
    assert t["done"] == 10 and t["left"] == 490
    assert plan["forecast"]["wall"]["estimate"] > 60
    limit = t["forecast"]["time_limit"]
    h, m, s = (int(x) for x in limit.split(":"))
    assert h * 3600 + m * 60 + s >= 1.25 * t["forecast"]["wall"]["high"] + 300
    assert any(
        "outlasts the job time limit (1) times its 1 starts" in w and limit in w
        for w in plan["warnings"]
    ), plan["warnings"]
    assert "warning: task 'slow': the forecast wall" in proc.stdout
