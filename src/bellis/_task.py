"""Task and Pipeline: validated configuration, no run state."""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Callable, Iterable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _seams
from ._block import _as_roi
from ._code_origin import function_arity
from ._donemarks import StoreLocation, join_location, store_location
from ._fingerprint import check_code_options
from ._graph import FITS, TaskGeometry
from ._outputs._declared import declare_outputs
from ._outputs._inputs import declare_inputs, parse_input_cache_bytes
from ._outputs._readback import check_verify_outputs
from ._outputs._units import owns_units
from ._task_params import (
    DEFAULT_MAX_CONSECUTIVE_FAILURES as _DEFAULT_MAX_CONSECUTIVE_FAILURES,
    UNSET as _UNSET,
    budget_units as _budget_units,
    check_count as _check_count,
    check_local_path as _check_local_path,
    check_setup_function as _check_setup_function,
    parse_backup_after as _parse_backup_after,
    parse_max_consecutive_failures as _parse_max_consecutive_failures,
    parse_memory as _parse_memory,
    parse_requires as _parse_requires,
    parse_setup as _parse_setup,
    parse_stall_timeout as _parse_stall_timeout,
    parse_timeout as _parse_timeout,
    parse_tracking_path as _parse_tracking_path,
    user_stacklevel as _user_stacklevel,
)
from .errors import BellisDeprecationWarning, ConfigurationError, DependencyCycleError

if TYPE_CHECKING:
    from funlib.geometry import Roi

__all__ = ["Pipeline", "Task", "function_arity"]

_tracking_basedir: StoreLocation | None = None


def set_tracking_basedir(path: str | os.PathLike[str] | None) -> None:
    """Track every task without an explicit ``tracking_path`` under ``<path>/<task_id>``."""
    global _tracking_basedir
    if path is not None:
        _check_local_path("set_tracking_basedir(path)", os.fspath(path))
    _tracking_basedir = None if path is None else store_location(path)


def get_tracking_basedir() -> StoreLocation | None:
    """The basedir :func:`set_tracking_basedir` set: a ``Path``, or the ``str`` of an
    ``s3://`` URL (never a ``Path``, which would fold its ``//``)."""
    return _tracking_basedir


def _store_dirname(task_id: str, base: StoreLocation) -> str:
    """``task_id`` as the name of its store under the tracking basedir ``base``; a
    ConfigurationError when it would name ``base`` itself or a place outside it (an
    absolute path, ``..``), where ``Task.reset()`` would delete what is not the task's."""
    parts = Path(task_id).parts
    if not parts or Path(task_id).is_absolute() or ".." in parts:
        raise ConfigurationError(
            f"task_id={task_id!r} cannot name a store under the tracking basedir {base}: "
            "it would resolve to the basedir itself or outside it. Give the task an id "
            "without a leading '/' or '..' parts, or pass Task(tracking_path=...)",
            parameter="task_id",
        )
    return task_id


def set_done_marker_basedir(path: str | os.PathLike[str] | None) -> None:
    """Deprecated alias of :func:`set_tracking_basedir`."""
    warnings.warn(
        "set_done_marker_basedir is deprecated; use set_tracking_basedir",
        BellisDeprecationWarning,
        stacklevel=2,
    )
    set_tracking_basedir(path)


def get_done_marker_basedir() -> StoreLocation | None:
    """Deprecated alias of :func:`get_tracking_basedir`."""
    warnings.warn(
        "get_done_marker_basedir is deprecated; use get_tracking_basedir",
        BellisDeprecationWarning,
        stacklevel=2,
    )
    return _tracking_basedir


