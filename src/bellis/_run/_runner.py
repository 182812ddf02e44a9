"""A run: its settings checked (:class:`RunSettings`), its stores opened, its blocks run
(serial mode in :mod:`._serial`, distributed in :mod:`._server`), its reports written and its
summary printed (:func:`execute`), and what it left (:class:`RunResult`). The public entry
points that call it live in :mod:`bellis._entrypoints`."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cloudpickle

from .. import logging as blog
from .._code_origin import collect as collect_code_origins
from .._donemarks import BlockStore
from .._launchers._base import LocalLauncher, WorkerLauncher
from .._outputs._declared import downstream_record, outputs_record
from .._outputs._inputs import plan_inputs
from .._payload import WorkerPayload
from .._protocol import CACHE_COUNTS, new_secret, worker_token
from .._report._panel import render_panel
from .._scheduling._abandon import RESTART_CAP, describe, is_broken_reason
from .._scheduling._gate import StartGate, shuffle_roots
from .._scheduling._memory import MemoryRetries, ladder_for
from .._scheduling._records import TaskRecord
from .._scheduling._scheduler import Scheduler
from .._scheduling._task_run import ABANDONED, TaskRun
from .._signals import install_abort_handlers
from .._state import DEFAULT_TIMEOUT_SECONDS, TaskState
from .._stats._forecast_score import score_forecast
from .._stats._report_load import append_report, remember_report
from .._stats._reports import (
    RunReport,
    TaskAggregates,
    TaskReport,
    counters_from_state,
    memory_from_state,
    task_report_json,
)
from .._stats._timeline import TimelineSet
from .._streams import print_to_stdout
from .._task import Pipeline, Task, function_arity
from .._task_spec import TaskSpec
from .._tracking import is_s3_url, open_store, record_outputs, s3_url
from .._worker._client import Context
from ..errors import TaskAbandonedError, WorkerStartError
from ._checks import (
    _check_config,
    _check_gpus,
    _check_launchers,
    _check_resources,
    _choose_hosts,
    _coerce_pipeline,
    _config_error,
    warn_uncovered,
)
from ._dashboard import check_dashboard, start_dashboard
from ._lanes import LanesWriter, start_lanes
from ._observers import run_observed
from ._options import RunOptions
from ._progress import make_observer
from ._provenance import CodeCheck, check_code, code_summary, finish_code, record_code
from ._serial import run_blocks_serially
from ._server import RunLoop
from ._shared import share_workers
from ._summary import (
    ErrorCollector,
    error_logs,
    format_summary,
    resume_message,
    settle_errors,
)

__all__ = ["RunResult", "RunSettings", "execute"]

logger = logging.getLogger("bellis")
progress_logger = logging.getLogger("bellis._run._progress")


def _open_stores(
    order: list[TaskSpec],
    block_tracking: bool,
    *,
    defer_stats: bool,
    edges: list[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    stores: dict[str, BlockStore] = {}
    paths: dict[str, str | None] = {}
    if block_tracking and edges and any(t.outputs for t in order):
        for t in order:
            p = t.tracking_path
            paths[t.task_id] = None if p is None else _absolute(p)
    for t in order:
        path = t.tracking_path if block_tracking else None
        if path is None:
            if t.resource_tracking:
                _close_stores(stores)
                raise _config_error(
                    f'task "{t.task_id}" sets resource_tracking=True but has no tracking '
                    "directory to write to. Pass Task(tracking_path=...) or call "
                    "bellis.set_tracking_basedir(...) once at pipeline start.",
                    "resource_tracking",
                )
            continue
        layout = t.store_layout
        # absolute now: a block function that changes directory must not move the store
        # (the run's report and the resource arrays are written through this path later)
        path = Path(_absolute(path))
        try:
            stores[t.task_id] = open_store(
                path, layout, resource_tracking=t.resource_tracking, defer_stats=defer_stats
            )
            if t.outputs:  # what `bellis verify` will read back (docs/outputs.md)
                below = downstream_record(t.task_id, edges or [], paths)
                record = outputs_record(
                    t.outputs, t.write_safety, t.verify_outputs, below, t.task_id, t.verify_stored
                )
                # on S3 the object <prefix>/outputs.json (docs/cloud.md)
                record_outputs(stores[t.task_id], path, record)
        except BaseException:
            try:
                _close_stores(stores)
            except Exception as close_error:
                # the error opening this store is the one to raise; this one is logged
                logger.warning("closing block tracking failed: %s", close_error)
            raise
    return stores


def _absolute(path: str | os.PathLike[str]) -> str:
    """``path`` absolute; an ``s3://`` URL (or ``Path``'s ``s3:/`` of one) as its URL."""
    return s3_url(path) if is_s3_url(path) else os.path.abspath(path)


