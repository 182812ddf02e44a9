"""Every exception and warning bellis raises.

The tree::

    BellisError(Exception)
    ├─ ConfigurationError(ValueError, RuntimeError)
    │   └─ DependencyCycleError
    ├─ TrackingError(RuntimeError)
    │   ├─ LayoutMismatch
    │   └─ CodeChangedError
    ├─ ProtocolError
    ├─ ConnectionLostError(ConnectionError)
    └─ WorkerError(RuntimeError)
        ├─ WorkerStartError
        └─ TaskAbandonedError
    BellisDeprecationWarning(DeprecationWarning)
    BellisWarning(UserWarning)
    └─ CoverageWarning

Every error is importable from ``bellis`` (and ``bellis.v2``) too, the same class; the
warnings only from here, where a filter names them
(``warnings.filterwarnings("ignore", category=BellisDeprecationWarning)``). The classes keep
this module as their home: a traceback reads ``bellis.errors.TrackingError: ...``.

The builtin bases keep code written for daisy working: daisy raises ``ValueError`` for
a bad parameter at construction and ``RuntimeError("invalid configuration: ...")`` at
run start, so :class:`ConfigurationError` is both. :class:`LayoutMismatch` and
abandonment are ``RuntimeError`` subclasses for the same reason.

A worker that dies and a block that outlives its timeout raise nothing: the run restarts
the worker, retries the block and counts the event in the task's state
(``worker_failure_count``, ``timeout_reclaim_count``; the summary names the timeouts). A
task that runs out of worker restarts ends in :class:`TaskAbandonedError`.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BellisDeprecationWarning",
    "BellisError",
    "BellisWarning",
    "CodeChangedError",
    "ConfigurationError",
    "ConnectionLostError",
    "CoverageWarning",
    "DependencyCycleError",
    "LayoutMismatch",
    "ProtocolError",
    "TaskAbandonedError",
    "TrackingError",
    "WorkerError",
    "WorkerStartError",
]


class BellisError(Exception):
    """Base of every error bellis raises on its own behalf."""


class ConfigurationError(BellisError, ValueError, RuntimeError):
    """Raised when a parameter or a combination of parameters cannot work.

    At construction it behaves as daisy's ``ValueError``; at run start its text starts
    with ``invalid configuration:`` as daisy's ``RuntimeError`` did. ``parameter``
    names the offending parameter where one is to blame.
    """

    def __init__(self, message: str, *, parameter: str | None = None) -> None:
        super().__init__(message)
        self.parameter = parameter


class DependencyCycleError(ConfigurationError):
    """Raised when a pipeline's edges contain a cycle (a self edge included)."""

    def __init__(self, message: str = "pipeline contains a cycle") -> None:
        super().__init__(message, parameter="pipeline")


class TrackingError(BellisError, RuntimeError):
    """Raised when a block tracking store cannot be opened, read or written.

    ``path`` is the store's directory.
    """

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class LayoutMismatch(TrackingError):
    """Raised when a tracking store was written for a different task layout.

    ``stored`` and ``expected`` hold the two layout hashes (or descriptions).
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        stored: str | None = None,
        expected: str | None = None,
    ) -> None:
        super().__init__(message, path=path)
        self.stored = stored
        self.expected = expected


class CodeChangedError(TrackingError):
    """Raised at run start, before any block runs, by a task with
    ``Task(on_code_change="error")`` whose store has done blocks that other code made
    (another process function, helper module or ``Task(version=...)``).

    ``task_id`` names the task, ``count`` the blocks, ``differences`` what differs
    (``"function f"``, ``"file helpers.py"``, ``"version key model"`` ...).
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        task_id: str | None = None,
        count: int = 0,
        differences: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message, path=path)
        self.task_id = task_id
        self.count = count
        self.differences = differences


class ProtocolError(BellisError):
    """Raised when a peer sends bytes that are not a valid bellis frame or message."""


class ConnectionLostError(BellisError, ConnectionError):
    """Raised when the connection to the bellis server drops in the middle of an exchange."""


class WorkerError(BellisError, RuntimeError):
    """Base of the errors about worker processes. ``task_id`` names their task."""

    def __init__(self, message: str, *, task_id: str | None = None) -> None:
        super().__init__(message)
        self.task_id = task_id


class WorkerStartError(WorkerError):
    """Raised when a worker cannot be started, e.g. its function cannot be serialized.

    ``permanent``: no later start can succeed either (a batch system that refuses every job
    of this request, e.g. LSF without a required project): the task then starts no more
    workers and is abandoned once none is left, instead of failing every restart the same
    way."""

    def __init__(
        self, message: str, *, task_id: str | None = None, permanent: bool = False
    ) -> None:
        super().__init__(message, task_id=task_id)
        self.permanent = permanent


class TaskAbandonedError(WorkerError):
    """Raised by ``run_blockwise`` when a task exhausted its worker restart budget.

    Carries ``daisy_states``, ``daisy_run_stats``, ``daisy_task_order`` and
    ``daisy_run_report`` as daisy 2.0.0 does.
    """

    daisy_states: dict[str, Any]
    daisy_run_stats: dict[str, Any]
    daisy_task_order: list[str]
    daisy_run_report: Any


class BellisDeprecationWarning(DeprecationWarning):
    """Emitted for daisy 1.x names and deprecated parameters that still work."""


class BellisWarning(UserWarning):
    """Base of the warnings bellis emits about a configuration that runs but is likely not
    what was meant."""


class CoverageWarning(BellisWarning):
    """Emitted once per task when a run starts, when the task's blocks do not write all of
    its ``total_write_roi`` (``total_roi`` less the read context): ``fit="valid"`` drops
    the partial blocks at the upper ends, or a block is larger than the volume and the
    task has no block at all.

    ``task_id`` names the task; ``uncovered`` holds, per axis, the ``(begin, end)`` that
    no block writes (None for an axis that is covered).
    """

    def __init__(
        self,
        message: str,
        *,
        task_id: str | None = None,
        uncovered: tuple[tuple[int, int] | None, ...] = (),
    ) -> None:
        super().__init__(message)
        self.task_id = task_id
        self.uncovered = uncovered
