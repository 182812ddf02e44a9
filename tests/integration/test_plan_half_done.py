"""Issue 35, item 2: a forecast on a half-done store, the plan made before a resume.

A user script runs a task over the first half of a volume (200 of its 400 blocks), then
plans the whole volume with a sample and runs it: the resume. Every block appends its id
to a file when it runs, so the test sees which blocks ran in which step, independently of
what the plan says. The sample must take only blocks left to do, say how many it ran (the
blocks that really ran), read no timing of the first run, and forecast the resume's wall.

Before the fix, the grown store's done blocks were not seen as done: the sample drew some
of them, said "20 blocks ran" when 10 ran, and measured a round trip from the first run's
stamps (a store without resource tracking: 0), months long: a forecast of millions of
hours. A ``check_function`` that finds half the outputs made the same forecast.

The blocks sleep 30 ms, so the run's wall is the sleeps' and the ±50% band holds on a
loaded machine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kit.user_script import run_script

SCRIPT = """
import json, os, sys, time
import bellis
from bellis import Roi

route, mode = sys.argv[1], sys.argv[2]
base = os.getcwd()
distributed = mode == "distributed"


def log(block):
    fd = os.open(os.path.join(base, "ran"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, (str(block.block_id[1]) + "\\n").encode())
    os.close(fd)


def out_path(block):
    o = [int(v) for v in block.write_roi.offset]
    return os.path.join(base, "out", f"{o[0]}_{o[1]}")


def work(block):
    time.sleep(0.03)
    log(block)
    open(out_path(block), "w").close()


def found(block):
    return os.path.exists(out_path(block))


def task(height, **kw):
    return bellis.Task("t", Roi((0, 0), (height, 200)), Roi((0, 0), (10, 10)),
                       Roi((0, 0), (10, 10)), process_function=work, max_workers=2,
                       max_retries=0, **kw)


def step(name):
    os.replace(os.path.join(base, "ran"), os.path.join(base, "ran_" + name))


if __name__ == "__main__":
    os.makedirs(os.path.join(base, "out"), exist_ok=True)
    bellis.set_tracking_basedir(os.path.join(base, "tracking"))
    kw = {}
    if route == "grown":
        # the first half of the volume first: its store then grows with the volume
        assert bellis.run_blockwise([task(100)], multiprocessing=distributed,
                                    progress=False, summary=False)
        step("first")
    else:
        # an earlier tool made the first half's outputs; the check_function finds them
        open(os.path.join(base, "ran_first"), "w").close()
        for x in range(0, 100, 10):
            for y in range(0, 200, 10):
                open(os.path.join(base, "out", f"{x}_{y}"), "w").close()
        kw = {"check_function": found}
    plan = bellis.plan(task(200, **kw), sample=20, multiprocessing=distributed, seed=5)
    with open(os.path.join(base, "plan.json"), "w") as f:
        json.dump(plan.to_json(), f)
    step("sample")
    t0 = time.perf_counter()
    ok = bellis.run_blockwise([task(200, **kw)], multiprocessing=distributed,
                              progress=False, summary=False)
    wall = time.perf_counter() - t0
    step("resume")
    # fewer blocks left than the sample asks for: it takes all of them, and says so
    few = bellis.Task("few", Roi((0, 0), (50, 10)), Roi((0, 0), (10, 10)),
                      Roi((0, 0), (10, 10)), process_function=work, max_workers=2)
    few_plan = bellis.plan(few, sample=20, multiprocessing=distributed, show=False)
    with open(os.path.join(base, "few.json"), "w") as f:
        json.dump(few_plan.to_json(), f)
    step("few")
    print("@@" + json.dumps({"ok": ok, "wall": wall}))
"""


def _ids(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()]


def _result(stdout: str) -> dict[str, Any]:
    line = next(x for x in stdout.splitlines() if x.startswith("@@"))
    out: dict[str, Any] = json.loads(line[2:])
    return out


@pytest.mark.parametrize(
    ("route", "mode"),
    [("grown", "distributed"), ("grown", "serial"), ("check", "distributed")],
)
def test_a_forecast_on_a_half_done_store_samples_what_is_left_and_forecasts_the_resume(
    tmp_path: Path, route: str, mode: str
) -> None:
    proc = run_script(tmp_path, SCRIPT, route, mode)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = _result(proc.stdout)
    assert result["ok"] is True
    first, sample, resume = (_ids(tmp_path / f"ran_{s}") for s in ("first", "sample", "resume"))
    plan = json.loads((tmp_path / "plan.json").read_text())
    (t,) = plan["tasks"]
    f, tf = plan["forecast"], t["forecast"]
    # every block ran once, in one step; the first half's blocks in the first step (or,
    # with a check_function, never: their outputs were there)
    assert len(set(sample)) == len(sample) and len(set(resume)) == len(resume)
    assert not set(sample) & set(first) and not set(resume) & (set(first) | set(sample))
    assert len(first) == (200 if route == "grown" else 0)
    # the sample's count is the blocks that ran in it
    assert tf["sampled"] == tf["sampled_done"] == f["sampled"] == len(sample)
    assert tf["sample_failed"] == 0
    if route == "grown":
        # it drew only blocks left to do: 20 of the 200 left, none done before
        assert len(sample) == 20 and tf["sample_found_done"] == 0
        assert (tf["done_before"], tf["left_before"]) == (200, 200)
        assert (t["done"], t["left"]) == (220, 180) and f["blocks_done"] == 220
        assert f["done_before"] == 200 and f["blocks_left"] == 180
        assert "of the 200 left; 200 were done before it" in proc.stdout
    else:
        # the dry run cannot call the check_function: picked blocks it finds done ran not,
        # and neither count nor are measured
        assert tf["sample_picked"] == 20
        assert tf["sample_found_done"] == 20 - len(sample) > 0
        assert t["done"] == 20 and t["left"] == 380
    assert f"sample: {len(sample)} blocks ran (recorded done)" in proc.stdout
    assert len(first) + len(sample) + len(resume) == 400 - (200 if route == "check" else 0)
    # only the sample's own timings: a round trip of the sample run, not of months
    assert 0 <= f["round_trip_seconds"] < 1.0
    assert 0 < tf["block_wall"]["p50"] < 1.0
    # the forecast is the resume's wall
    estimate, actual = f["wall"]["estimate"], result["wall"]
    assert 0.5 * actual <= estimate <= 1.5 * actual, (estimate, actual)
    # ... and the resume was the run it forecast: scored in its run line
    line = json.loads((tmp_path / "tracking" / "t" / "runs.jsonl").read_text().splitlines()[-1])
    assert line["forecast"]["blocks_left"] == t["left"]
    assert line["forecast"]["actual"]["blocks"] == len(resume)
    # fewer left than asked: all of them ran, and the plan says so
    (few,) = json.loads((tmp_path / "few.json").read_text())["tasks"]
    assert few["forecast"]["sampled"] == len(_ids(tmp_path / "ran_few")) == 5
    assert few["forecast"]["sample_asked"] == 20 and few["left"] == 0
    assert (
        "the sample asked for 20 blocks but only 5 were left to do: it took all of them"
        in few["notes"]
    )