def _close_stores(stores: dict[str, BlockStore]) -> None:
    """Close every store, even when one fails to; the first failure is raised after."""
    first: BaseException | None = None
    for store in stores.values():
        try:
            store.close()
        except BaseException as exc:
            if first is None:
                first = exc
            else:
                logger.error("closing block tracking at %s failed too: %s", store.path, exc)
    if first is not None:
        raise first


@contextlib.contextmanager
def _absolute_log_basedir() -> Iterator[None]:
    """During a run, a relative log basedir names the directory it named at run start: a
    block function that changes directory (serial mode runs it in this process) must not
    move the logs, and workers get the absolute path. The user's setting is back after."""
    base = blog.get_log_basedir()
    if base is None or base.is_absolute():
        yield
        return
    pinned = Path(os.path.abspath(base))
    blog.set_log_basedir(pinned)
    try:
        yield
    finally:
        if blog.get_log_basedir() == pinned:  # unless the user set another one meanwhile
            blog.set_log_basedir(base)


def _outcome(state: TaskState, run: TaskRun, interrupted: bool) -> str:
    if run.status == ABANDONED:
        return "abandoned"
    if interrupted and not state.is_done():
        return "interrupted"
    if state.completed_count == state.total_block_count:
        return "completed"
    return "failed" if state.is_done() else "interrupted"


def _abandon_message(
    states: dict[str, TaskState],
    order: list[str],
    lost: dict[str, int],
    said: dict[str, dict[str, Any]] | None = None,
) -> str:
    """The text of TaskAbandonedError. A task that ran out of workers *lost* the blocks it
    had left (``lost``); only blocks cut off by a failed or abandoned upstream are orphaned,
    though ``orphaned_count`` counts both, as daisy's does. ``said``: per abandoned task,
    :func:`bellis._scheduling._abandon.describe` (the rule that fired, the option that
    changes it, whether a rerun gets further)."""
    said = said or {}
    parts = []
    fixes: list[str] = []
    for tid in order:
        s = states[tid]
        if not s.abandoned:
            continue
        if s.abandon_reason == "upstream task abandoned":
            parts.append(
                f"task '{tid}' was abandoned (upstream task abandoned): {s.orphaned_count} of "
                f"{s.total_block_count} blocks were orphaned."
            )
            continue
        n_lost = lost.get(tid, 0)
        info = said.get(tid)
        if is_broken_reason(s.abandon_reason):
            text = (
                f"task '{tid}' was abandoned ({s.abandon_reason}): {s.failed_attempt_count} "
                f"failed block attempts; {n_lost} of {s.total_block_count} blocks were lost "
                "(never completed: the task was stopped)"
            )
        else:
            text = (
                f"task '{tid}' was abandoned ({s.abandon_reason or RESTART_CAP}): workers "
                f"failed {s.worker_failure_count} times, {s.worker_restart_count} restarts "
                f"performed; {n_lost} of {s.total_block_count} blocks were lost (never "
                "completed: no worker was left to run them)"
            )
        orphaned = s.orphaned_count - n_lost
        if orphaned > 0:
            text += f" and {orphaned} were orphaned by failed upstream blocks"
        text += "."
        if info is not None:
            text += (
                f" The rule that fired: {info['rule']}; {info['option']} changes it. "
                f"{info['rerun'][:1].upper()}{info['rerun'][1:]}."
            )
            if info["option"] not in fixes:
                fixes.append(info["option"])

        if s.timeout_reclaim_count:
            default = " — the default" if s.timeout_secs == DEFAULT_TIMEOUT_SECONDS else ""
            text += (
                f" {s.timeout_reclaim_count} block attempt(s) exceeded the block timeout "
                f"({s.timeout_secs:g}s{default}; pass Task(timeout=...) to raise it for slow "
                "blocks)."
            )
        if s.stall_reclaim_count:
            text += (
                f" {s.stall_reclaim_count} block attempt(s) stalled (no CPU, IO or heartbeat "
                f"for stall_timeout={s.stall_timeout_secs or 0.0:g}s)."
            )
        err = s.last_worker_error
        if not err:
            text += " No worker error was captured."
        elif "\n" in err.strip():
            text += " Last worker error:\n" + "\n".join(
                "    " + line for line in err.strip().splitlines()
            )
        else:
            text += f" Last worker error: {err.strip()}"
        parts.append(text)
    if not fixes or fixes == ["Task(max_worker_restarts=...)"]:
        fix = "Fix the worker error or increase Task(max_worker_restarts=...)"
    else:
        fix = "Fix the worker error or change " + " or ".join(fixes)
    parts.append(
        f"{fix}; use run_blockwise(..., return_states=True) to inspect task states on "
        "non-abandonment failures, or Server().run_blockwise(...) to never raise."
    )
    return "\n".join(parts)


