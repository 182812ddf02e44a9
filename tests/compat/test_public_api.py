"""The public surface: ``import bellis as daisy`` and ``bellis.v2`` (SPEC §1.1)."""

from __future__ import annotations

import importlib
import inspect
import re
import sys
import types

import funlib.geometry
import pytest

import bellis
import bellis.v2 as v2
from bellis import _task

EXPECTED_ALL = {
    "BellisError",
    "Block",
    "BlockRecord",
    "BlockStats",
    "BlockStatus",
    "BlockwiseDependencyGraph",
    "Client",
    "CodeChangedError",
    "ConfigurationError",
    "ConnectionLostError",
    "Context",
    "Coordinate",
    "DaskLauncher",
    "DependencyCycleError",
    "DependencyGraph",
    "JsonProgressObserver",
    "LayoutMismatch",
    "LocalLauncher",
    "LsfLauncher",
    "PbsLauncher",
    "Pipeline",
    "Plan",
    "ProtocolError",
    "Roi",
    "RunReport",
    "Scheduler",
    "SerialServer",
    "Server",
    "SgeLauncher",
    "SlurmLauncher",
    "Stat",
    "Task",
    "TaskAbandonedError",
    "TaskReport",
    "TaskState",
    "TrackingError",
    "WorkerError",
    "WorkerLauncher",
    "WorkerRecord",
    "WorkerStartError",
    "__version__",
    "get_done_marker_basedir",
    "get_tracking_basedir",
    "get_worker_log_basename",
    "heartbeat",
    "logging",
    "plan",
    "profile_block",
    "run_blockwise",
    "set_done_marker_basedir",
    "set_tracking_basedir",
    "skip_mask_from_rois",
    "skip_mask_from_volume",
    "write_trace",
    "write_report",
}

# SPEC §1.1: the daisy 1.x-compatible names `import daisy` gives
DAISY_SURFACE = [
    "Block",
    "BlockStatus",
    "BlockwiseDependencyGraph",
    "Client",
    "Context",
    "Coordinate",
    "DependencyGraph",
    "JsonProgressObserver",
    "Pipeline",
    "Roi",
    "Scheduler",
    "SerialServer",
    "Server",
    "Task",
    "TaskState",
    "__version__",
    "profile_block",
    "get_done_marker_basedir",
    "get_tracking_basedir",
    "get_worker_log_basename",
    "run_blockwise",
    "set_done_marker_basedir",
    "set_tracking_basedir",
]


def test_all_is_the_expected_set() -> None:
    assert set(bellis.__all__) == EXPECTED_ALL
    assert len(bellis.__all__) == len(EXPECTED_ALL)
    # `import bellis` is the 1.x compatibility surface: the same names, the same objects
    import bellis.v1_compat as compat

    assert list(bellis.__all__) == list(compat.__all__)
    for name in compat.__all__:
        assert getattr(bellis, name) is getattr(compat, name)


# what each name is: a module, a string, or a class or function of bellis's (or funlib's)
SUBMODULE_NAMES = {"logging"}
STRING_NAMES = {"__version__"}
FUNLIB_NAMES = {"Roi", "Coordinate"}
ALIASES = {"DependencyGraph": "BlockwiseDependencyGraph"}


@pytest.mark.parametrize("name", sorted(EXPECTED_ALL))
def test_every_exported_name_resolves(name: str) -> None:
    """Each name is the object its defining module holds under its own name, so
    ``from bellis import X`` and ``from <home> import X`` give one object."""
    value = getattr(bellis, name)
    namespace: dict[str, object] = {}
    exec(f"from bellis import {name}", namespace)
    assert namespace[name] is value
    if name in SUBMODULE_NAMES:
        assert isinstance(value, types.ModuleType) and value.__name__ == f"bellis.{name}"
        assert value is sys.modules[f"bellis.{name}"]
        return
    if name in STRING_NAMES:
        assert isinstance(value, str) and re.fullmatch(r"\d+\.\d+(\.\d+)?\S*", value), value
        return
    assert isinstance(value, type) or inspect.isfunction(value), (name, value)
    assert value.__name__ == ALIASES.get(name, name)
    home = value.__module__
    assert home.split(".")[0] == ("funlib" if name in FUNLIB_NAMES else "bellis"), home
    assert getattr(sys.modules[home], value.__name__) is value


