"""Serial mode: every block of a run in this process, in dependency order (SPEC §3.1).

The driver's scheduler hands out the blocks as it does to workers; the block function runs
here, its stdout and stderr going to the worker_0 logs as the log mode asks."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any, cast

from .. import logging as blog
from .._block import Block, BlockStatus, stats_problem
from .._outputs._inputs import (
    CACHE_READS,
    WRITE_THROUGH,
    array_location,
    plan_inputs,
    run_outputs,
)
from .._outputs._readback import ReadBack, wire_outputs
from .._scheduling._attempts import attempt_record, block_coord, setup_record, text_key
from .._scheduling._scheduler import Scheduler
from .._worker._chunkcache import cache_bound, install
from .._worker._failure import clean, failure_details, log_offsets
from .._worker._profiling import Meter, attach_gpu
from .._worker._setup import Warm, enter, setup_failure_text, with_context

__all__ = ["run_blocks_serially"]

logger = logging.getLogger("bellis")


@contextlib.contextmanager
def _serial_output(task_id: str) -> Iterator[None]:
    """Serial mode: the function's stdout/stderr go to worker_0 logs in file mode, and to
    those and the terminal in mode ``"both"``."""
    mode = blog.get_log_mode()
    if mode == "console":
        yield
        return
    paths = blog.open_worker_log(task_id, 0)
    if paths is None:
        yield
        return
    # a log that cannot be written (a full disk) costs its output, not the block that
    # printed: the LogStreams drop what follows, and the error is logged after the redirect
    streams: list[blog.LogStream] = []
    try:
        for path in paths:
            streams.append(blog.LogStream(open(path, "a"), str(path)))
        out, err = streams
        if mode == "both":
            # the tee echoes to the streams in force when the task's blocks start running
            to_out: Any = out if sys.stdout is None else _Tee(sys.stdout, out)
            to_err: Any = err if sys.stderr is None else _Tee(sys.stderr, err)
        else:
            to_out, to_err = out, err
        with (
            # a LogStream forwards fileno() and the rest, so it serves as a file
            blog._slot_files_bound(cast("IO[str]", out), cast("IO[str]", err)),
            contextlib.redirect_stdout(to_out),
            contextlib.redirect_stderr(to_err),
        ):
            yield
    finally:
        for stream in streams:
            stream.close()
        for stream in streams:
            if stream.error is not None:
                logger.error(
                    "could not write the worker log %s: %s; output written after that is lost",
                    stream.name,
                    stream.error,
                )


class _Tee:
    """A text stream that writes to two (log mode ``"both"`` in serial runs)."""

    def __init__(self, first: Any, second: Any) -> None:
        self._streams = (first, second)

    def write(self, text: str) -> int:
        for stream in self._streams:
            stream.write(text)
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        for stream in self._streams:
            stream.flush()

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        # encoding, errors, fileno(), buffer...: those of the terminal stream
        return getattr(self._streams[0], name)


def _record_failure(
    errors: Any, run: Any, k: int, text: str, exc: BaseException | None, full: str | None
) -> None:
    """Serial mode's error record of block ``k``: the traceback and the log offsets (no
    worker, host or job). Failure path only."""
    if errors is None:
        return
    files = blog.current_slot_files()
    # the summary's error groups, as the distributed server keeps them (_dispatch)
    errors.add(
        run.task_id,
        run.geom.spatial_id_of(k),
        text,
        None if files is None else files[1],
        index=k,
        coord=block_coord(run, k),
    )
    if exc is None and errors.counted(run.task_id, text, None):
        return  # its error's full records are written: counted
    if files is None:
        offsets: dict[str, Any] = {}
    else:
        offsets = log_offsets(*files)
    text = clean(text)
    details = failure_details(exc, full, offsets)
    details.pop("host", None)
    details.pop("pid", None)
    details.pop("job", None)
    errors.record(
        attempt_record(None, run, k, text, None, details),
        text_key(run.task_id, text, None, details),
    )


def _enter_setup(run: Any, errors: Any) -> Warm:
    """Serial mode: the task's setup, entered in the driver before its first block. One
    that raises is recorded (kind ``setup failed``) and propagates, with a note that names
    the setup, as a block's exception does."""
    try:
        return enter(run.task.setup, run.task_id)
    except BaseException as exc:
        if isinstance(exc, Exception):
            full = blog.format_traceback(type(exc), exc, exc.__traceback__)
            text = setup_failure_text(run.task_id, "in serial mode", full)
            logger.error("%s", text)
            if errors is not None:
                files = blog.current_slot_files()
                details = failure_details(exc, full, {} if files is None else log_offsets(*files))
                for key in ("host", "pid", "job"):
                    details.pop(key, None)
                errors.record(setup_record(None, run, clean(text), details))
            exc.add_note(f"raised by the setup of task '{run.task_id}' (Task(setup=...))")
        raise