def _serialize_function(task: TaskSpec, wired: Sequence[tuple[str, str, int]] = ()) -> bytes:
    """The worker payload (``_payload.WorkerPayload``), built once at run start: an
    unpicklable function fails here. ``wired``: the task's inputs as its workers get them
    (``_outputs._inputs.plan_inputs``: which are cached, which are written through)."""
    fn = task.process_function
    setup = task.setup
    setup_bytes = None
    if setup is not None:
        try:
            setup_bytes = cloudpickle.dumps(setup)
        except Exception as exc:
            raise WorkerStartError(
                f"bellis could not serialize the setup of task '{task.task_id}' for its "
                "worker subprocesses. Define it at module level and avoid capturing "
                "unpicklable objects (locks, open files, live clients): open them inside "
                f"the setup, which runs in each worker. Underlying error: {exc}",
                task_id=task.task_id,
            ) from exc
    try:
        function: bytes = cloudpickle.dumps(fn)
        origins = collect_code_origins(fn)
        if setup is not None:
            origins += collect_code_origins(setup)
        arity = 1 if function_arity(fn) > 0 else 0  # type: ignore[arg-type]
        return WorkerPayload(
            function=function,
            arity=2 if task.passes_context else arity,
            sys_path=tuple(p for p in sys.path if p),
            log_settings=blog.export_settings(),
            code_origins=tuple(origins),
            setup=setup_bytes,
            inputs=tuple(wired),
            input_cache_bytes=task.input_cache_bytes,
            outputs=tuple(spec.key for spec in task.outputs),
        ).to_bytes()
    except Exception as exc:
        raise WorkerStartError(
            f"bellis could not serialize the process_function of task '{task.task_id}' for "
            "its worker subprocess. Define it at module level, avoid capturing unpicklable "
            "objects (locks, open files, sockets, live clients) in closures, or create them "
            f"inside the function. Underlying error: {exc}",
            task_id=task.task_id,
        ) from exc


@dataclass(slots=True)
class RunResult:
    """What a run left: its task states in order, its report and how it ended.
    :meth:`settle` turns it into ``run_blockwise``'s return value or exception."""

    states: dict[str, TaskState] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    #: what aborted the run (a signal's name), or None
    interrupted: str | None = None
    #: an error that ended the run, raised by :meth:`settle`
    fatal: BaseException | None = None
    report: RunReport | None = None
    abandoned: bool = False
    #: per task, the blocks lost when it was abandoned (see TaskRun.lost_on_abandon)
    lost: dict[str, int] = field(default_factory=dict)
    #: per abandoned task, what is said about it (``_abandon.describe``)
    said: dict[str, dict[str, Any]] = field(default_factory=dict)

    def settle(self, return_states: bool, *, raise_abandoned: bool) -> Any:
        """The run's return value: ``{task_id: TaskState}`` with ``return_states``, else
        whether every block completed. Raises the run's fatal error, ``KeyboardInterrupt``
        when it was aborted and, with ``raise_abandoned``, :class:`TaskAbandonedError`; each
        carries the states and the report (``daisy_states``, ``daisy_run_report``...)."""
        if self.fatal is not None:
            _attach(self.fatal, self)
            raise self.fatal
        if self.interrupted is not None:
            exc = KeyboardInterrupt(f"run aborted by {self.interrupted}")
            _attach(exc, self)
            raise exc
        if self.abandoned and raise_abandoned:
            err = TaskAbandonedError(
                _abandon_message(self.states, self.order, self.lost, self.said)
            )
            _attach(err, self)
            raise err
        if return_states:
            return self.states
        return all(s.completed_count == s.total_block_count for s in self.states.values())