def test_daisy_surface_and_submodules() -> None:
    for name in DAISY_SURFACE:
        assert hasattr(bellis, name), name
    for sub in ("logging", "block", "v2", "v1_compat", "errors", "cl_monitor"):
        module = importlib.import_module(f"bellis.{sub}")
        assert module.__name__ == f"bellis.{sub}" and getattr(bellis, sub) is module
    assert bellis.block.Block is bellis.Block
    assert bellis.v2.Task is _task.Task and issubclass(bellis.Task, bellis.v2.Task)
    assert bellis.cl_monitor.CLMonitor.__module__ == "bellis.cl_monitor"
    assert isinstance(bellis.__version__, str)
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        bellis.nope  # noqa: B018


def test_same_object_as_v1_compat() -> None:
    compat = importlib.import_module("bellis.v1_compat")
    for name in EXPECTED_ALL - {"__version__"}:
        assert getattr(bellis, name) is getattr(compat, name), name


def test_block_module_keeps_1x_import_path() -> None:
    from bellis.block import Block, BlockStatus

    assert Block is bellis.Block
    assert BlockStatus is bellis.BlockStatus


def test_roi_and_coordinate_are_funlib() -> None:
    assert bellis.Roi is funlib.geometry.Roi
    assert bellis.Coordinate is funlib.geometry.Coordinate
    assert v2.Roi is funlib.geometry.Roi


def test_v2_has_no_compat_shims() -> None:
    assert not hasattr(v2, "SerialServer")
    assert "SerialServer" not in v2.__all__
    assert hasattr(v2, "BlockStats")
    # bellis's own additions are part of the native surface too
    for name in ("LocalLauncher", "SlurmLauncher", "DaskLauncher", "ConfigurationError",
                 "TaskAbandonedError", "LayoutMismatch", "skip_mask_from_rois",
                 "write_report"):  # fmt: skip
        assert name in v2.__all__ and getattr(v2, name) is getattr(bellis, name), name
    # the rest is bellis's, except the native Task and Scheduler, which the 1.x ones extend
    for name in v2.__all__:
        if name in ("Task", "Scheduler"):
            assert issubclass(getattr(bellis, name), getattr(v2, name)), name
            assert getattr(v2, name) is not getattr(bellis, name), name
        else:
            assert getattr(v2, name) is getattr(bellis, name), name
    assert set(v2.__all__) == EXPECTED_ALL - {"SerialServer", "get_worker_log_basename"}
    with pytest.raises(TypeError, match="num_workers"):
        v2.Task(
            "t",
            v2.Roi((0,), (10,)),
            v2.Roi((0,), (10,)),
            v2.Roi((0,), (10,)),
            num_workers=2,
        )


def test_v2_scheduler_accepts_only_pipeline_or_task() -> None:
    with pytest.raises(TypeError, match="expects a Pipeline or a Task"):
        v2.Scheduler([])


def test_type_checkers_see_every_public_name_from_its_home() -> None:
    """``bellis/__init__.py`` names each public object for type checkers (names load lazily
    at run time, so without this a user's mypy sees ``Any``): the block must name exactly
    the public names, each from the module it loads from."""
    import ast
    from pathlib import Path

    from bellis._names import HOMES

    tree = ast.parse(Path(bellis.__file__).read_text())
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    )
    seen: dict[str, tuple[str, str]] = {}
    for node in block.body:
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                module = "bellis" + ("." + module if module else "")
            for alias in node.names:
                # an explicit re-export: `X as X`
                assert alias.asname == alias.name, ast.unparse(node)
                seen[alias.name] = (module, alias.name)
        elif isinstance(node, ast.Assign):
            (target,) = node.targets
            assert isinstance(target, ast.Name) and isinstance(node.value, ast.Name)
            seen[target.id] = seen[node.value.id]
    assert seen.pop("logging") == ("bellis", "logging")
    assert seen == HOMES


