"""Review finding 5: only the real, complete run of a forecast's tasks scores it.

A user script plans a task with a sample (``bellis.plan(t, sample=5)``) and then, step by
step (one subprocess each, over the same tracking store): plans again, runs with a failing
block, runs after an interrupted run, and runs for real. The test reads the task's
``runs.jsonl`` and ``forecast.json`` after each step. A plan's own sample run must leave a
waiting forecast alone; a run that fails blocks, or that follows an interrupted run (it
has fewer blocks left than forecast), drops it unscored with a warning; the complete run
after a fresh plan scores it.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from kit.user_script import run_script

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import bellis
    from bellis import Roi

    action, mode = sys.argv[1], sys.argv[2]
    def work(block):
        i = block.block_id[1]
        if action == "interrupt" and i >= 40:
            raise KeyboardInterrupt
        if action == "fail" and i % 3 == 0:
            block.status = bellis.BlockStatus.FAILED
            return
        with open(os.path.join("ran", str(i)), "a") as f:
            f.write("x")

    os.makedirs("ran", exist_ok=True)
    t = bellis.Task("t", Roi((0,), (60,)), Roi((0,), (1,)), Roi((0,), (1,)),
                    process_function=work, max_workers=2, max_retries=0,
                    resource_tracking=True)
    bellis.set_tracking_basedir("tracking")
    distributed = mode == "distributed"
    if action == "plan":
        plan = bellis.plan(t, sample=5, multiprocessing=distributed, show=False)
        print("@@" + json.dumps(plan.to_json()))
    else:
        try:
            ok = bellis.run_blockwise(t, multiprocessing=distributed, progress=False)
        except KeyboardInterrupt:
            ok = "interrupted"
        print("@@" + json.dumps({"ok": ok}))
    """
)


def _step(tmp_path: Path, *args: str) -> tuple[Any, dict[str, Any]]:
    proc = run_script(tmp_path, SCRIPT, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("@@"))
    return proc, json.loads(line[2:])


def _lines(tmp_path: Path) -> list[dict[str, Any]]:
    text = (tmp_path / "tracking" / "t" / "runs.jsonl").read_text()
    return [json.loads(x) for x in text.splitlines()]


def _waiting(tmp_path: Path) -> dict[str, Any] | None:
    path = tmp_path / "tracking" / "t" / "forecast.json"
    return json.loads(path.read_text()) if path.exists() else None


def _plan(tmp_path: Path, mode: str) -> dict[str, Any]:
    _, plan = _step(tmp_path, "plan", mode)
    waiting = _waiting(tmp_path)
    assert waiting is not None
    assert waiting["made_at"] > 0 and waiting["tasks"] == ["t"]
    assert waiting["blocks_left"] == plan["tasks"][0]["left"]
    return plan


@pytest.mark.parametrize("mode", ["serial", "distributed"])
def test_only_the_complete_run_of_a_forecast_scores_it(tmp_path: Path, mode: str) -> None:
    first = _plan(tmp_path, mode)
    assert first["tasks"][0]["left"] == 55
    # a second plan: its sample run is no real run; it scores nothing, and its own
    # forecast replaces the first
    second = _plan(tmp_path, mode)
    assert second["tasks"][0]["left"] == 50
    assert _waiting(tmp_path)["blocks_left"] == 50  # type: ignore[index]
    assert all("forecast" not in line for line in _lines(tmp_path))

    # a run with a failing block is not the run forecast: dropped, unscored
    proc, out = _step(tmp_path, "fail", mode)
    assert out["ok"] is False
    assert "forecast" not in _lines(tmp_path)[-1]
    assert _waiting(tmp_path) is None
    assert "is dropped, not scored: this run did not complete every block" in proc.stderr

    # plan again, then the complete run scores it
    third = _plan(tmp_path, mode)
    left = third["tasks"][0]["left"]
    assert left > 0
    _, out = _step(tmp_path, "run", mode)
    assert out["ok"] is True
    scored = _lines(tmp_path)[-1]["forecast"]
    assert scored["blocks_left"] == left and scored["actual"]["blocks"] == left
    assert _waiting(tmp_path) is None


def test_a_run_after_an_interrupted_one_does_not_score_the_forecast(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "serial")
    assert plan["tasks"][0]["left"] == 55
    # serial: the interrupt stops the run; some blocks are done, and no run line is written
    _, out = _step(tmp_path, "interrupt", "serial")
    assert out["ok"] == "interrupted"
    assert _waiting(tmp_path) is not None
    ran = len(list((tmp_path / "ran").iterdir()))
    assert 5 < ran < 50
    # the resumed run has fewer blocks left than forecast: it is not the forecast's run
    proc, out = _step(tmp_path, "run", "serial")
    assert out["ok"] is True
    assert "forecast" not in _lines(tmp_path)[-1]
    assert _waiting(tmp_path) is None
    assert "is dropped, not scored: it forecast 55 blocks left" in proc.stderr