@dataclass(frozen=True, slots=True)
class RunSettings:
    """What one run needs, checked before anything runs: built by :meth:`build`, read by
    :func:`execute` and :func:`_run_distributed`."""

    pipeline: Pipeline
    #: the tasks in the order the pipeline validated them
    tasks: tuple[Task, ...]
    #: True: workers run the blocks (``multiprocessing=True``); False: this process does
    distributed: bool
    #: the checked global resource budget
    resources: dict[str, int]
    #: each task's settings, read once here (:class:`~bellis._task_spec.TaskSpec`): what
    #: the run reads of a task, by task id
    specs: dict[str, TaskSpec]
    #: distributed: each task's serialized worker payload (None: no process_function)
    payloads: dict[str, bytes | None]
    #: the progress display (an observer spec, see make_observer); distributed only
    progress: Any
    block_tracking: bool
    host: str | None
    summary: bool
    #: the default launcher (None: a LocalLauncher); a task's own launcher wins
    launcher: WorkerLauncher | None
    #: workers join from outside (``Server(external_workers=True)``)
    external: bool = False
    #: called once the run listens, with its host, port and secret (``Server``)
    on_listen: Callable[[str, int, bytes], None] | None = None
    #: serial mode's observer spec (SerialServer's attached observers)
    serial_observer: Any = None
    #: a plan's sample run: each task's first blocks wait up to this many seconds for its
    #: workers to be all there, and go out in a random order (``_scheduling._gate``);
    #: None: an ordinary run
    start_gate: float | None = None
    #: the live page's port (0: any free one); None: no page (``docs/live.md``)
    dashboard: int | None = None

    @property
    def mode(self) -> str:
        return "distributed" if self.distributed else "serial"

    @classmethod
    def build(
        cls,
        pipeline: Any,
        options: RunOptions,
        *,
        external: bool = False,
        on_listen: Callable[[str, int, bytes], None] | None = None,
        serial_observer: Any = None,
    ) -> RunSettings:
        """Check the pipeline and the configuration ``options`` give, and serialize the
        worker payloads (an unpicklable function fails here); raises before anything
        runs. ``return_states`` and ``dry_run`` are the caller's to act on."""
        multiprocessing = options.multiprocessing
        launcher = options.launcher
        resources = options.resources
        pipe = _coerce_pipeline(pipeline)
        tasks = pipe.validate()
        specs = {t.task_id: TaskSpec.of(t) for t in tasks}
        read = list(specs.values())
        budget = _check_resources(resources)
        if multiprocessing and not external:
            _check_launchers(read, launcher)
            _check_gpus(read, launcher, budget)
        _check_config(read, distributed=multiprocessing, resources=budget, external=external)
        warn_uncovered(read)
        payloads: dict[str, bytes | None] = {}
        if multiprocessing:
            wired = plan_inputs(read, [(a.task_id, b.task_id) for a, b in pipe.edges])
            for t in tasks:
                spec = specs[t.task_id]
                payloads[t.task_id] = (
                    None
                    if spec.process_function is None
                    else _serialize_function(spec, wired[t.task_id])
                )
        return cls(
            pipeline=pipe,
            tasks=tuple(tasks),
            distributed=multiprocessing,
            resources=budget,
            specs=specs,
            payloads=payloads,
            progress=options.progress,
            block_tracking=options.block_tracking,
            host=options.host,
            summary=options.summary,
            launcher=launcher,
            external=external,
            on_listen=on_listen,
            serial_observer=serial_observer,
            dashboard=check_dashboard(options.dashboard),
        )


