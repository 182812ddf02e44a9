"""TaskSpec: a task as a run reads it, one frozen field per setting, taken at run start."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest
from funlib.geometry import Roi

from bellis._task import Task  # the native Task (bellis.Task is the 1.x one)
from bellis._task_spec import TaskSpec

#: Task keywords whose setting the spec holds under another name, or folded into another
RENAMED = {
    "timeout": "timeout_secs",
    "stall_timeout": "stall_timeout_secs",
    "done_marker_path": "tracking_path",  # the deprecated alias
    "speculative": "backup_after",  # True: the default factor
}


def _task(**kw: object) -> Task:
    return Task("t", Roi((0, 0), (40, 40)), Roi((0, 0), (10, 10)), Roi((0, 0), (10, 10)), **kw)  # type: ignore[arg-type]


def test_every_task_setting_has_its_field() -> None:
    """A new Task setting is a field of TaskSpec (and a line of TaskSpec.of): otherwise
    the run could only read it through the task's private attributes."""
    fields = {f.name for f in dataclasses.fields(TaskSpec)}
    params = [p for p in inspect.signature(Task.__init__).parameters if p != "self"]
    missing = [p for p in params if RENAMED.get(p, p) not in fields]
    assert not missing, f"TaskSpec has no field for Task({', '.join(missing)})"


def test_the_spec_holds_the_tasks_settings_read_only(tmp_path: object) -> None:
    mask = np.zeros((4, 4), dtype=np.uint8)
    mask[0, 0] = 1
    t = _task(
        process_function=print,
        max_workers=3,
        timeout=7,
        requires={"gpu": 0.5, "cpu": 2},
        skip_mask=mask,
        tracking_path=False,
        on_code_change="rerun",
    )
    spec = TaskSpec.of(t)
    assert spec.task_id == "t" and spec.max_workers == 3 and spec.timeout_secs == 7.0
    assert spec.geom.grid == tuple(t.block_grid_shape) == (4, 4)
    assert spec.requires == {"gpu": 0.5, "cpu": 2}
    assert spec.budget["cpu"] == 2 and 0 < spec.budget["gpu"]
    assert spec.tracking_path is None and spec.on_code_change == "rerun"
    assert spec.store_layout.grid_shape == (4, 4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.max_workers = 5  # type: ignore[misc]
    assert spec.skip_mask is not None and spec.skip_mask[0, 0] == 1
    with pytest.raises(ValueError, match="read-only"):
        spec.skip_mask[0, 0] = 0
    # the task stays the user's to change; the spec taken at run start stays as it was
    t.process_function = len
    assert spec.process_function is print and TaskSpec.of(t).process_function is len
