"""The public surface: ``import bellis as daisy`` and ``bellis.v2`` (SPEC §1.1)."""

from __future__ import annotations

import importlib

import funlib.geometry
import pytest

import bellis
import bellis.v2 as v2

EXPECTED_ALL = {
    "BellisError",
    "Block",
    "BlockRecord",
    "BlockStats",
    "BlockStatus",
    "BlockwiseDependencyGraph",
    "Client",
    "ConfigurationError",
    "Context",
    "Coordinate",
    "DaskLauncher",
    "DependencyGraph",
    "JsonProgressObserver",
    "LayoutMismatch",
    "LocalLauncher",
    "Pipeline",
    "Roi",
    "RunReport",
    "Scheduler",
    "SerialServer",
    "Server",
    "SlurmLauncher",
    "Stat",
    "Task",
    "TaskAbandonedError",
    "TaskReport",
    "TaskState",
    "TrackingError",
    "WorkerLauncher",
    "WorkerRecord",
    "__version__",
    "get_done_marker_basedir",
    "get_tracking_basedir",
    "get_worker_log_basename",
    "heartbeat",
    "logging",
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


@pytest.mark.parametrize("name", sorted(EXPECTED_ALL))
def test_every_exported_name_resolves(name: str) -> None:
    assert getattr(bellis, name) is not None
    assert name in dir(bellis)


def test_daisy_surface_and_submodules() -> None:
    for name in DAISY_SURFACE:
        assert hasattr(bellis, name), name
    for sub in ("logging", "block", "v2"):
        assert importlib.import_module(f"bellis.{sub}") is not None
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
    for name in v2.__all__:
        assert getattr(v2, name) is not None, name
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
