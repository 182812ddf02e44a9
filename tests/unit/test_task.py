"""Task and Pipeline construction, validation messages and composition."""

from __future__ import annotations

import inspect
import re
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import bellis as daisy
import bellis.v2 as v2
from bellis.errors import BellisDeprecationWarning


def noop(block: Any) -> None:
    return None


def make(task_id: str = "t", lib: Any = daisy, **kw: Any) -> Any:
    kw.setdefault("process_function", noop)
    return lib.Task(
        task_id,
        daisy.Roi((0, 0), (30, 20)),
        daisy.Roi((0, 0), (10, 10)),
        daisy.Roi((0, 0), (10, 10)),
        **kw,
    )


def test_defaults() -> None:
    task = make()
    assert task.max_workers == 1
    assert task.max_retries == 2
    assert task.max_worker_restarts == 10
    assert task.fit == "valid"
    assert task.read_write_conflict is True
    assert task.requires == {}
    assert task.timeout_secs == 600.0
    assert task.done_marker_path is None
    assert task.skip_mask is None
    assert task.check_function is None
    assert task.block_grid_shape == [3, 2]
    assert task.total_roi == daisy.Roi((0, 0), (30, 20))


@pytest.mark.parametrize("value", [0, -3])
def test_max_workers_below_one(value: int) -> None:
    with pytest.raises(ValueError, match=r"^max_workers must be at least 1 \(got -?\d\); a task"):
        make(max_workers=value)


def test_max_workers_wrong_type() -> None:
    with pytest.raises(TypeError, match="max_workers must be an int"):
        make(max_workers="2")


@pytest.mark.parametrize("value", [0, -1, 0.0, timedelta(0)])
def test_timeout_must_be_positive(value: Any) -> None:
    with pytest.raises(ValueError, match=r"^block timeout must be positive; blocks are expected"):
        make(timeout=value)


@pytest.mark.parametrize("value", ["x", [1], True])
def test_timeout_wrong_type(value: Any) -> None:
    msg = "timeout must be a float seconds, a timedelta, or None (None means the 600s default)"
    with pytest.raises(TypeError, match=re.escape(msg)):
        make(timeout=value)


def test_timeout_forms() -> None:
    assert make(timeout=timedelta(seconds=3)).timeout_secs == 3.0
    assert make(timeout=2.5).timeout_secs == 2.5
    assert make(timeout=None).timeout_secs == 600.0


def test_invalid_fit_at_construction() -> None:
    with pytest.raises(ValueError, match="fit='bogus' is not a fit mode"):
        make(fit="bogus")


@pytest.mark.parametrize("name", ["max_retries", "max_worker_restarts"])
def test_negative_counts_raise_value_error(name: str) -> None:
    with pytest.raises(ValueError, match=rf"^{name} must be at least 0 \(got -1\)"):
        make(**{name: -1})


def test_zero_retries_and_restarts_accepted() -> None:
    task = make(max_retries=0, max_worker_restarts=0)
    assert (task.max_retries, task.max_worker_restarts) == (0, 0)


def test_done_marker_path_true_is_type_error() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(TypeError, match=r"^done_marker_path=True is not a valid value"):
            make(done_marker_path=True)


def test_both_tracking_and_done_marker_path() -> None:
    with pytest.raises(TypeError, match="pass either tracking_path or done_marker_path, not both"):
        make(done_marker_path="a", tracking_path="b")


def test_done_marker_path_deprecated() -> None:
    with pytest.warns(DeprecationWarning, match="done_marker_path is deprecated"):
        task = make(done_marker_path="store")
    assert task.done_marker_path == "store"


def test_tracking_path_false_and_path() -> None:
    assert make(tracking_path=False).tracking_path is False
    assert make(tracking_path="x/y").tracking_path == "x/y"


def test_check_function_warns() -> None:
    with pytest.warns(UserWarning, match=r"Task\(check_function=\.\.\.\) runs your callable"):
        task = make(check_function=lambda b: False)
    assert task.check_function is not None


def test_non_callables_rejected() -> None:
    with pytest.raises(TypeError, match="process_function must be callable or None"):
        make(process_function=3)
    with pytest.raises(TypeError, match="check_function must be callable or None"):
        make(check_function=3)


def test_skip_mask_wrong_shape() -> None:
    msg = (
        'skip_mask has shape [3, 3] but task "s" has a block grid of shape [3, 2] (one cell per '
        "block, cell 0 is the first block; see Task.block_grid_shape)"
    )
    with pytest.raises(ValueError, match=re.escape(msg)):
        make("s", skip_mask=np.zeros((3, 3)))


