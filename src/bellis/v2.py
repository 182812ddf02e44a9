"""The native bellis (daisy v2) surface, without the daisy 1.x shims."""

from __future__ import annotations

from funlib.geometry import Coordinate, Roi

from . import logging
from ._block import Block, BlockStats, BlockStatus
from ._client import Client, Context
from ._graph import BlockwiseDependencyGraph
from ._profiling import profile_block
from ._progress import JsonProgressObserver
from ._report import BlockRecord, RunReport, Stat, TaskReport, WorkerRecord
from ._runner import Server, run_blockwise
from ._scheduler import Scheduler
from ._state import TaskState
from ._task import Pipeline, Task, get_tracking_basedir, set_tracking_basedir

__all__ = [
    "Block",
    "BlockRecord",
    "BlockStats",
    "BlockStatus",
    "BlockwiseDependencyGraph",
    "Client",
    "Context",
    "Coordinate",
    "DependencyGraph",
    "JsonProgressObserver",
    "Pipeline",
    "Roi",
    "RunReport",
    "Scheduler",
    "Server",
    "Stat",
    "Task",
    "TaskReport",
    "TaskState",
    "WorkerRecord",
    "get_tracking_basedir",
    "logging",
    "profile_block",
    "run_blockwise",
    "set_tracking_basedir",
]

DependencyGraph = BlockwiseDependencyGraph