class _Run:
    """One run in progress: its scheduler, what it gathers, and (distributed) its loop."""

    __slots__ = ("aggregates", "code", "errors", "loop", "result", "scheduler", "timelines")

    def __init__(
        self, scheduler: Scheduler, result: RunResult, errors: ErrorCollector, code: CodeCheck
    ) -> None:
        self.scheduler = scheduler
        #: which code this run's blocks are recorded with (``record_code``)
        self.code = code
        self.result = result
        self.errors = errors
        self.aggregates = {r.task_id: TaskAggregates() for r in scheduler.runs}
        #: distributed: each task's worker timelines
        self.timelines: dict[str, TimelineSet] = {}
        #: distributed: the loop serving the workers, set as soon as it listens
        self.loop: RunLoop | None = None


def execute(plan: RunSettings) -> RunResult:
    """Open the stores, run (serial or distributed), write the reports, print. The entry
    points (:mod:`bellis._entrypoints`) route a call here, or to the planner."""
    with _absolute_log_basedir():
        # distributed: the resource arrays are created while the workers start (RunLoop.run)
        stores = _open_stores(
            list(plan.specs.values()),
            plan.block_tracking,
            defer_stats=plan.distributed,
            edges=[(a.task_id, b.task_id) for a, b in plan.pipeline.edges],
        )
        result = RunResult()
        errors = ErrorCollector()
        started_wall = time.time()
        t_start = time.perf_counter()
        errors.sinks = error_logs(list(plan.specs.values()), stores, started_wall)
        code = CodeCheck(started_wall)
        live = None
        lanes: LanesWriter | None = None
        ended = False
        try:
            live = start_dashboard(plan.dashboard, stores)
            code = check_code(
                list(plan.tasks), plan.pipeline.edges, stores, started_wall, plan.specs
            )
            scheduler = Scheduler(
                plan.pipeline, _stores=stores, _unchecked=code.unchecked, _specs=plan.specs
            )
            if plan.start_gate is not None:  # a plan's sample run: in a random order too
                shuffle_roots(scheduler.runs, 0)
            result.order = scheduler.task_order
            # the lanes of the recent blocks, written into each local store for the live
            # page of another process (``bellis serve``)
            lanes = start_lanes(scheduler.runs, stores)
            if live is not None:
                live.attach(scheduler.runs)
            run = _Run(scheduler, result, errors, code)
            if plan.distributed:
                _run_distributed(plan, run)
            else:
                record_code(code, scheduler.runs)
                run_observed(
                    make_observer(plan.serial_observer, result.order),
                    lambda: scheduler.task_states,
                    lambda on_block: run_blocks_serially(
                        scheduler, run.aggregates, on_block, errors
                    ),
                )
            result.states = scheduler.task_states
            settle_errors(errors, scheduler.runs)
            finish_code(code, scheduler.runs)
            for r in scheduler.runs:
                run.aggregates[r.task_id].add_skipped(r.skipped)
                result.lost[r.task_id] = r.lost_on_abandon
                if r.status == ABANDONED:
                    result.said[r.task_id] = describe(r)
            finished_wall = time.time()
            wall = time.perf_counter() - t_start
            result.report = _write_reports(plan, run, stores, started_wall, finished_wall, wall)
            result.abandoned = any(s.abandoned for s in result.states.values())
            ended = True
        finally:
            torn_down = False
            try:
                if lanes is not None:
                    lanes.close()
                if live is not None:
                    live.close()
                errors.close_sinks()
                torn_down = True
            finally:
                # a run that ended closes its S3 stores (their last round trip: the run's
                # record, the lock's release) while the summary is printed; the others,
                # and every store of a run that raised (here or above), are closed first
                closing = None
                if not (ended and torn_down):
                    _close_stores(stores)
                else:
                    remote = {t: s for t, s in stores.items() if is_s3_url(s.path)}
                    closing = _Closing(remote)
                    try:
                        _close_stores({t: s for t, s in stores.items() if t not in remote})
                    except BaseException:
                        closing.wait(log=True)
                        raise
        assert closing is not None  # (the run ended: else its error went on above)
        try:
            if plan.distributed:
                blog.warn_if_log_disk_full()
        except BaseException:
            closing.wait(log=True)
            raise
    try:
        if plan.summary:
            _print_summary(plan, result, errors, code)
    except BaseException:
        closing.wait(log=True)
        raise
    closing.wait()
    return result


