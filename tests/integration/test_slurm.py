"""Workers as real SLURM batch jobs on the single-node CI cluster (``.ci/slurm_setup.sh``)."""

from __future__ import annotations

import functools
import logging
import os
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import bellis
from bellis._launchers._base import WorkerHandle
from bellis._launchers._slurm import SlurmLauncher
from kit.blocks import (
    done_ids,
    hang_once_watched_block,
    make_task,
    read_records,
    sleep_block,
)
from kit.launchers import (
    exit_three,
    hog_memory,
    run_cancelling_a_job,
    run_time_limit_kill,
    run_two_task_pipeline,
    sleep_long,
    standalone_spec,
    wait_for_exit,
)
from kit.slurm import (
    active_jobs,
    job_prefix,
    jobs_named,
    needs_slurm,
    scontrol_job,
    wrap_commands,
)

pytestmark = needs_slurm()


def test_pipeline_runs_as_slurm_jobs(tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    rec.mkdir()
    prefix = job_prefix(tmp_path, "bt")
    launcher = SlurmLauncher(job_name_prefix=prefix, poll_interval=1.0)
    # b's blocks read 10 beyond their write Roi on each side
    run_two_task_pipeline(launcher, rec, 12, context=10)
    assert launcher.live_job_ids() == []
    assert active_jobs(prefix) == []
    finished = jobs_named(prefix)
    assert finished, "the run's jobs should be visible in squeue -t all"
    assert {state for _, state, _ in finished} == {"COMPLETED"}
    names = {name for _, _, name in finished}
    assert all(n.startswith(f"{prefix}-bellis-") and "-w" in n for n in names)
    # the worker's job script and payload sit next to its logs, one per log slot
    scripts = sorted((tmp_path / "logs").rglob("*.sbatch"))
    for task_id in ("a", "b"):
        assert sorted(p.name for p in scripts if p.parent.name == task_id) == [
            "worker_0.sbatch",
            "worker_1.sbatch",
        ]
    assert "exec " in scripts[0].read_text() and "-m bellis._worker._main" in scripts[0].read_text()
    assert list((tmp_path / "logs").rglob("*.payload")) == []
    # job scripts carry the run's secret: only their owner may read them
    assert all(p.stat().st_mode & 0o077 == 0 for p in scripts)


def test_workers_started_together_go_as_one_job_array(tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    rec.mkdir()
    prefix = job_prefix(tmp_path, "bt")
    launcher = SlurmLauncher(job_name_prefix=prefix, poll_interval=1.0, array_threshold=3)
    task = make_task("arr", 12, functools.partial(sleep_block, str(rec), 0.05), max_workers=3)
    states = bellis.run_blockwise(
        task, launcher=launcher, return_states=True, progress=False, summary=False
    )
    assert states["arr"].completed_count == 12
    assert states["arr"].worker_start_count == 3
    assert done_ids(read_records(rec), "arr") == list(range(12))
    jobs = jobs_named(prefix)
    # one array job (squeue lists each array task as <array id>_<index>)
    array_ids = {job_id.split("_")[0] for job_id, _, name in jobs if name.endswith("-array")}
    assert len(array_ids) == 1, jobs
    assert active_jobs(prefix) == []


def test_scancelled_job_is_replaced(tmp_path: Path) -> None:
    prefix = job_prefix(tmp_path, "bt")
    launcher = SlurmLauncher(job_name_prefix=prefix, poll_interval=1.0)

    def running() -> list[str]:
        return [job_id for job_id, _, _ in jobs_named(prefix, "RUNNING")]

    _state, cancelled = run_cancelling_a_job(launcher, tmp_path, "SLURM", running, ["scancel"])
    assert scontrol_job(cancelled)["JobState"] == "CANCELLED"
    assert active_jobs(prefix) == []


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_time_limit_exit_is_reported_and_block_retried(tmp_path: Path) -> None:
    prefix = job_prefix(tmp_path, "bt")
    launcher = SlurmLauncher(job_name_prefix=prefix, time_limit=1, poll_interval=1.0)
    # block 0 sleeps past the one-minute limit on its first attempt only; the worker took
    # it with the whole minute left: the block alone outlasted it
    run_time_limit_kill(launcher, tmp_path, 150)
    jobs = jobs_named(prefix)
    assert sorted(s for _, s, _ in jobs) == ["COMPLETED", "TIMEOUT"]
    assert active_jobs(prefix) == []


#: what SLURM adds to bellis's own deadlines on the loaded single-node CI cluster: the
#: controller recording a job's end (its own exit, or ``scancel``), one ``squeue`` call
#: that sees it and one ``sbatch`` call (docs/launchers.md, "A block past its timeout")
SLURM_LATENCY_SECONDS = 10.0


def _slurm_epoch(stamp: str) -> float:
    """A SLURM time field (``2026-12-06T08:19:03``, this machine's local time) in seconds
    since the epoch (whole seconds: SLURM rounds down)."""
    return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))