def _raised(errors: Any, run: Any, k: int, exc: BaseException, release: Any, t0: float) -> None:
    """Block ``k`` raised ``exc``, which propagates (daisy 2.0.0's serial mode): its error
    record, and its failed attempt in the tracking store, so that a rerun runs the blocks
    never tried before this one (a ``KeyboardInterrupt`` is no attempt: it is left out)."""
    full = blog.format_traceback(type(exc), exc, exc.__traceback__)
    _record_failure(errors, run, k, full, exc, full)
    if isinstance(exc, Exception):
        release(run, k, False, None, -1, t0, time.time())


def _read_back(verify: ReadBack, run: Any, k: int, block: Block, errors: Any) -> bool:
    """``verify_outputs``: read block ``k``'s outputs back and store their checksum before
    its release marks it done; False (a failed attempt, recorded) when they cannot be."""
    geom = run.geom
    intervals = [geom.write_interval(i, g) for i, g in enumerate(geom.coords_of(k))]
    checksum = verify.checksum(intervals)
    if isinstance(checksum, str):
        logger.warning("block %s failed: %s", block.block_id, checksum)
        _record_failure(errors, run, k, checksum, None, None)
        return False
    if run.store is not None:
        cell = run.cell_of(k)
        if cell >= 0:
            run.store.record_checksum(cell, checksum)
    return True


def run_blocks_serially(
    scheduler: Scheduler, aggregates: dict[str, Any], on_block: Any = None, errors: Any = None
) -> None:
    """Every block in this process, in dependency order (SPEC §3.1): an exception from a
    block function propagates at once, with its own type, as in daisy 2.0.0 (recorded
    first as the block's failed attempt: a rerun runs the blocks never tried before it).
    ``on_block()``, when given, is called after each block (a SerialServer's attached
    observers, see run_observed).

    ``Task(timeout=...)`` and ``Task(stall_timeout=...)`` are not enforced here: a block
    runs in the caller's own thread, and there is no worker process to replace."""
    for run in scheduler.runs:
        if run.spec.stall_timeout_secs is not None:
            logger.warning(
                "task '%s': stall_timeout=%gs is ignored in serial mode "
                "(multiprocessing=False): blocks run in this process, and there is no worker "
                "to replace; block.heartbeat() does nothing here",
                run.task_id,
                run.spec.stall_timeout_secs,
            )
        if run.spec.memory_limit is not None:
            logger.warning(
                "task '%s': memory_limit is ignored in serial mode (multiprocessing=False): "
                "blocks run in this process, which is not limited, and there is no worker "
                "to give more memory",
                run.task_id,
            )
    cache = _cache_inputs(scheduler.runs)
    warm: dict[str, Warm] = {}  # Task(setup=...), entered before each task's first block
    try:
        _run_all(scheduler, aggregates, on_block, errors, cache, warm)
    finally:
        for w in reversed(list(warm.values())):
            w.leave()
        if cache is not None:
            cache.remove()


def _cache_inputs(runs: list[Any]) -> Any:
    """Serve the tasks' declared inputs from one decoded-chunk cache in this process (as
    each worker does in a distributed run), as large as the largest task's bound, and
    write their declared outputs directly where it can (``_worker._chunkwrite``); None
    when no task declares outputs, nor inputs with a bound above 0.

    One cache serves every task, so an input's reads are cached only where every task
    that declares it may cache it (``plan_inputs``: a task reading an upstream output
    that is not proven final must not fill the cache with it), and its writes are kept
    (write-through) only when its reads are cached."""
    tasks = [run.spec for run in runs]
    written = run_outputs(tasks)
    edges = [(up.task_id, run.task_id) for run in runs for _edge, up in run.up_edges]
    plan = plan_inputs(tasks, edges)
    # where -> [store, path, reads (AND over the tasks declaring it; None: none does),
    # writes (OR)]
    flags: dict[str, list[Any]] = {}
    for t in tasks:
        if not cache_bound(t.input_cache_bytes, t.memory_limit):
            continue
        for store, path, f in plan[t.task_id]:
            entry = flags.setdefault(array_location(store, path), [store, path, None, False])
            if f != WRITE_THROUGH:  # a declared input
                entry[2] = entry[2] is not False and bool(f & CACHE_READS)
            entry[3] = entry[3] or bool(f & WRITE_THROUGH)
    wired = [
        (store, path, CACHE_READS | (WRITE_THROUGH if writes else 0) if reads else 0)
        for store, path, reads, writes in flags.values()
        if reads is not None
    ]
    if not wired and not written:
        return None
    bounds = [cache_bound(t.input_cache_bytes, t.memory_limit) for t in tasks]
    return install(wired, max(bounds), written)