def _print_summary(
    plan: RunSettings, result: RunResult, errors: ErrorCollector, code: CodeCheck
) -> None:
    """The run's summary, the code notes and the panel to stdout; resume hints to stderr."""
    log_dir = blog.get_log_basedir() if plan.distributed else None
    text = format_summary(
        result.states,
        result.order,
        log_dir=log_dir,
        interrupted=result.interrupted is not None,
        errors=errors.as_dict(),
        abandoned=result.said,
    )
    print_to_stdout(text + code_summary(code.notes, result.order))
    for tid in result.order:
        msg = resume_message(result.states[tid])
        if msg:
            progress_logger.info("%s", msg)

    report = result.report
    assert report is not None  # (written before the stores were closed)
    panel = render_panel([report[t] for t in result.order])
    if panel:
        print_to_stdout("\n" + panel)


class _Closing:
    """The S3 stores of a run that ended, closed by a thread of their own
    (``_close_stores``) while the driver prints the summary; :meth:`wait` joins it and
    raises its error. What is left to write by then is the run's record and the lock's
    release, one round trip (and, in serial mode, the last markers before them: a
    distributed run wrote those while its workers exited, ``RunLoop._stop_workers``)."""

    def __init__(self, stores: dict[str, BlockStore]) -> None:
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if stores:
            self._thread = threading.Thread(
                target=self._close, args=(stores,), name="bellis-close", daemon=True
            )
            self._thread.start()

    def _close(self, stores: dict[str, BlockStore]) -> None:
        try:
            _close_stores(stores)
        except BaseException as exc:  # raised by wait(), in the driver's thread
            self._error = exc

    def wait(self, *, log: bool = False) -> None:
        """Once the stores are closed: raise the error closing them (``log``: another
        error is on its way, so this one is only logged)."""
        if self._thread is not None:
            try:
                self._thread.join()
            except BaseException:
                # interrupted (Ctrl-C): the lock's release is in flight; give it the time
                # a round trip takes before the interruption goes on
                self._thread.join(10.0)
                raise
        error, self._error = self._error, None
        if error is None:
            return
        if log:
            logger.error("closing block tracking failed too: %s", error)
            return
        raise error


def _run_distributed(plan: RunSettings, run: _Run) -> None:
    scheduler = run.scheduler
    default_launcher = plan.launcher if plan.launcher is not None else LocalLauncher()
    plans = {}
    launchers: dict[str, WorkerLauncher] = {}
    for task_run in scheduler.runs:
        tid = task_run.task_id
        lau = launchers[tid] = task_run.spec.launcher or default_launcher
        run.timelines[tid] = TimelineSet()
        plans[tid] = TaskRecord(
            task_run, plan.payloads[tid], run.aggregates[tid], run.timelines[tid]
        )
        ladder = ladder_for(task_run.spec, lau, plan.resources)
        if ladder is not None:
            plans[tid].memory = MemoryRetries(ladder, task_run)
        if plan.start_gate is not None:
            plans[tid].gate = StartGate(plan.start_gate)
    share_workers(plans, launchers, plan.payloads)  # workers that move between tasks
    bind, advertise = _choose_hosts(plan.host, list(launchers.values()))
    secret = new_secret()
    worker_key = new_secret()  # never leaves this process: see worker_token()
    logdir = blog.get_log_basedir()
    observer = make_observer(plan.progress, scheduler.task_order)

    def context_for(task_run: TaskRun, worker_id: int) -> dict[str, str]:
        loop = run.loop
        if loop is None:  # the loop starts workers only once it is built and set below
            raise RuntimeError("a worker context was asked for before the run loop existed")
        ctx = Context(
            hostname=loop.host,
            port=loop.port,
            task_id=task_run.task_id,
            worker_id=worker_id,
            resource_tracking=int(task_run.spec.resource_tracking),
            logdir="" if logdir is None else str(logdir),
            secret=secret.hex(),
            worker_token=worker_token(worker_key, worker_id).hex(),
        )
        return {"__encoded__": ctx.to_env()}

    def log_paths(task_id: str, slot: int, header: str, new_run: bool) -> tuple[Any, Any]:
        paths = blog.open_worker_log(task_id, slot, header=header, new_run=new_run)
        return (None, None) if paths is None else paths

    loop = run.loop = RunLoop(
        scheduler,
        plans,
        launchers,
        secret=secret,
        worker_key=worker_key,
        bind_host=bind,
        advertise_host=advertise,
        resources=plan.resources,
        observer=observer,
        errors=run.errors,
        context_extra=context_for,
        log_paths=log_paths,
        log_mode=blog.get_log_mode(),
        while_workers_start=lambda: record_code(run.code, scheduler.runs),
    )
    if plan.on_listen is not None:
        plan.on_listen(loop.host, loop.port, secret)
    poll, restore = install_abort_handlers()
    try:
        loop.run(poll)
    finally:
        restore()
    run.result.interrupted = loop.abort_reason
    run.result.fatal = loop.fatal