def test_block_timeout_kills_the_job(tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    rec.mkdir()
    prefix = job_prefix(tmp_path, "bt")
    timeout, poll = 2.0, 0.5
    launcher = SlurmLauncher(job_name_prefix=prefix, poll_interval=poll)
    bound = timeout + 0.75 + SLURM_LATENCY_SECONDS
    # block 1 hangs on its first attempt; each block after it waits (up to ``bound`` after
    # the hang began) for the hung worker's process to be gone
    block = functools.partial(hang_once_watched_block, str(rec), 1, bound)
    task = make_task("h", 3, block, timeout=timeout, max_retries=2)
    # no bound on the run's wall time: its jobs wait in SLURM's queue for as long as other
    # jobs (another test run's) hold the node, and bellis does not decide that
    states = bellis.run_blockwise(
        task, launcher=launcher, return_states=True, progress=False, summary=False
    )
    # the hung worker was gone within the bound (below), seen by the blocks after it
    seen = [p.read_text() for p in sorted(rec.glob("hung_worker_seen_by_*"))]
    assert seen and all(s.startswith("gone ") for s in seen), seen
    state = states["h"]
    assert state.completed_count == 3
    assert state.failed_count == 0
    assert state.timeout_reclaim_count == 1
    records = read_records(rec)
    assert done_ids(records, "h") == [0, 1, 2]
    jobs = {job_id: scontrol_job(job_id) for job_id, _, _ in jobs_named(prefix)}
    ended = sorted((r["JobState"], r["ExitCode"]) for r in jobs.values())
    # the hung worker's job: scancelled by kill(), or its own watchdog exited 87 first
    hung = [j for j, r in jobs.items() if (r["JobState"], r["ExitCode"]) != ("COMPLETED", "0:0")]
    assert len(hung) == 1, ended
    assert (jobs[hung[0]]["JobState"] == "CANCELLED") or (
        jobs[hung[0]]["JobState"],
        jobs[hung[0]]["ExitCode"],
    ) == ("FAILED", "87:0")
    assert active_jobs(prefix) == []
    # the documented guarantee (docs/launchers.md), from the hung block's start (its first
    # attempt's record): the worker's watchdog ends the job at the timeout, or the server
    # cancels it at most 0.75 s later; the replacement job is submitted as the server
    # reclaims the block, or at the latest one poll_interval after the job's end is recorded
    started = records[("h", 1)][0]
    assert started.kind == "start"
    stopped = _slurm_epoch(jobs[hung[0]]["EndTime"]) - started.t0
    assert stopped <= bound, (stopped, jobs[hung[0]])
    # (one worker at a time: the hung one's job, and the one that replaced it)
    assert len(jobs) == 2, jobs
    (replacement,) = (r for j, r in jobs.items() if j != hung[0])
    replaced = _slurm_epoch(replacement["SubmitTime"]) - started.t0
    assert replaced <= bound + poll, (replaced, jobs)


def test_memory_request_reaches_the_job(tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    rec.mkdir()
    prefix = job_prefix(tmp_path, "bt")
    launcher = SlurmLauncher(job_name_prefix=prefix, mem="200M", cpus_per_worker=1)
    task = make_task("m", 2, functools.partial(sleep_block, str(rec), 0.0))
    states = bellis.run_blockwise(
        task, launcher=launcher, return_states=True, progress=False, summary=False
    )
    assert states["m"].completed_count == 2
    jobs = jobs_named(prefix)
    assert len(jobs) == 1
    record = scontrol_job(jobs[0][0])
    assert record["MinMemoryNode"] == "200M"
    assert record["JobState"] == "COMPLETED"
    assert record["ExitCode"] == "0:0"


def test_unsatisfiable_request_is_a_start_error(tmp_path: Path) -> None:
    prefix = job_prefix(tmp_path, "bt")
    launcher = SlurmLauncher(job_name_prefix=prefix, cpus_per_worker=512)
    task = make_task(
        "c", 1, functools.partial(sleep_block, str(tmp_path), 0.0), max_worker_restarts=1
    )
    task_states = None
    with pytest.raises(RuntimeError):
        task_states = bellis.run_blockwise(
            task, launcher=launcher, return_states=True, progress=False, summary=False
        )
    assert task_states is None
    assert active_jobs(prefix) == []


# -- the launcher alone: workers whose function takes no block never contact a server ---------


def _record_array_index(path: str) -> None:
    Path(path).write_text(os.environ.get("SLURM_ARRAY_TASK_ID", "none"))


def _exit_like_block_timeout() -> None:
    os._exit(87)


def test_job_array_and_failure_exit(tmp_path: Path) -> None:
    prefix = job_prefix(tmp_path, "bt")
    launcher = SlurmLauncher(job_name_prefix=prefix, array_threshold=2, poll_interval=1.0)
    specs = [
        standalone_spec(
            tmp_path, i, functools.partial(_record_array_index, str(tmp_path / f"a{i}"))
        )
        for i in range(3)
    ]
    specs.append(standalone_spec(tmp_path, 3, exit_three))
    specs.append(standalone_spec(tmp_path, 4, _exit_like_block_timeout, timeout_secs=5.0))
    try:
        handles = launcher.launch_many(specs)
        exits = wait_for_exit(launcher, handles, 60)
    finally:
        launcher.close()
    assert [e.kind for e in exits] == ["clean", "clean", "clean", "error", "timeout"]
    assert exits[4].code == 87
    assert "exceeded timeout=5s" in exits[4].message
    assert exits[3].code == 3
    assert "exited with code 3" in exits[3].message
    assert "about to fail" in exits[3].message
    assert [(tmp_path / f"a{i}").read_text() for i in range(3)] == ["0", "1", "2"]
    ids = [h.native.job_id for h in handles]
    base = ids[0].split("_")[0]
    assert ids == [f"{base}_{i}" for i in range(5)]
    assert scontrol_job(ids[3])["JobState"] == "FAILED"
    assert scontrol_job(ids[3])["ExitCode"] == "3:0"


def test_over_memory_job_reports_out_of_memory(tmp_path: Path) -> None:
    prefix = job_prefix(tmp_path, "bt")
    launcher = SlurmLauncher(job_name_prefix=prefix, mem="100M", poll_interval=0.5)
    try:
        handle = launcher.launch(standalone_spec(tmp_path, 0, functools.partial(hog_memory, 600)))
        (exit_,) = wait_for_exit(launcher, [handle], 40)
    finally:
        launcher.close()
    assert exit_.kind == "error"
    assert exit_.message.startswith("out of memory")
    assert scontrol_job(handle.native.job_id)["JobState"] in ("FAILED", "OUT_OF_MEMORY")


def test_close_cancels_running_jobs(tmp_path: Path) -> None:
    prefix = job_prefix(tmp_path, "bt")
    launcher = SlurmLauncher(job_name_prefix=prefix)
    handle = launcher.launch(standalone_spec(tmp_path, 0, sleep_long))
    job_id = handle.native.job_id
    try:
        # (no bound on the wait: the job pends for as long as other jobs hold the node)
        while scontrol_job(job_id)["JobState"] != "RUNNING":
            time.sleep(0.2)
    finally:
        launcher.close()
    assert scontrol_job(job_id)["JobState"] == "CANCELLED"
    assert launcher.live_job_ids() == []
    assert active_jobs(prefix) == []


def _raise_old_error(block: Any) -> None:
    raise ValueError("OLD ERROR FROM AN EARLIER RUN")


def _exit_silently(block: Any) -> None:
    os._exit(3)


def test_worker_logs_are_appended_and_an_exit_quotes_only_its_own_part(tmp_path: Path) -> None:
    prefix = job_prefix(tmp_path, "bt")
    launcher = SlurmLauncher(job_name_prefix=prefix, poll_interval=0.5)
    first = make_task("slot", 1, _raise_old_error, max_workers=1, max_retries=0)
    assert not bellis.run_blockwise(first, launcher=launcher, progress=False, summary=False)
    second = make_task("slot", 1, _exit_silently, max_workers=1, max_worker_restarts=0)
    with pytest.raises(bellis.TaskAbandonedError) as info:
        bellis.run_blockwise(second, launcher=launcher, progress=False, summary=False)
    err = (tmp_path / "logs" / "slot" / "worker_0.err").read_text()
    # both runs' output is in the log, with the driver's separator between them
    assert "OLD ERROR FROM AN EARLIER RUN" in err and "=== bellis run " in err
    state = info.value.daisy_states["slot"]  # type: ignore[attr-defined]
    assert "exited with code 3" in state.last_worker_error
    assert "OLD ERROR" not in state.last_worker_error
    assert not state.last_worker_error.startswith("out of memory")


def test_a_failed_submission_among_several_cancels_the_jobs_submitted_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    count = tmp_path / "sbatch-calls"
    # the second sbatch call fails (a controller hiccup); the others go through
    wrap_commands(
        tmp_path,
        monkeypatch,
        {
            "sbatch": f"n=$(($(cat {count} 2>/dev/null || echo 0) + 1)); echo $n > {count}\n"
            'if [ "$n" = 2 ]; then echo "Socket timed out" >&2; exit 1; fi\n'
        },
    )
    rec = tmp_path / "rec"
    rec.mkdir()
    prefix = job_prefix(tmp_path, "bt")
    launcher = SlurmLauncher(job_name_prefix=prefix, poll_interval=0.5, array_threshold=10)
    task = make_task(
        "p", 6, functools.partial(sleep_block, str(rec), 0.2), max_workers=2, max_worker_restarts=4
    )
    states = bellis.run_blockwise(
        task, launcher=launcher, return_states=True, progress=False, summary=False
    )
    s = states["p"]
    assert (s.completed_count, s.failed_count, s.orphaned_count) == (6, 0, 0)
    # the job submitted with the failed one was cancelled, not left to join unwatched
    assert task.report().workers.unmanaged_clients == 0
    assert "CANCELLED" in {state for _, state, _ in jobs_named(prefix)}
    assert list((tmp_path / "logs").rglob("*.payload")) == []
    assert active_jobs(prefix) == []


def test_workers_that_exit_at_shutdown_are_seen_to_exit_with_a_slow_poll_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = tmp_path / "scancel-calls"
    wrap_commands(tmp_path, monkeypatch, {"scancel": f'echo "$@" >> {calls}\n'})
    rec = tmp_path / "rec"
    rec.mkdir()
    prefix = job_prefix(tmp_path, "bt")
    launcher = SlurmLauncher(job_name_prefix=prefix, poll_interval=30.0)
    task = make_task("s", 4, functools.partial(sleep_block, str(rec), 0.0), max_workers=2)
    states = bellis.run_blockwise(
        task, launcher=launcher, return_states=True, progress=False, summary=False
    )
    assert states["s"].completed_count == 4
    # the jobs ended on their own and were seen to: nothing had to be cancelled
    assert not calls.exists(), calls.read_text()
    assert task.report().workers.exits == {"clean": 2}
    assert {state for _, state, _ in jobs_named(prefix)} == {"COMPLETED"}


def test_a_job_that_stays_pending_is_reported_with_its_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="bellis")
    rec = tmp_path / "rec"
    rec.mkdir()
    prefix = job_prefix(tmp_path, "bt")
    # held jobs wait until released: the run must say so rather than wait in silence
    launcher = SlurmLauncher(
        job_name_prefix=prefix, poll_interval=0.3, pending_warning=1.0, extra_args=["--hold"]
    )
    task = make_task("h", 2, functools.partial(sleep_block, str(rec), 0.0), max_workers=1)
    released: list[str] = []

    def release_after_the_warning() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if any("is still pending after" in r.getMessage() for r in caplog.records):
                for job_id, _, _ in active_jobs(prefix):
                    subprocess.run(["scontrol", "release", job_id], check=True, timeout=30)
                    released.append(job_id)
                return
            time.sleep(0.1)

    releaser = threading.Thread(target=release_after_the_warning, daemon=True)
    releaser.start()
    states = bellis.run_blockwise(
        task, launcher=launcher, return_states=True, progress=False, summary=False
    )
    releaser.join()
    assert released and states["h"].completed_count == 2
    warning = next(r.getMessage() for r in caplog.records if "still pending" in r.getMessage())
    assert "Reason=" in warning and f"squeue -j {released[0].split('_')[0]}" in warning


def test_pending_warning_must_be_positive() -> None:
    with pytest.raises(ValueError, match=r"pending_warning must be positive seconds \(got 0\)"):
        SlurmLauncher(pending_warning=0)


def test_a_job_that_vanishes_while_pending_is_reported_lost(tmp_path: Path) -> None:
    """A job purged while it waited (an admin, a controller failover) is gone from squeue
    and scontrol while its last known state is PENDING: it is lost, not waited for."""
    from bellis._launchers._slurm import _Job

    launcher = SlurmLauncher(job_name_prefix=job_prefix(tmp_path, "bt"), poll_interval=0.1)
    spec = standalone_spec(tmp_path, 0, exit_three)
    # a job id SLURM has never heard of, as a purged job looks
    job = _Job("999999999", spec, "vanished", None, tmp_path / "none.payload")
    launcher._jobs[job.job_id] = job
    try:
        deadline = time.monotonic() + 30
        while job.exit is None and time.monotonic() < deadline:
            launcher.poll(WorkerHandle(spec, job))
            time.sleep(0.1)
    finally:
        launcher.close()
    assert job.exit is not None and job.exit.kind == "error"
    assert "job lost" in job.exit.message


def _one_block_then_exit() -> None:
    wid = bellis.Context.from_env()["worker_id"]
    client = bellis.Client()
    with client.acquire_block() as block:
        if block is None:
            return
        print(f"OUT worker {wid} block {block.block_id[1]}", flush=True)
    client.close()  # the block's result goes home before the job fails
    os._exit(3)


def test_restarted_jobs_append_to_their_slot_files(tmp_path: Path) -> None:
    prefix = job_prefix(tmp_path, "bt")
    launcher = SlurmLauncher(job_name_prefix=prefix, poll_interval=0.5, array_threshold=2)
    task = make_task(
        "slots", 8, _one_block_then_exit, max_workers=2, max_worker_restarts=30, max_retries=5
    )
    states = bellis.run_blockwise(
        task, launcher=launcher, return_states=True, progress=False, summary=False
    )
    state = states["slots"]
    assert state.completed_count == 8
    assert state.worker_start_count >= 8
    logdir = tmp_path / "logs" / "slots"
    names = sorted(p.name for p in logdir.iterdir())
    # two log files per slot; the job scripts go per slot too (each array has its own
    # script, removed once its elements have ended); the payloads are removed at the end
    logs = [n for n in names if n.endswith((".out", ".err"))]
    assert logs == ["worker_0.err", "worker_0.out", "worker_1.err", "worker_1.out"]
    others = {"worker_0.sbatch", "worker_1.sbatch", "worker_array.sbatch", "runs.jsonl"}
    assert set(names) - set(logs) <= others, names
    header = re.compile(r"^=== bellis worker (\d+) \(slot (\d)\) started \S+: (.*) ===$")
    slot_of: dict[int, int] = {}
    for slot in (0, 1):
        text = (logdir / f"worker_{slot}.out").read_text().splitlines()
        current = None
        for line in text:
            m = header.match(line)
            if m is not None:
                current = int(m[1])
                assert int(m[2]) == slot
                slot_of[current] = slot
            else:
                assert line.startswith(f"OUT worker {current} block "), line
    assert len(slot_of) == state.worker_start_count
    report = task.report()
    for wid, slot in slot_of.items():
        record = report.worker(wid)
        assert record.slot == slot
        assert record.log_files is not None
        assert Path(record.log_files[0]).resolve() == (logdir / f"worker_{slot}.out").resolve()
