"""The memory request a forecast checks against the sampled p99 peak RSS
(``_plan._forecast._configured_memory``; review finding 6): every launcher with a memory
request, and the parameter that sets it, as the run's memory ladder finds it."""

from __future__ import annotations

import pytest

import bellis
from bellis import Roi
from bellis._plan._forecast import _configured_memory
from bellis._task_spec import TaskSpec

MIB = 1 << 20


def _task(**kw: object) -> TaskSpec:
    """The task as the planner reads it: its run-start spec."""
    return TaskSpec.of(
        bellis.Task(
            "t", Roi((0,), (4,)), Roi((0,), (1,)), Roi((0,), (1,)), process_function=print, **kw
        )
    )


@pytest.mark.parametrize(
    ("launcher", "name"),
    [
        (lambda: bellis.SlurmLauncher(mem="2G"), "SlurmLauncher"),
        (lambda: bellis.LsfLauncher(mem="2G"), "LsfLauncher"),
        (lambda: bellis.PbsLauncher(mem="2G"), "PbsLauncher"),
        (lambda: bellis.SgeLauncher(mem="2G"), "SgeLauncher"),
    ],
)
def test_every_batch_launcher_s_mem_is_the_request(launcher: object, name: str) -> None:
    lau = launcher()  # type: ignore[operator]
    assert _configured_memory(_task(), lau) == (2048 * MIB, f"{name}(mem=...)")
    # the task's requires (megabytes) win over mem, as in the run's memory ladder
    got = _configured_memory(_task(requires={"mem_mb": 3000}), lau)
    assert got == (3000 * MIB, "Task(requires={'mem_mb': ...}) (megabytes)")
    # and memory_limit over both
    got = _configured_memory(_task(memory_limit="1G"), lau)
    assert got == (1024 * MIB, "Task(memory_limit=...)")


def test_no_request_is_none() -> None:
    assert _configured_memory(_task(), None) is None
    assert _configured_memory(_task(), bellis.LsfLauncher()) is None
    assert _configured_memory(_task(), bellis.LocalLauncher()) is None
    assert _configured_memory(_task(memory_limit="1G"), None) == (
        1024 * MIB,
        "Task(memory_limit=...)",
    )