def test_skip_mask_bool_accepted_and_copied() -> None:
    mask = np.array([[True, False], [False, False], [False, True]])
    task = make(skip_mask=mask)
    out = task.skip_mask
    assert out.dtype == np.uint8
    assert out.tolist() == [[1, 0], [0, 0], [0, 1]]
    out[0, 0] = 0
    assert task.skip_mask[0, 0] == 1


def test_num_workers_alias() -> None:
    with pytest.warns(DeprecationWarning, match="num_workers is deprecated"):
        task = make(num_workers=3)
    assert task.max_workers == 3
    with pytest.raises(TypeError, match=r"pass either max_workers \(v2\) or num_workers"):
        make(num_workers=3, max_workers=2)


def test_v1_compat_warns_with_bellis_deprecation_warning() -> None:
    """The 1.x forms warn with bellis's own class (a DeprecationWarning), pointing at the
    caller's line, so ``-W error::bellis.errors.BellisDeprecationWarning`` catches them."""
    with pytest.warns(BellisDeprecationWarning, match="num_workers is deprecated") as caught:
        make(num_workers=2)
    assert [w.category for w in caught] == [BellisDeprecationWarning]
    up = make("up")
    with pytest.warns(BellisDeprecationWarning, match="upstream_tasks is deprecated") as caught:
        down = daisy.Task(
            "down",
            daisy.Roi((0, 0), (30, 20)),
            daisy.Roi((0, 0), (10, 10)),
            daisy.Roi((0, 0), (10, 10)),
            process_function=noop,
            upstream_tasks=[up],
        )
    assert [w.category for w in caught] == [BellisDeprecationWarning]
    assert caught[0].filename == __file__
    assert down.upstream_tasks == [up]
    assert issubclass(BellisDeprecationWarning, DeprecationWarning)


def test_v2_task_rejects_num_workers() -> None:
    with pytest.raises(TypeError, match="num_workers"):
        make(lib=v2, num_workers=3)


def test_requires_validation() -> None:
    assert make(requires={"gpu": 1, "cpu": 0}).requires == {"gpu": 1}
    with pytest.raises(TypeError, match="requires must be a dict"):
        make(requires=[("gpu", 1)])
    with pytest.raises(TypeError, match=r"requires\['cpu'\] must be an int"):
        make(requires={"cpu": 1.5})
    with pytest.raises(ValueError, match=r"requires\['gpu'\]=1.5 is not a share of a GPU"):
        make(requires={"gpu": 1.5})
    with pytest.raises(TypeError, match=r"requires\['gpu'\] must be an int"):
        make(requires={"gpu": "1"})
    assert make(requires={"gpu": 0.5}).requires == {"gpu": 0.5}
    with pytest.raises(ValueError, match=r"requires\['gpu'\]=-1 is negative"):
        make(requires={"gpu": -1})


def test_functions_must_be_callable() -> None:
    with pytest.raises(
        TypeError, match=r"^check_function must be callable or None \(got str 'x'\)"
    ):
        make(check_function="x")
    with pytest.raises(
        TypeError, match=r"^process_function must be callable or None \(got int 3\)"
    ):
        make(process_function=3)


def test_task_id_validation() -> None:
    with pytest.raises(TypeError, match="task_id must be a str"):
        make(3)
    with pytest.raises(ValueError, match="task_id must not be empty"):
        make("")


# -- pipelines ----------------------------------------------------------------------------


def ids(tasks: list[Any]) -> list[str]:
    return [t.task_id for t in tasks]


def edge_ids(p: daisy.Pipeline) -> set[tuple[str, str]]:
    return {(a.task_id, b.task_id) for a, b in p.edges}


def test_sequential_and_parallel_composition() -> None:
    a, b = make("a"), make("b")
    seq = a + b
    assert edge_ids(seq) == {("a", "b")}
    assert ids(seq.sources) == ["a"]
    assert ids(seq.outputs) == ["b"]
    par = a | b
    assert par.edges == []
    assert ids(par.sources) == ["a", "b"]
    assert ids(par.outputs) == ["a", "b"]


def test_parallel_chains_and_diamond() -> None:
    a, b, c, d = (make(x) for x in "abcd")
    assert edge_ids((a + b) | (c + d)) == {("a", "b"), ("c", "d")}
    diamond = a + (b | c) + d
    assert edge_ids(diamond) == {("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")}
    assert len(diamond.edges) == 4
    assert ids(diamond.sources) == ["a"]
    assert ids(diamond.outputs) == ["d"]


def test_composition_does_not_mutate_and_dedupes() -> None:
    a, b, c = make("a"), make("b"), make("c")
    ab = a + b
    before = (list(ab.tasks), list(ab.edges))
    abc = ab + c
    assert (ab.tasks, ab.edges) == before
    assert ids(abc.tasks) == ["a", "b", "c"]
    again = ab | (a + c)
    assert ids(again.tasks) == ["a", "b", "c"]