def _run_all(
    scheduler: Scheduler,
    aggregates: dict[str, Any],
    on_block: Any,
    errors: Any,
    cache: Any,
    warm: Any,
) -> None:
    progressed = True
    while progressed:
        progressed = False
        for run in scheduler.runs:
            fn = run.spec.process_function
            assert fn is not None
            agg = aggregates[run.task_id]
            tracked = run.spec.resource_tracking
            meter = Meter() if tracked else None
            if meter is not None:
                attach_gpu(meter)
            geom = run.geom
            mode = run.spec.verify_outputs
            verify = None
            if mode:
                verify = ReadBack(
                    wire_outputs(run.spec.outputs, run.spec.verify_stored), mode == "allow_empty"
                )
            acquire = scheduler.acquire_index
            release = scheduler.release_index
            k = acquire(run)
            if k < 0:
                continue  # no block now: the log files are not opened (no empty run in them)
            with _serial_output(run.task_id):
                if run.task.setup is not None:
                    w = warm.get(run.task_id)
                    if w is None:
                        w = warm[run.task_id] = _enter_setup(run, errors)
                    if run.task.passes_context:
                        fn = with_context(fn, w.ctx)
                while k >= 0:
                    progressed = True
                    block = Block._lazy(geom, k, BlockStatus.PROCESSING)
                    measured = None
                    span = None
                    if meter is not None:
                        t0 = time.time()
                        # blocks run back to back: each measurement continues from the
                        # previous block's closing readings
                        meter.begin(back_to_back=True)
                        try:
                            fn(block)
                        except BaseException as exc:
                            _raised(errors, run, k, exc, release, t0)
                            raise
                        finally:
                            measured = meter.finish()
                        t1 = time.time()
                    else:
                        t0 = time.time()
                        try:
                            fn(block)
                        except BaseException as exc:
                            _raised(errors, run, k, exc, release, t0)
                            raise
                        # the task's own span only: an untracked store takes no stamps
                        span = (t0, time.time())
                        run.note_span(*span)
                        t0 = t1 = 0.0
                    ok = block._status in (BlockStatus.PROCESSING, BlockStatus.SUCCESS)
                    if cache is not None:  # what the input cache did for this block
                        counts = cache.cache.take_counts()
                        if counts is not None:  # to the task's totals and the store
                            run.record_cache([k], [k, *counts])
                    # a measurement the block function attached itself wins
                    stats: Any = measured
                    attached = block.stats
                    if attached is not None and ok:
                        problem = stats_problem(attached)
                        if problem is None:
                            stats = attached.to_tuple()
                        else:
                            logger.warning("block %s failed: %s", block.block_id, problem)
                            ok = False
                            _record_failure(errors, run, k, problem, None, None)
                    elif not ok:
                        _record_failure(errors, run, k, "block status set to FAILED", None, None)
                    if ok and verify is not None:
                        ok = _read_back(verify, run, k, block, errors)
                    if cache is not None:  # the chunks it wrote whole, kept if it succeeded
                        cache.cache.commit() if ok else cache.cache.discard()
                    release(run, k, ok, stats, -1, t0, t1)
                    if span is not None and run.recent is not None:  # the live page's lanes
                        run.recent.append((-1, span[0], span[1], k, ok))
                    if tracked or not ok:
                        agg.add_block(None, stats if ok else None, not ok)
                    else:
                        agg.count += 1
                    if on_block is not None:
                        on_block()
                    k = acquire(run)
                if run.remaining <= 0 and run.task_id in warm:
                    warm.pop(run.task_id).leave()  # the task is over: its teardown
