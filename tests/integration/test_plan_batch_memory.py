"""Review finding 6: a forecast's memory check works for every launcher with a memory
request, not only SLURM's, and its advice names the launcher and parameter that set it.
So does its job time limit, on every batch launcher.

A user script forecasts a task whose blocks hold 160 MiB each on ``LsfLauncher(mem="64M")``
(the LSF stand-ins of ``kit/standins``; ``mem_per_slot`` makes the request a slot count, so
the stand-in does not kill the job over ``-M`` and the blocks complete).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from kit.batch import use_standins
from kit.user_script import run_script

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    import bellis
    from bellis import Roi

    def big(block):
        a = np.ones(20 * 1024 * 1024)  # 160 MiB, touched
        assert a.sum() > 0

    launcher = bellis.LsfLauncher(job_name_prefix="pm", poll_interval=0.3, mem="64M",
                                  mem_per_slot="1G")
    t = bellis.Task("big", Roi((0,), (8,)), Roi((0,), (1,)), Roi((0,), (1,)),
                    process_function=big, max_workers=2, max_retries=0,
                    resource_tracking=True, launcher=launcher)
    bellis.set_tracking_basedir("tracking")
    plan = bellis.plan(t, sample=4)
    print("@@" + json.dumps(plan.to_json()))
    """
)


def test_a_forecast_on_lsf_warns_of_a_memory_request_below_the_sampled_p99(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_standins("lsf", tmp_path, monkeypatch)
    proc = run_script(tmp_path, SCRIPT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("@@"))
    plan = json.loads(line[2:])
    (t,) = plan["tasks"]
    assert t["launcher"] == "lsf"
    rss = t["forecast"]["peak_rss"]
    assert t["forecast"]["sampled_done"] == 4
    assert rss["configured"] == 64 << 20
    assert rss["p99"] > 160 << 20
    (warning,) = [w for w in plan["warnings"] if "memory request" in w]
    assert "the memory request 64.0 MiB is below the sampled p99 peak RSS" in warning
    assert "(LsfLauncher(mem=...))" in warning and "SlurmLauncher" not in warning
    assert "warning: task 'big': the memory request 64.0 MiB" in proc.stdout


LONG = textwrap.dedent(
    """
    import json, time
    import bellis
    from bellis import Roi

    def tick(block):
        time.sleep(0.01)

    launcher = bellis.LsfLauncher(job_name_prefix="pl", poll_interval=0.3, time_limit=1)
    t = bellis.Task("long", Roi((0,), (20000,)), Roi((0,), (1,)), Roi((0,), (1,)),
                    process_function=tick, max_workers=2, max_retries=0,
                    max_worker_restarts=0, launcher=launcher)
    bellis.set_tracking_basedir("tracking")
    plan = bellis.plan(t, sample=20, show=False)
    print("@@" + json.dumps(plan.to_json()))
    """
)


def test_a_forecast_on_lsf_gives_a_time_limit_and_warns_when_the_run_would_outlast_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 19,980 blocks of 10 ms left on 2 workers: about 100 s, over the 1-minute -W of a
    # worker that may not be restarted
    use_standins("lsf", tmp_path, monkeypatch)
    proc = run_script(tmp_path, LONG)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plan = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("@@"))[2:])
    (t,) = plan["tasks"]
    assert t["forecast"]["sampled_done"] == 20
    limit = t["forecast"]["time_limit"]
    h, m, s = (int(x) for x in limit.split(":"))
    seconds = 3600 * h + 60 * m + s
    # the task's high estimate x 1.25 + 5 minutes: above the estimate, and 5 min at least
    assert seconds >= 1.25 * t["forecast"]["wall"]["estimate"] + 300 - 1
    assert t["forecast"]["wall"]["estimate"] > 60
    (warning,) = [w for w in plan["warnings"] if "outlasts" in w]
    assert "outlasts the job time limit (00:01:00) times its 1 starts" in warning
    assert f"LsfLauncher(time_limit={limit!r})" in warning and "Slurm" not in warning
