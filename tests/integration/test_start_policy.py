"""Local workers: a worker's death wakes the run loop at once (event-driven, not tick
polled), and the start policy (spawn while each worker has a core, fork from the zygote
beyond, a replacement starts the zygote for the next ones) as a user sees it.

Each test writes a driver script into ``tmp_path`` and runs it with ``sys.executable``.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from kit.user_script import run_script

HEAD = """
import json, os, signal, sys, time
import bellis

OUT = sys.argv[1]
# one core for the driver and its workers: the start policy then sees one core everywhere
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def record(block):
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
        parent = f.read().replace(b"\\0", b" ").decode()
    row = {"t": time.time(), "block": block.block_id[1], "pid": os.getpid(), "parent": parent}
    with open(os.path.join(OUT, f"{os.getpid()}-{block.block_id[1]}.json"), "w") as f:
        json.dump(row, f)


def crash_once_at(block, ids):
    record(block)
    marker = os.path.join(OUT, f"died-{block.block_id[1]}")
    if block.block_id[1] in ids and not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)


def task(name, n, fn, **kw):
    return bellis.Task(
        name,
        bellis.Roi((0,), (n,)),
        bellis.Roi((0,), (1,)),
        bellis.Roi((0,), (1,)),
        process_function=fn,
        **kw,
    )
"""


def _run(
    tmp_path: Path, body: str, env: dict[str, str], timeout: float = 180
) -> tuple[list[dict], str]:
    out = tmp_path / "out"
    out.mkdir()
    text = textwrap.dedent(HEAD) + textwrap.dedent(body)
    proc = run_script(tmp_path, text, str(out), name="driver.py", timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [json.loads(p.read_text()) for p in out.glob("*.json")]
    return sorted(rows, key=lambda r: r["t"]), proc.stdout + proc.stderr


def _workers_in_order(rows: list[dict]) -> list[dict]:
    seen: dict[int, dict] = {}
    for r in rows:
        seen.setdefault(r["pid"], r)
    return list(seen.values())


def _forked(row: dict) -> bool:
    return "bellis._launchers._zygote" in row["parent"]


@pytest.mark.parametrize(
    ("start", "log_mode"),
    [("spawn", "file"), ("fork", "file"), ("auto", "file"), ("auto", "both")],
)
def test_a_killed_worker_is_replaced_without_waiting_for_a_tick(
    tmp_path: Path, start: str, log_mode: str
) -> None:
    """The loop's tick is made an hour long: only the worker's exit itself (its pidfd, the
    fork server's report, a tee thread's end) can wake the loop to start a replacement.
    Polled once per tick, the run would hang at the first death (the old code does)."""
    rows, output = _run(
        tmp_path,
        f"""
        import bellis._run._server
        import bellis.logging
        bellis._run._server._TICK_SECONDS = 3600.0
        bellis.logging.set_log_mode({log_mode!r})

        def fn(block):
            crash_once_at(block, {{2, 5, 8}})

        state = bellis.run_blockwise(
            [task("t", 12, fn, max_workers=1, max_retries=2, max_worker_restarts=5)],
            progress=False,
            return_states=True,
        )["t"]
        assert state.completed_count == 12 and state.failed_count == 0, state
        assert state.worker_failure_count == 3, state
        """,
        {"BELLIS_WORKER_START": start},
        timeout=120,
    )
    assert {r["block"] for r in rows} == set(range(12))
    assert sorted(p.name for p in (tmp_path / "out").glob("died-*")) == [
        "died-2",
        "died-5",
        "died-8",
    ]
    workers = _workers_in_order(rows)
    assert len(workers) == 4, workers  # the first and three replacements
    assert "killed by SIGKILL" in output, output
    if start == "spawn":
        assert not any(_forked(w) for w in workers), workers
    elif start == "fork":
        assert all(_forked(w) for w in workers), workers
    else:
        # one core: the first worker and the first replacement are spawned (the zygote
        # starts beside the latter); the next replacements are forked
        assert [_forked(w) for w in workers] == [False, False, True, True], workers


def test_workers_are_forked_only_when_more_than_the_cores_run(tmp_path: Path) -> None:
    rows, _ = _run(
        tmp_path,
        """
        for name, workers in (("one", 1), ("two", 2)):
            state = bellis.run_blockwise(
                [task(name, 8, record, max_workers=workers)],
                progress=False,
                return_states=True,
            )[name]
            assert state.completed_count == 8, state
            with open(os.path.join(OUT, name), "w") as f:
                f.write(str(time.time()))
        """,
        {"BELLIS_WORKER_START": "auto"},
    )
    end_of_one = float((tmp_path / "out" / "one").read_text())
    one = [r for r in rows if r["t"] < end_of_one]
    two = [r for r in rows if r["t"] > end_of_one]
    assert len(one) == 8 and len(two) == 8
    # one worker on one core: spawned by the driver, no zygote
    assert all("driver.py" in r["parent"] for r in one), one
    # two workers on one core: both forked from the run's zygote
    assert all(_forked(r) for r in two), two
    assert len({r["pid"] for r in two}) >= 1