@pytest.mark.parametrize("other", [3, 1.5, "x", None, [1], {}, (1,), True])
def test_compose_with_non_task(other: Any) -> None:
    a = make("a")
    name = type(other).__name__
    with pytest.raises(TypeError, match=f"^cannot compose Pipeline with {name}; expected Task"):
        a + other
    with pytest.raises(TypeError, match="cannot compose Pipeline"):
        other + a
    with pytest.raises(TypeError, match="cannot compose Pipeline"):
        a | other


def test_duplicate_task_id_rejected_at_composition() -> None:
    # bellis checks at composition already (daisy 2.0.0 only at run time)
    with pytest.raises(ValueError, match=r"^duplicate task_id in pipeline: a$"):
        make("a") + make("a")
    with pytest.raises(ValueError, match=r"^duplicate task_id in pipeline: a$"):
        make("a") | make("a")


def test_duplicate_task_id_rejected_at_scheduler_and_run() -> None:
    p = daisy.Pipeline([make("a"), make("a")])
    with pytest.raises(ValueError, match=r"^duplicate task_id in pipeline: a$"):
        daisy.Scheduler(p)
    with pytest.raises(ValueError, match=r"^duplicate task_id in pipeline: a$"):
        daisy.run_blockwise(p, multiprocessing=False, progress=False, summary=False)


def test_cycle_rejected_at_composition() -> None:
    a = make("a")
    with pytest.raises(ValueError, match=r"^pipeline contains a cycle$"):
        a + a
    b = make("b")
    with pytest.raises(ValueError, match=r"^pipeline contains a cycle$"):
        (a + b) + a


def test_cycle_rejected_at_scheduler_and_run() -> None:
    a, b = make("a"), make("b")
    for cyc in (daisy.Pipeline([a, b], [(a, b), (b, a)]), daisy.Pipeline([a], [(a, a)])):
        with pytest.raises(ValueError, match=r"^pipeline contains a cycle$"):
            daisy.Scheduler(cyc)
        with pytest.raises(ValueError, match=r"^pipeline contains a cycle$"):
            daisy.run_blockwise(cyc, multiprocessing=False, progress=False, summary=False)


def test_pipeline_constructor_validation() -> None:
    a, b = make("a"), make("b")
    with pytest.raises(ValueError, match=r"^Pipeline tasks list contains duplicates"):
        daisy.Pipeline([a, a])
    with pytest.raises(ValueError, match=r"^edge upstream task is not in the pipeline's task list"):
        daisy.Pipeline([b], [(a, b)])
    with pytest.raises(ValueError, match=r"^edge downstream task is not in the pipeline's task"):
        daisy.Pipeline([a], [(a, b)])
    with pytest.raises(TypeError, match="pipeline contains a non-Task object"):
        daisy.Pipeline([a, 3])


def test_kahn_order_alphabetical_ties() -> None:
    a, b, c, d, e = (make(x) for x in "ABCDE")
    assert daisy.Scheduler(c | a | b).task_order == ["A", "B", "C"]
    assert daisy.Scheduler(((a + b) | (c + d)) + e).task_order == ["A", "B", "C", "D", "E"]
    assert daisy.Scheduler(make("z") + make("y")).task_order == ["z", "y"]


def test_run_blockwise_rejects_non_task() -> None:
    with pytest.raises(TypeError):
        daisy.run_blockwise(42)


def test_pipeline_repr() -> None:
    p = make("a") + make("b")
    assert repr(p) == 'Pipeline(tasks=["a", "b"], sources=["a"], outputs=["b"], edges=[("a", "b")])'


def _task(**kw: Any) -> Any:
    r = daisy.Roi((0,), (10,))
    return daisy.Task("t", r, r, r, process_function=noop, **kw)  # the line warnings name


def test_warnings_point_at_the_users_line() -> None:
    r = daisy.Roi((0,), (10,))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        daisy.Task("t", r, r, r, process_function=noop, check_function=noop)
        line = inspect.currentframe().f_lineno - 1  # type: ignore[union-attr]
        daisy.Task("t", r, r, r, process_function=noop, done_marker_path="x")
        line2 = inspect.currentframe().f_lineno - 1  # type: ignore[union-attr]
        _task(check_function=noop)
    in_helper = inspect.getsourcelines(_task)[1] + 2
    where = [(Path(w.filename).name, w.lineno) for w in caught]
    assert where == [
        ("test_task.py", line),
        ("test_task.py", line2),
        ("test_task.py", in_helper),
    ]