def _write_reports(
    plan: RunSettings,
    run: _Run,
    stores: dict[str, BlockStore],
    started: float,
    finished: float,
    wall: float,
) -> Any:
    reports = {}
    result = run.result
    # only a complete run scores a waiting forecast (_forecast_score)
    complete = result.interrupted is None and all(
        _outcome(result.states[r.task_id], r, False) == "completed" for r in run.scheduler.runs
    )
    for task_run in run.scheduler.runs:
        tid = task_run.task_id
        state = result.states[tid]
        tl = run.timelines.get(tid)
        data = task_report_json(
            task_id=tid,
            outcome=_outcome(state, task_run, result.interrupted is not None),
            mode=plan.mode,
            run_started_at=started,
            run_finished_at=finished,
            resource_tracking=task_run.spec.resource_tracking,
            counters=counters_from_state(state),
            blocks=run.aggregates[tid],
            workers=None if tl is None else tl.to_json(),
            wall_seconds=wall,
            first_sent_at=state.first_sent_at,
            last_returned_at=state.last_returned_at,
        )
        memory = memory_from_state(state)
        if memory is not None:
            data["memory"] = memory
        if task_run.task.inputs:  # what the workers' decoded-chunk caches did
            data["input_cache"] = dict(zip(CACHE_COUNTS, task_run.input_cache, strict=True))
        said = result.said.get(tid)
        if said is not None:  # the rule that fired, for the report's advice
            data["abandoned"] = said
        code = run.code.recorded.get(tid)
        if code is not None:  # the fingerprint of this run (and its code_version index)
            data["code"] = code
        store = stores.get(tid)
        store_path = None
        if store is not None:
            store_path = store.path
            left = state.total_block_count - state.skipped_done_count - state.skipped_mask_count
            scored = score_forecast(store, data, tasks=result.order, complete=complete, left=left)
            if scored is not None:
                data["forecast"] = scored  # what bellis.plan(sample=...) predicted
            append_report(Path(store.runs_jsonl), data)
        else:
            base = blog.get_log_basedir()
            if base is not None and blog.get_log_mode() != "console":
                append_report(Path(base) / blog.task_log_dirname(tid) / "runs.jsonl", data)
        remember_report(tid, data)
        reports[tid] = TaskReport(data, store_path)
    return RunReport(reports)


def _attach(exc: BaseException, result: RunResult) -> None:
    exc.daisy_states = result.states  # type: ignore[attr-defined]
    exc.daisy_run_stats = {  # type: ignore[attr-defined]
        tid: rep.to_json() for tid, rep in (result.report.tasks.items() if result.report else [])
    }
    exc.daisy_task_order = result.order  # type: ignore[attr-defined]
    exc.daisy_run_report = result.report  # type: ignore[attr-defined]