# Run in a fresh interpreter: a class names its public home once a public module loads it,
# so what an earlier test imported must not decide what this one sees. For each surface,
# every public class of bellis's reads `<class 'bellis.X'>` (`bellis.v2.X` for v2's own
# Task and Scheduler; `bellis.errors.X` for the errors, their documented home), and it,
# instances of it and a task sent to a spawned process come back as the same class.
PUBLIC_HOME_SCRIPT = r"""
import importlib, json, multiprocessing, operator, pickle, sys

import cloudpickle

surface = importlib.import_module(sys.argv[1])
from bellis._names import HOMES, V2_OWN_HOMES

problems = []
for name in sorted(surface.__all__):
    value = getattr(surface, name)
    if not isinstance(value, type) or not value.__module__.startswith("bellis"):
        continue
    if value.__module__ == "bellis.errors":
        home = "bellis.errors"
    elif surface.__name__ == "bellis.v2" and name in V2_OWN_HOMES:
        home = "bellis.v2"
    else:
        home = "bellis"
    want = f"<class '{home}.{value.__name__}'>"
    if repr(value) != want or value.__qualname__ != value.__name__:
        problems.append(f"{name}: {value!r} (qualname {value.__qualname__}), want {want}")
    for dumps in (pickle.dumps, cloudpickle.dumps):
        if pickle.loads(dumps(value)) is not value:
            problems.append(f"{name}: {dumps.__module__}.dumps does not round-trip")

roi = surface.Roi((0,), (10,))
task = surface.Task("t", roi, roi, roi, process_function=None)
status = surface.BlockStatus.SUCCESS
report = surface.TaskReport({"task_id": "t"})
for obj in (task, status, report):
    for dumps in (pickle.dumps, cloudpickle.dumps):
        back = pickle.loads(dumps(obj))
        if type(back) is not type(obj):
            problems.append(f"{type(obj)!r} instance via {dumps.__module__}: {type(back)!r}")
if pickle.loads(pickle.dumps(status)) is not status:
    problems.append("BlockStatus member does not round-trip")

if __name__ == "__main__":
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        # the child imports bellis afresh and finds the classes by their public names
        got = pool.apply(operator.attrgetter("task_id"), (task,))
        if got != "t":
            problems.append(f"a spawned process read task_id {got!r}")
        there = pool.apply(repr, (type(task),))
        if there != repr(type(task)):
            problems.append(f"a spawned process sees {there}, here {type(task)!r}")
print(json.dumps(problems))
"""


@pytest.mark.parametrize("surface", ["bellis", "bellis.v2"])
def test_public_classes_name_their_public_home_and_pickle(surface: str) -> None:
    import json
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-c", PUBLIC_HOME_SCRIPT, surface],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    problems = json.loads(proc.stdout.strip().splitlines()[-1])
    assert problems == [], "\n".join(problems)


def test_a_class_reached_privately_first_still_names_its_public_home() -> None:
    import subprocess

    script = (
        "from bellis._task import Pipeline, Task\n"
        "from bellis.block import Block\n"
        "import bellis, bellis.v2\n"
        "print(repr(bellis.Pipeline), repr(bellis.v2.Task), repr(bellis.Task), repr(Block))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [
        "<class",
        "'bellis.Pipeline'>",
        "<class",
        "'bellis.v2.Task'>",
        "<class",
        "'bellis.Task'>",
        "<class",
        "'bellis.Block'>",
    ]


# the classes of bellis.errors that `bellis` need not offer, and why
ERRORS_NOT_IN_BELLIS = {
    # a warning, not an error: filtered by category, from its documented home
    # (`warnings.filterwarnings("ignore", category=bellis.errors.BellisDeprecationWarning)`)
    "BellisDeprecationWarning": "a warning",
    "BellisWarning": "a warning",
    "CoverageWarning": "a warning",
}


def test_every_error_is_importable_from_bellis_and_bellis_errors() -> None:
    import bellis.errors as errors

    defined = {
        name: value
        for name, value in vars(errors).items()
        if isinstance(value, type)
        and issubclass(value, BaseException)
        and value.__module__ == "bellis.errors"
    }
    assert set(errors.__all__) == set(defined)
    missing = []
    for name, cls in sorted(defined.items()):
        if name in ERRORS_NOT_IN_BELLIS:
            assert issubclass(cls, Warning), name
            continue
        for module in (bellis, v2):
            if name not in module.__all__ or getattr(module, name, None) is not cls:
                missing.append(f"{module.__name__}.{name}")
    assert not missing, f"bellis.errors defines {missing} that the public modules lack"