class Task:
    """One blockwise job: the volume, the block template and what to run per block.

    ``total_roi`` includes the read context. ``read_roi`` / ``write_roi`` are the block
    template, relative to each other. ``process_function`` with one positional parameter
    is a *block function* ``f(block)``; with none it is a *worker function* that runs
    its own ``Client().acquire_block()`` loop.

    ``stall_timeout`` (seconds or a ``timedelta``; None, the default, turns it off): in a
    distributed run, a block that shows no CPU, IO or heartbeat (``block.heartbeat()``) for
    that long is reclaimed as *stalled*, its worker replaced and the block retried (see
    ``docs/failures.md``). Serial mode ignores it, with a warning. It watches blocks
    only: a ``setup`` is bounded by ``timeout`` alone (``docs/warm_workers.md``).

    ``speculative=True`` or ``backup_after=factor`` (default off): straggler backups. When
    the task has no ready block left and one of its workers is idle, a block out longer
    than ``factor`` (3.0 with ``speculative=True``) times the median of the task's finished
    blocks (at least 20) runs a second time on that worker; the first copy to succeed wins
    and the other's worker is stopped. The block function must be idempotent on its write
    ROI (see ``docs/failures.md``).

    ``memory_limit`` (``"4G"``, ``"500M"`` or bytes; default None): each worker's memory
    (``RLIMIT_AS`` for local workers, ``--mem`` on SLURM). A block whose worker runs out of
    memory runs again on a worker with ``memory_growth`` (default 2) times as much, up to
    ``max_memory`` (default: the limit × growth²); only a block that runs out at that cap
    fails (see ``docs/failures.md``).

    ``max_consecutive_failures`` (default 10; None turns it off): a block that raises is a
    failed attempt, retried within ``max_retries`` while the worker goes on with its next
    block (a worker whose first block raises ends, as in daisy, and spends a restart); the
    task is abandoned as broken when this many blocks fail in a row with no block done in
    between (each block counted on its first failed attempt of the run;
    blocks that failed in an earlier run are not counted). A rerun runs the blocks never
    tried before the ones that failed (see ``docs/failures.md``).

    ``outputs`` (zarr v3 arrays, their paths or funlib ``Array``s) declares what the blocks
    write; ``write_safety`` says what to do when two blocks can write one shard (or chunk):
    ``"error"`` (default), ``"serialize"`` or ``"off"`` (see ``docs/outputs.md``).
    ``verify_outputs=True`` reads each block's outputs back and records their checksum
    (``"allow_empty"``: blocks that wrote only the fill value pass); see :meth:`verify`.

    ``inputs`` (zarr arrays, their paths or funlib ``Array``s) declares what the blocks
    read: each worker then keeps the chunks it decoded in a cache of ``input_cache_bytes``
    (default: a quarter of the worker's ``memory_limit``, else 256M; 0 turns it off), and
    a block's reads of a declared input are served from it (see ``docs/outputs.md``,
    "Declared inputs and the chunk cache").

    ``setup`` (a callable that takes no argument; default None): called once in each worker
    process before its first block of this task (in serial mode once, in the driver). A
    context manager it returns (a ``@contextlib.contextmanager`` function, a class with
    ``__enter__``) is entered, and exited when the worker leaves the task; what it makes
    (the entered value, or the plain return value) reaches a block function that takes two
    arguments, ``fn(block, ctx)``. See ``docs/warm_workers.md``.
    """

    def __init__(
        self,
        task_id: str,
        total_roi: Roi,
        read_roi: Roi,
        write_roi: Roi,
        process_function: Callable[..., Any] | None = None,
        check_function: Callable[[Any], Any] | None = None,
        read_write_conflict: bool = True,
        fit: str = "valid",
        max_workers: int = 1,
        max_retries: int = 2,
        timeout: float | timedelta | None = None,
        done_marker_path: Any = _UNSET,
        resource_tracking: bool = False,
        requires: dict[str, float] | None = None,
        max_worker_restarts: int = 10,
        skip_mask: Any = None,
        *,
        tracking_path: Any = _UNSET,
        launcher: Any = None,
        stall_timeout: float | timedelta | None = None,
        speculative: bool = False,
        backup_after: float | None = None,
        memory_limit: int | str | None = None,
        memory_growth: float | None = None,
        max_memory: int | str | None = None,
        outputs: Any = None,
        inputs: Any = None,
        input_cache_bytes: int | str | None = None,
        write_safety: str = "error",
        verify_outputs: bool | str = False,
        version: str | dict[str, Any] | None = None,
        on_code_change: str = "warn",
        max_consecutive_failures: int | None = _DEFAULT_MAX_CONSECUTIVE_FAILURES,
        setup: Callable[[], Any] | None = None,
    ) -> None:
        if not isinstance(task_id, str):
            raise TypeError(f"task_id must be a str (got {type(task_id).__name__})")
        if not task_id:
            raise ConfigurationError("task_id must not be empty", parameter="task_id")
        self._task_id = task_id
        self._total_roi = _as_roi(total_roi, "total_roi")
        self._read_roi = _as_roi(read_roi, "read_roi")
        self._write_roi = _as_roi(write_roi, "write_roi")
        if fit not in FITS:
            raise ConfigurationError(
                f"fit={fit!r} is not a fit mode; use one of 'valid', 'overhang' or 'shrink'",
                parameter="fit",
            )
        self._fit = fit
        self._read_write_conflict = bool(read_write_conflict)
        try:
            self._geom = TaskGeometry(
                task_id,
                self._total_roi,
                self._read_roi,
                self._write_roi,
                fit=fit,
                read_write_conflict=self._read_write_conflict,
            )
        except ConfigurationError:
            raise
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from exc
        self._outputs, self._write_safety, self._geom, self._shared_outputs = declare_outputs(
            self._geom, outputs, write_safety
        )
        self._inputs = declare_inputs(self._geom, inputs)
        self._input_cache_bytes = parse_input_cache_bytes(input_cache_bytes)
        self._verify_outputs = check_verify_outputs(verify_outputs, self._outputs, task_id)
        #: per output: whether its read-back checksums stored units (``owns_units``)
        self._verify_stored = tuple(owns_units(self._geom, s) for s in self._outputs)
        if isinstance(max_workers, int) and not isinstance(max_workers, bool) and max_workers < 1:
            raise ConfigurationError(
                f"max_workers must be at least 1 (got {max_workers}); a task with no workers "
                "would wait forever",
                parameter="max_workers",
            )
        self._max_workers = _check_count("max_workers", max_workers, 1, "")
        self._max_retries = _check_count("max_retries", max_retries, 0, "use 0 for no retries")
        self._max_worker_restarts = _check_count(
            "max_worker_restarts", max_worker_restarts, 0, "use 0 to never restart a worker"
        )
        self._max_consecutive_failures = _parse_max_consecutive_failures(max_consecutive_failures)
        self._timeout_seconds = _parse_timeout(timeout)
        self._stall_timeout_seconds = _parse_stall_timeout(stall_timeout)
        self._backup_after = _parse_backup_after(speculative, backup_after)
        self._memory = _parse_memory(memory_limit, memory_growth, max_memory)
        self._process_function = process_function
        if check_function is not None and not callable(check_function):
            raise TypeError(
                "check_function must be callable or None "
                f"(got {type(check_function).__name__} {check_function!r})"
            )
        if process_function is not None and not callable(process_function):
            raise TypeError(
                "process_function must be callable or None "
                f"(got {type(process_function).__name__} {process_function!r})"
            )
        self._check_function = check_function
        self._setup = _parse_setup(setup)
        if process_function is not None:
            _check_setup_function(task_id, self._setup, function_arity(process_function))
        if check_function is not None:
            warnings.warn(
                "Task(check_function=...) runs your callable in the driver for every block "
                "that is not already marked done; for plain resumption prefer block tracking "
                "(Task(tracking_path=...) or set_tracking_basedir(...)), which needs no "
                "callback",
                UserWarning,
                stacklevel=_user_stacklevel(),
            )
        self._tracking_path = _parse_tracking_path(done_marker_path, tracking_path)
        self._resource_tracking = bool(resource_tracking)
        self._requires = _parse_requires(requires)
        #: ``requires`` in the run budget's integer units (``gpu`` in shares)
        self._budget = _budget_units(self._requires)
        self._skip_mask = None if skip_mask is None else self._coerce_mask(skip_mask)
        self._launcher = launcher
        self._version, self._on_code_change = check_code_options(version, on_code_change)

    # -- validation helpers ------------------------------------------------------------
    def _coerce_mask(self, mask: Any) -> np.ndarray[Any, np.dtype[np.uint8]]:
        arr = np.asarray(mask)
        grid = list(self._geom.grid)
        if list(arr.shape) != grid:
            raise ConfigurationError(
                f'skip_mask has shape {list(arr.shape)} but task "{self._task_id}" has a block '
                f"grid of shape {grid} (one cell per block, cell 0 is the first block; see "
                "Task.block_grid_shape)",
                parameter="skip_mask",
            )
        return np.ascontiguousarray(arr != 0, dtype=np.uint8)

    # -- properties ------------------------------------------------------------------
    @property
    def task_id(self) -> str:
        return self._task_id

    @property
    def total_roi(self) -> Roi:
        return self._total_roi

    @property
    def read_roi(self) -> Roi:
        return self._read_roi

    @property
    def write_roi(self) -> Roi:
        return self._write_roi

    @property
    def fit(self) -> str:
        return self._fit

    @property
    def read_write_conflict(self) -> bool:
        return self._read_write_conflict

    @property
    def max_workers(self) -> int:
        return self._max_workers

    @property
    def max_retries(self) -> int:
        return self._max_retries

    @property
    def max_worker_restarts(self) -> int:
        return self._max_worker_restarts

    @property
    def max_consecutive_failures(self) -> int | None:
        """How many blocks may fail in a row before the task is abandoned as broken
        (None: never); see ``docs/failures.md``."""
        return self._max_consecutive_failures

    @property
    def timeout_secs(self) -> float:
        return self._timeout_seconds

    @property
    def stall_timeout_secs(self) -> float | None:
        """``stall_timeout`` in seconds, or None when stall detection is off."""
        return self._stall_timeout_seconds

    @property
    def backup_after(self) -> float | None:
        """The straggler factor of ``speculative`` / ``backup_after``; None: no backups."""
        return self._backup_after

    @property
    def memory_limit(self) -> int | None:
        """Each local worker's memory limit in bytes (``memory_limit``); None: none."""
        return self._memory[0]

    @property
    def memory_growth(self) -> float | None:
        """How much more memory each retry after an out-of-memory death gets (None: the
        launcher's, else 2)."""
        return self._memory[1]

    @property
    def max_memory(self) -> int | None:
        """The largest memory grant in bytes (None: the launcher's, else the request × the
        growth squared)."""
        return self._memory[2]

    @property
    def outputs(self) -> tuple[Any, ...]:
        """The declared outputs, as ``OutputSpec``s (store, array path, shapes, mapping)."""
        return self._outputs

    @property
    def inputs(self) -> tuple[Any, ...]:
        """The declared inputs, as ``OutputSpec``s (store, array path, shapes, mapping)."""
        return self._inputs

    @property
    def input_cache_bytes(self) -> int | None:
        """Each worker's bound on its decoded-chunk cache (None: derived from its memory
        limit; 0: no cache)."""
        return self._input_cache_bytes

    @property
    def write_safety(self) -> str:
        return self._write_safety

    @property
    def verify_outputs(self) -> bool | str:
        return self._verify_outputs  # type: ignore[no-any-return]

    @property
    def requires(self) -> dict[str, float]:
        """What each worker takes of the run's ``resources``: ints, but ``gpu`` may be a
        fraction of one GPU (0.5: two workers share a GPU)."""
        return dict(self._requires)

    @property
    def resource_tracking(self) -> bool:
        return self._resource_tracking

    @property
    def tracking_path(self) -> str | bool | None:
        return self._tracking_path

    @property
    def done_marker_path(self) -> str | bool | None:
        return self._tracking_path

    @property
    def block_grid_shape(self) -> list[int]:
        return list(self._geom.grid)

    @property
    def skip_mask(self) -> np.ndarray[Any, np.dtype[np.uint8]] | None:
        return None if self._skip_mask is None else self._skip_mask.copy()

    @property
    def process_function(self) -> Callable[..., Any] | None:
        return self._process_function

    @process_function.setter
    def process_function(self, fn: Callable[..., Any] | None) -> None:
        if fn is not None and not callable(fn):
            raise TypeError("process_function must be callable or None")
        self._process_function = fn

    @property
    def check_function(self) -> Callable[[Any], Any] | None:
        return self._check_function

    @property
    def setup(self) -> Callable[[], Any] | None:
        """``Task(setup=...)``: called once in each worker process before its first block
        of this task (``docs/warm_workers.md``); None: none."""
        setup: Callable[[], Any] | None = self._setup
        return setup

    @property
    def passes_context(self) -> bool:
        """Whether the block function is called ``fn(block, ctx)`` with what the setup
        made: the task has a setup and its function takes two positional parameters."""
        fn = self._process_function
        return self._setup is not None and fn is not None and function_arity(fn) >= 2

    @property
    def launcher(self) -> Any:
        return self._launcher

    @property
    def total_write_roi(self) -> Roi:
        from funlib.geometry import Roi as _Roi

        g = self._geom
        return _Roi(g.tw_offset, tuple(max(0, s) for s in g.tw_shape))

    # -- tracking --------------------------------------------------------------------
    def resolved_tracking_path(self) -> StoreLocation | None:
        """Where this task's store lives now (explicit path, else ``<basedir>/<task_id>``):
        a ``Path``, or the ``str`` of an ``s3://`` URL (``store_location``)."""
        p = self._tracking_path
        if p is False:
            return None
        if p is None:
            base = get_tracking_basedir()
            if base is None:
                return None
            return join_location(base, _store_dirname(self._task_id, base))
        return store_location(str(p))

    def reset(self) -> str | None:
        """Delete this task's tracking store (and its runs.jsonl): a local folder, or every
        object below an ``s3://`` store's prefix. Returns the path (URL) or None. Refused
        (``TrackingError``) while a run holds the store."""
        from ._tracking import delete_store

        path = self.resolved_tracking_path()
        if path is None:
            return None
        return delete_store(path)

    def _store_layout(self) -> Any:
        """The ``StoreLayout`` this task's tracking store is opened (and checked) with."""
        from ._tracking import StoreLayout

        g = self._geom
        return StoreLayout(
            total_offset=g.total_offset,
            total_shape=g.total_shape,
            read_offset=tuple(int(x) for x in self._read_roi.offset),
            read_shape=g.read_shape,
            write_offset=tuple(int(x) for x in self._write_roi.offset),
            write_shape=g.write_shape,
            fit=g.fit,
        )

    def failed_blocks(self) -> list[Any]:
        """Blocks with failed attempts and no success recorded in the store, in grid order.

        The store is read as a run of this task would open it: a store of a volume this
        task grew is remapped to this task's grid, and one of another layout is refused
        (``LayoutMismatch``).
        """
        from ._tracking import failed_cells

        path = self.resolved_tracking_path()
        if path is None:
            return []
        g = self._geom
        tgrid = [max(1, -(-s // w)) for s, w in zip(g.total_shape, g.write_shape, strict=True)]
        blocks = []
        for cell in failed_cells(path, layout=self._store_layout()):
            coords = []
            rem = cell
            for n in reversed(tgrid):
                rem, c = divmod(rem, n)
                coords.append(c)
            coords.reverse()
            grid_coords = [c - s for c, s in zip(coords, g.sid_shift, strict=True)]
            if all(0 <= c < n for c, n in zip(grid_coords, g.grid, strict=True)):
                blocks.append(g.block(g.index_of(grid_coords)))
        return blocks

    def verify(self, *, workers: int | None = None, reset: bool = False) -> Any:
        """``bellis verify`` of this task's store, a ``VerifyResult`` (``docs/outputs.md``)."""
        from ._outputs._verify import verify_task

        return verify_task(self, workers=workers, reset=reset)

    def report(self) -> Any:
        """The TaskReport of this task's last run (from runs.jsonl), or None."""
        from ._stats._report_load import load_task_report

        return load_task_report(self)

    # -- composition -----------------------------------------------------------------
    def __add__(self, other: Any) -> Pipeline:
        return Pipeline.from_task(self) + _as_pipeline(other)

    def __radd__(self, other: Any) -> Pipeline:
        return _as_pipeline(other) + Pipeline.from_task(self)

    def __or__(self, other: Any) -> Pipeline:
        return Pipeline.from_task(self) | _as_pipeline(other)

    def __ror__(self, other: Any) -> Pipeline:
        return _as_pipeline(other) | Pipeline.from_task(self)

    def run_blockwise(self, **kwargs: Any) -> Any:
        """Run this task alone: :meth:`Pipeline.run_blockwise` of a one-task pipeline, as
        ``run_blockwise(task, ...)`` does (daisy 2.0.0's Task has no such method)."""
        return Pipeline.from_task(self).run_blockwise(**kwargs)

    def __copy__(self) -> Task:
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    def __deepcopy__(self, memo: dict[int, Any]) -> Task:
        return self.__copy__()

    def __repr__(self) -> str:
        return (
            f"Task({self._task_id!r}, total_roi={self._total_roi}, read_roi={self._read_roi}, "
            f"write_roi={self._write_roi}, fit={self._fit!r}, max_workers={self._max_workers})"
        )


# --------------------------------------------------------------------------------------
# Pipeline
# --------------------------------------------------------------------------------------


def _as_pipeline(obj: Any) -> Pipeline:
    if isinstance(obj, Pipeline):
        return obj
    if isinstance(obj, Task):
        return Pipeline.from_task(obj)
    raise TypeError(f"cannot compose Pipeline with {type(obj).__name__}; expected Task or Pipeline")


def _unique(items: Iterable[Task]) -> list[Task]:
    seen: set[int] = set()
    out = []
    for t in items:
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


class Pipeline:
    """A DAG of tasks. ``a + b`` runs b after a; ``a | b`` runs them side by side.

    Composition checks duplicate task ids and cycles at once (bellis's fix); the run
    checks them again.
    """

    def __init__(
        self,
        tasks: list[Task] | None = None,
        edges: list[tuple[Task, Task]] | None = None,
        *,
        _sources: list[Task] | None = None,
        _outputs: list[Task] | None = None,
        _validate: bool = False,
    ) -> None:
        tasks = list(tasks or [])
        for t in tasks:
            if not isinstance(t, Task):
                raise TypeError("pipeline contains a non-Task object")
        if len({id(t) for t in tasks}) != len(tasks):
            raise ValueError("Pipeline tasks list contains duplicates (by Python identity)")
        ids = {id(t) for t in tasks}
        edge_list: list[tuple[Task, Task]] = []
        for up, down in edges or []:
            if id(up) not in ids:
                raise ValueError("edge upstream task is not in the pipeline's task list")
            if id(down) not in ids:
                raise ValueError("edge downstream task is not in the pipeline's task list")
            edge_list.append((up, down))
        self._tasks = tasks
        self._edges = edge_list
        has_in = {id(d) for _, d in edge_list}
        has_out = {id(u) for u, _ in edge_list}
        self._sources = (
            _sources if _sources is not None else [t for t in tasks if id(t) not in has_in]
        )
        self._outputs = (
            _outputs if _outputs is not None else [t for t in tasks if id(t) not in has_out]
        )
        if _validate:
            self.validate()

    @classmethod
    def from_task(cls, task: Task) -> Pipeline:
        if not isinstance(task, Task):
            raise TypeError(f"expected a Task, got {type(task).__name__}")
        return cls([task])

    @property
    def tasks(self) -> list[Task]:
        return list(self._tasks)

    @property
    def edges(self) -> list[tuple[Task, Task]]:
        return list(self._edges)

    @property
    def sources(self) -> list[Task]:
        return list(self._sources)

    @property
    def outputs(self) -> list[Task]:
        return list(self._outputs)

    def __add__(self, other: Any) -> Pipeline:
        o = _as_pipeline(other)
        tasks = _unique(self._tasks + o._tasks)
        edges = self._edges + o._edges + [(a, b) for a in self._outputs for b in o._sources]
        return Pipeline(tasks, edges, _sources=self.sources, _outputs=o.outputs, _validate=True)

    def __radd__(self, other: Any) -> Pipeline:
        return _as_pipeline(other) + self

    def __or__(self, other: Any) -> Pipeline:
        o = _as_pipeline(other)
        tasks = _unique(self._tasks + o._tasks)
        edges = self._edges + o._edges
        return Pipeline(
            tasks,
            edges,
            _sources=_unique(self._sources + o._sources),
            _outputs=_unique(self._outputs + o._outputs),
            _validate=True,
        )

    def __ror__(self, other: Any) -> Pipeline:
        return _as_pipeline(other) | self

    def validate(self) -> list[Task]:
        """Check ids and acyclicity; return the tasks in display (Kahn, alphabetical) order."""
        seen: dict[str, Task] = {}
        for t in self._tasks:
            if not isinstance(t, Task):
                raise TypeError("pipeline contains a non-Task object")
            if t.task_id in seen and seen[t.task_id] is not t:
                raise ConfigurationError(f"duplicate task_id in pipeline: {t.task_id}")
            seen[t.task_id] = t
        return topological_order(self._tasks, self._edges)

    def reset(self) -> None:
        for t in self._tasks:
            t.reset()

    def run_blockwise(self, **kwargs: Any) -> Any:
        """``run_blockwise(self, ...)`` (daisy's API). The runner sits above the tasks, so
        the call goes through :mod:`bellis._seams`."""
        return _seams.run_blockwise(self, **kwargs)

    def __copy__(self) -> Pipeline:
        return Pipeline(self._tasks, self._edges, _sources=self.sources, _outputs=self.outputs)

    def __deepcopy__(self, memo: dict[int, Any]) -> Pipeline:
        return copy.copy(self)

    def __repr__(self) -> str:
        def ids(ts: list[Task]) -> str:
            return "[" + ", ".join(f'"{t.task_id}"' for t in ts) + "]"

        edges = ", ".join(f'("{a.task_id}", "{b.task_id}")' for a, b in self._edges)
        return (
            f"Pipeline(tasks={ids(self._tasks)}, sources={ids(self._sources)}, "
            f"outputs={ids(self._outputs)}, edges=[{edges}])"
        )


def topological_order(tasks: list[Task], edges: list[tuple[Task, Task]]) -> list[Task]:
    """Kahn's algorithm with the alphabetical task id breaking ties; raises on a cycle."""
    indeg = {id(t): 0 for t in tasks}
    succ: dict[int, list[Task]] = {id(t): [] for t in tasks}
    for a, b in edges:
        if a is b:
            raise DependencyCycleError()
        indeg[id(b)] += 1
        succ[id(a)].append(b)
    ready = sorted((t for t in tasks if indeg[id(t)] == 0), key=lambda t: t.task_id)
    order: list[Task] = []
    while ready:
        t = ready.pop(0)
        order.append(t)
        for b in succ[id(t)]:
            indeg[id(b)] -= 1
            if indeg[id(b)] == 0:
                ready.append(b)
        ready.sort(key=lambda x: x.task_id)
    if len(order) != len(tasks):
        raise DependencyCycleError()
    return order
