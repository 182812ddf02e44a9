"""``LsfLauncher`` and ``PbsLauncher`` end to end against command-line stand-ins
(``kit/standins``): ``bsub``/``bjobs``/``bkill`` and ``qsub``/``qstat``/``qdel`` that run
jobs as local processes, print the formats IBM and Altair document, and kill a job over
its memory or time limit as the systems do. The scenarios are the SLURM tests' own: a
pipeline, a job killed mid-run, out of memory and the memory ladder, walltime hand-over
and a job killed at its time limit (LSF's in scaled minutes), teardown with no job left
behind, and LSF's refusal of a job without a project."""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from pathlib import Path

import pytest

import bellis
from bellis._launchers._base import WorkerSpec
from kit.batch import active, drained, job_records, make_launcher, use_standins
from kit.blocks import done_ids, make_task, read_records, sleep_block
from kit.launchers import (
    exit_three,
    hog_memory,
    run_cancelling_a_job,
    run_time_limit_kill,
    run_two_task_pipeline,
    run_walltime_handover,
    sleep_long,
    standalone_spec,
    wait_for_exit,
)
from kit.user_script import check_memory_ladder, hog_script, run_script

SYSTEMS = ["lsf", "pbs"]


@pytest.fixture(params=SYSTEMS)
def system(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    use_standins(request.param, tmp_path, monkeypatch)
    return str(request.param)


def _state(tmp_path: Path, system: str) -> Path:
    return tmp_path / f"{system}-state"


def test_pipeline_runs_as_batch_jobs(system: str, tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    rec.mkdir()
    launcher = make_launcher(system, "bp", array_threshold=2)
    run_two_task_pipeline(launcher, rec, 12, context=10)
    assert launcher.live_job_ids() == []
    records = job_records(_state(tmp_path, system))
    # four workers; those started together went as one array of two elements
    assert len(records) == 4
    assert {(r["how"], r["code"]) for r in records} == {("exited", 0)}
    assert all(r["name"].startswith("bp-bellis-") for r in records)
    arrays = [r for r in records if r["index"] is not None]
    assert arrays and all(r["name"].endswith("-array") for r in arrays)
    # LSF numbers array elements from 1, PBS from 0
    first = 1 if system == "lsf" else 0
    assert sorted(r["index"] for r in arrays if r["name"].startswith("bp-bellis-a-")) == [
        first,
        first + 1,
    ]
    # the job script and the system's own files sit next to the workers' logs
    logs = tmp_path / "logs"
    # (the array's own script went when its elements had ended)
    assert sorted(p.name for p in (logs / "a").glob("worker_array*")) == sorted(
        [f"worker_array_{first + i}.{system}.{ext}" for i in (0, 1) for ext in ("out", "err")]
    )
    assert all(p.stat().st_mode & 0o077 == 0 for p in logs.rglob(f"*.{system}"))
    assert list(logs.rglob("*.payload")) == []
    out = (logs / "a" / "worker_0.out").read_text()
    assert "=== bellis worker" in out


def test_a_killed_job_is_replaced(system: str, tmp_path: Path) -> None:
    state = _state(tmp_path, system)
    launcher = make_launcher(system, "bk")
    # qdel's SIGTERM lets a bellis worker finish its block and exit 0, which PBS records
    # as such (a clean exit): -W force kills the job at once, as bkill's TERM_OWNER ends it
    cancel = ["bkill"] if system == "lsf" else ["qdel", "-W", "force"]
    suffix = "" if system == "lsf" else ".standin"

    def running() -> list[str]:
        return [f"{r['job']}{suffix}" for r in active(state) if r["state"] == "running"]

    run_cancelling_a_job(launcher, tmp_path, system.upper(), running, cancel, pause=0.1)
    assert drained(state) == []


def test_exit_codes_and_the_memory_kill_are_told_apart(system: str, tmp_path: Path) -> None:
    launcher = make_launcher(system, "bx", mem="150M")
    try:
        handles = [
            launcher.launch(standalone_spec(tmp_path, 0, exit_three)),
            launcher.launch(standalone_spec(tmp_path, 1, functools.partial(hog_memory, 400))),
        ]
        failed, oom = wait_for_exit(launcher, handles, 60)
    finally:
        launcher.close()
    assert (failed.kind, failed.code) == ("error", 3)
    assert "exited with code 3" in failed.message and "about to fail" in failed.message
    assert oom.kind == "error"
    assert oom.message.startswith(f"out of memory: {system.upper()} job ")
    # the system's own words for the kill, from its files, come with the message
    if system == "pbs":
        assert "PBS: job killed: mem" in oom.message
    records = {r["key"]: r for r in job_records(_state(tmp_path, system))}
    assert [r["mem_mb"] for r in records.values()] == [150, 150]
    assert active(_state(tmp_path, system)) == []


def test_close_cancels_running_jobs(system: str, tmp_path: Path) -> None:
    state = _state(tmp_path, system)
    launcher = make_launcher(system, "bc")
    handle = launcher.launch(standalone_spec(tmp_path, 0, sleep_long))
    deadline = time.monotonic() + 30
    while not [r for r in active(state) if r["state"] == "running"]:
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.1)
    launcher.close()
    assert launcher.live_job_ids() == []
    assert active(state) == []
    (record,) = job_records(state)
    assert record["how"] == "cancelled"
    assert handle.native.exit is not None and "was cancelled" in handle.native.exit.message


def test_an_interrupted_run_leaves_no_job(system: str, tmp_path: Path) -> None:
    """Jobs of an array, some still waiting for their turn under the cap, all end when the
    run is torn down."""
    state = _state(tmp_path, system)
    launcher = make_launcher(system, "bi", array_threshold=2, array_cap=1)
    specs = [standalone_spec(tmp_path, i, sleep_long, slot=i) for i in range(3)]
    handles = launcher.launch_many(specs)
    deadline = time.monotonic() + 30
    while not [r for r in active(state) if r["state"] == "running"]:
        assert time.monotonic() < deadline, "no element started"
        time.sleep(0.1)
    # the cap holds: one element runs, the others wait
    assert sorted(r["state"] for r in active(state)) == ["pending", "pending", "running"]
    launcher.cancel(handles, grace_seconds=5.0)
    launcher.close()
    assert drained(state) == []
    assert launcher.live_job_ids() == []
    assert all("was cancelled" in (h.native.exit.message or "") for h in handles)


def _record_job(recdir: str, worker_id: int, gate: str | None) -> None:
    """Write which job ran worker ``worker_id``; with ``gate``, first wait for that file."""
    deadline = time.monotonic() + 120
    while gate is not None and not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    job = os.environ.get("LSB_JOBID") or os.environ.get("PBS_JOBID") or "?"
    index = os.environ.get("LSB_JOBINDEX") or os.environ.get("PBS_ARRAY_INDEX") or "?"
    (Path(recdir) / f"w{worker_id}").write_text(f"{job} {index}")


def test_pending_array_elements_run_their_own_worker(system: str, tmp_path: Path) -> None:
    """A second array launched while elements of the first still wait under the cap: each
    element, whenever it starts, runs the worker of its own slot (an array's script is its
    own file, not one rewritten by the next array), and the scripts go once all ended."""
    state = _state(tmp_path, system)
    rec = tmp_path / "rec"
    rec.mkdir()
    gate = tmp_path / "gate"
    logs = tmp_path / "logs"
    launcher = make_launcher(system, "bu", array_threshold=2, array_cap=1)

    def specs(ids: range, gated: bool) -> list[WorkerSpec]:
        fn = functools.partial(_record_job, str(rec))
        return [
            standalone_spec(
                tmp_path, i, functools.partial(fn, i, str(gate) if gated else None), slot=i
            )
            for i in ids
        ]

    try:
        first = launcher.launch_many(specs(range(4), gated=True))
        deadline = time.monotonic() + 60
        while not [r for r in active(state) if r["state"] == "running"]:
            assert time.monotonic() < deadline, "no element of the first array started"
            time.sleep(0.1)
        second = launcher.launch_many(specs(range(4, 8), gated=False))
        # the first array's first element waits at the gate, the cap holds the others back
        first_job = job_records(state)[0]["job"]
        assert sorted(r["state"] for r in job_records(state) if r["job"] == first_job) == [
            "pending",
            "pending",
            "pending",
            "running",
        ]
        assert len(list(logs.glob(f"worker_array*.{system}"))) == 2
        gate.touch()
        exits = wait_for_exit(launcher, [*first, *second], 180)
        # every element has ended: no array script is left behind
        assert list(logs.glob(f"worker_array*.{system}")) == []
    finally:
        launcher.close()
    assert [(e.kind, e.code) for e in exits] == [("clean", 0)] * 8, [e.message for e in exits]
    records = job_records(state)
    assert len(records) == 8 and {(r["how"], r["code"]) for r in records} == {("exited", 0)}
    first_index = 1 if system == "lsf" else 0
    for worker_id, handle in enumerate([*first, *second]):
        job, index = (rec / f"w{worker_id}").read_text().split()
        # the element that ran worker n is the one launched for it, at its slot's index
        assert int(index) == worker_id + first_index
        assert handle.native.index == int(index)
        if system == "lsf":
            assert f"{job}[{index}]" == handle.native.job_id
        else:
            assert job == handle.native.job_id
    assert active(state) == []


def test_lsf_without_a_required_project_is_a_start_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = use_standins("lsf", tmp_path, monkeypatch)
    monkeypatch.setenv("BELLIS_STANDIN_REQUIRE_PROJECT", "1")
    launcher = make_launcher("lsf", "bn")
    with pytest.raises(bellis.WorkerStartError) as info:
        launcher.launch(standalone_spec(tmp_path, 0, exit_three))
    message = str(info.value)
    # bsub's own words, and the fix
    assert "bsub exited with code 255" in message
    assert "Request aborted by esub. Job not submitted." in message
    assert "LsfLauncher(project=...)" in message
    # a run stops at the first refusal, with that message as the task's error: no
    # restart is spent on a request bsub refuses for good
    task = make_task("p", 2, functools.partial(sleep_block, str(tmp_path), 0.0), max_workers=1)
    with pytest.raises(bellis.TaskAbandonedError) as abandoned:
        bellis.run_blockwise(task, launcher=launcher, progress=False)
    task_state = abandoned.value.daisy_states["p"]  # type: ignore[attr-defined]
    assert "Request aborted by esub. Job not submitted." in task_state.last_worker_error
    assert task_state.worker_failure_count == 1 and task_state.worker_restart_count == 0
    assert job_records(state) == []
    # with a project the same run goes through
    rec = tmp_path / "rec"
    rec.mkdir()
    task = make_task("p", 2, functools.partial(sleep_block, str(rec), 0.0))
    assert bellis.run_blockwise(
        task, launcher=make_launcher("lsf", "bn", project="lab"), progress=False
    )
    assert {r["options"]["-P"][0] for r in job_records(state)} == {"lab"}


def _memory_script(system: str) -> str:
    """The memory ladder's user script on ``system``'s launcher, ``mem="150M"``."""
    cls = "LsfLauncher" if system == "lsf" else "PbsLauncher"
    return hog_script(
        hog_mb=300,
        hold=2,
        who=(
            "f\"{os.environ.get('LSB_JOBID') or os.environ.get('PBS_JOBID')}-"
            "{os.environ.get('LSB_JOBINDEX') or os.environ.get('PBS_ARRAY_INDEX') or '0'}\""
        ),
        grant='os.environ.get("BELLIS_STANDIN_MEM_MB", "?")',
        launcher=f'bellis.{cls}(mem="150M", poll_interval=0.3, job_name_prefix=arg)',
    )


def test_a_block_out_of_memory_succeeds_in_a_larger_job(system: str, tmp_path: Path) -> None:
    proc = run_script(tmp_path, _memory_script(system), "bm", name="run.py")
    check_memory_ladder(tmp_path, proc, 150)
    assert active(_state(tmp_path, system)) == []


def _sleep_briefly() -> None:
    time.sleep(3)


def test_pbs_without_job_history_still_tells_exits_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A PBS server that keeps no job history (its default): finished jobs leave ``qstat
    -x`` and subjobs show no ``Exit_status``; exit codes come from the files the job
    scripts write, and a memory kill from MoM's note, still out of memory."""
    state = use_standins("pbs", tmp_path, monkeypatch)
    monkeypatch.setenv("BELLIS_STANDIN_PBS_HISTORY", "0")
    launcher = make_launcher("pbs", "bh", mem="150M", array_threshold=2)
    try:
        handles = [
            launcher.launch(standalone_spec(tmp_path, 0, exit_three)),
            launcher.launch(standalone_spec(tmp_path, 1, functools.partial(hog_memory, 400))),
            *launcher.launch_many(
                [
                    standalone_spec(tmp_path, 2, exit_three, slot=2),
                    standalone_spec(tmp_path, 3, _sleep_briefly, slot=3),
                ]
            ),
        ]
        failed, oom, sub_failed, sub_clean = wait_for_exit(launcher, handles, 90)
    finally:
        launcher.close()
    assert launcher.history_off
    assert (failed.kind, failed.code) == ("error", 3)
    assert "about to fail" in failed.message
    assert oom.kind == "error"
    assert oom.message.startswith("out of memory: PBS job ")
    assert "PBS: job killed: mem" in oom.message
    assert (sub_failed.kind, sub_failed.code) == ("error", 3)
    assert (sub_clean.kind, sub_clean.code) == ("clean", 0)
    assert active(state) == []
    # the exit files are read and removed
    assert list((tmp_path / "logs").glob("*.exit")) == []


def test_pbs_without_job_history_a_memory_kill_reaches_the_ladder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_standins("pbs", tmp_path, monkeypatch)
    monkeypatch.setenv("BELLIS_STANDIN_PBS_HISTORY", "0")
    proc = run_script(tmp_path, _memory_script("pbs"), "bl", name="run.py")
    check_memory_ladder(tmp_path, proc, 150)
    # said once, with the fix
    assert proc.stderr.count("this PBS server keeps no job history") == 1
    assert "job_history_enable=True" in proc.stderr
    assert "job lost" not in proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_pbs_workers_leave_before_their_walltime_and_are_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 40 s walltime (PBS takes seconds) and 80 blocks of 1 s on 2 workers: each job's
    worker leaves before the limit, and new jobs take over until the blocks are done; no
    job is killed."""
    state = use_standins("pbs", tmp_path, monkeypatch)
    launcher = make_launcher("pbs", "bw", time_limit="00:00:40", walltime_margin=12)
    exits = run_walltime_handover(launcher, tmp_path)
    jobs = job_records(state)
    assert {r["how"] for r in jobs} == {"exited"}, jobs
    assert sum(exits.values()) == len(jobs), exits
    assert {r["walltime_s"] for r in jobs} == {40}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_pbs_walltime_kill_is_reported_and_the_block_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = use_standins("pbs", tmp_path, monkeypatch)
    launcher = make_launcher("pbs", "bt", time_limit="00:00:30")
    run_time_limit_kill(launcher, tmp_path, 120)
    assert sorted(r["how"] for r in job_records(state)) == ["exited", "walltime"]
    assert active(state) == []


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_lsf_workers_leave_before_their_run_limit_and_are_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``-W 0:01`` with a stand-in minute of 40 s and 80 blocks of 1 s on 2 workers: each
    job's worker, reckoning its end from its start and the minute it asked for, leaves
    before the stand-in's limit, and new jobs take over until the blocks are done; no job is
    killed."""
    state = use_standins("lsf", tmp_path, monkeypatch)
    monkeypatch.setenv("BELLIS_STANDIN_SECONDS_PER_MINUTE", "40")
    launcher = make_launcher("lsf", "bw", time_limit=1, walltime_margin=12)
    exits = run_walltime_handover(launcher, tmp_path)
    jobs = job_records(state)
    assert {r["how"] for r in jobs} == {"exited"}, jobs
    assert sum(exits.values()) == len(jobs), exits
    # bsub got whole minutes; the stand-in ran each job for 40 s of them
    assert {r["options"]["-W"][0] for r in jobs} == {"0:01"}
    assert {r["walltime_s"] for r in jobs} == {40}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_lsf_run_limit_kill_is_reported_and_the_block_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A block that outlives ``-W 0:01`` (a stand-in minute of 30 s): LSF sends the job
    SIGUSR2 and ``bjobs`` says ``EXIT``, 140, ``TERM_RUNLIMIT``; bellis reports a block that
    ran longer than the time limit, and the block runs again in a new job."""
    import subprocess

    from bellis._launchers._batch import End
    from bellis._launchers._lsf import BJOBS_FIELDS, lsf_ending

    state = use_standins("lsf", tmp_path, monkeypatch)
    monkeypatch.setenv("BELLIS_STANDIN_SECONDS_PER_MINUTE", "30")
    launcher = make_launcher("lsf", "bt", time_limit=1)
    task, s = run_time_limit_kill(launcher, tmp_path, 120)
    assert "LSF stopped the job at its limit" in s.first_worker_error
    jobs = job_records(state)
    assert sorted(r["how"] for r in jobs) == ["exited", "walltime"]
    (killed,) = [r for r in jobs if r["how"] == "walltime"]
    assert killed["signal"] == 12 and killed["walltime_s"] == 30
    assert f"LSF job {killed['job']} " in s.first_worker_error
    # what bellis read: bjobs's own record of the kill
    out = subprocess.run(
        ["bjobs", "-a", "-o", BJOBS_FIELDS, "-json", str(killed["job"])],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    (row,) = json.loads(out.stdout)["RECORDS"]
    assert (row["STAT"], row["EXIT_CODE"]) == ("EXIT", "140")
    assert row["EXIT_REASON"].startswith("TERM_RUNLIMIT")
    ending = lsf_ending(row["STAT"], row["EXIT_REASON"], row["EXIT_CODE"])
    assert (ending.end, ending.code) == (End.TIME_LIMIT, 140)
    # the killed worker is the run's one error; the job after it ran to its end
    assert task.report().workers.exits.get("error") == 1
    assert active(state) == []


def test_workers_of_a_run_go_as_one_capped_array(system: str, tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    rec.mkdir()
    state = _state(tmp_path, system)
    launcher = make_launcher(system, "ba", array_threshold=3, array_cap=2)
    task = make_task("arr", 9, functools.partial(sleep_block, str(rec), 0.05), max_workers=3)
    peak = [0]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], sum(r["state"] == "running" for r in active(state)))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        states = bellis.run_blockwise(
            task, launcher=launcher, return_states=True, progress=False, summary=False
        )
    finally:
        stop.set()
        watcher.join()
    assert states["arr"].completed_count == 9
    assert done_ids(read_records(rec), "arr") == list(range(9))
    jobs = job_records(state)
    assert len({r["job"] for r in jobs}) == 1 and len(jobs) == 3
    assert peak[0] <= 2
    assert active(state) == []
