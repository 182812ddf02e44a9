"""The runners of the real-workload benchmark: the same kernels (``kernels.py``) run by one
process, by a static split over processes, by bellis, by daisy 2.0.0 and by dask's threads.

Each runner is called in a fresh measurement process with a :class:`Job` (the workload's
stages, the array paths by name, the directory the kernels log their block times to, the
number of workers and the runner's options); it returns a dict of figures (``wall_s`` is
added by the caller) or raises.
"""

from __future__ import annotations

import functools
import inspect
import multiprocessing as mp
import random
from dataclasses import dataclass
from typing import Any

from real import kernels
from real.work import Stage, blocks


@dataclass(frozen=True)
class Job:
    """One measurement's work, as every runner gets it."""

    stages: tuple[Stage, ...]
    paths: dict[str, str]  # the arrays, by name
    timing_dir: str  # where the kernels log their block times
    size: int
    workers: int
    options: dict[str, Any]  # the runner's (bellis's ``--bellis-opt``s and variant)

    def spec(self, stage: Stage) -> dict[str, Any]:
        """The kernels' description of one stage's block (``kernels.run_block``)."""
        return {
            "kernel": stage.kernel,
            "input": self.paths[stage.input],
            "output": self.paths[stage.output],
            "context": stage.context,
            "size": self.size,
            "timing_dir": self.timing_dir,
        }


def run_single(job: Job) -> dict[str, Any]:
    """Every block in one process, in z, y, x order (the ideal is its block-time sum ÷
    workers)."""
    for stage in job.stages:
        spec = job.spec(stage)
        for b in blocks(stage, job.size):
            kernels.run_block(spec, *b)
    return {}


def _split_worker(specs: list[tuple[dict[str, Any], list[Any]]], barrier: Any) -> None:
    for spec, mine in specs:
        for b in mine:
            kernels.run_block(spec, *b)
        barrier.wait()


def run_split(job: Job, shuffle: bool = False) -> dict[str, Any]:
    """A static split: process ``p`` of ``workers`` runs the ``p``-th contiguous share of
    every stage's block list (z slabs), stages separated by a barrier. Processes are
    forked from the measurement process (their start is in the wall), so they inherit its
    imports (numpy, zarr, scipy): the best case of a scheduler-free loop, as a
    ``multiprocessing`` script gets on Linux (zarr resets its event loop in a forked
    child). Each opens the arrays once. ``shuffle``
    (runner ``split-shuffled``): each process runs its share in a random order (a fixed
    seed), to see what block order does to the block times."""
    workers = job.workers
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(workers)
    procs = []
    for p in range(workers):
        specs = []
        for stage in job.stages:
            bl = blocks(stage, job.size)
            lo, hi = len(bl) * p // workers, len(bl) * (p + 1) // workers
            mine = bl[lo:hi]
            if shuffle:
                random.Random(p).shuffle(mine)
            specs.append((job.spec(stage), mine))
        procs.append(ctx.Process(target=_split_worker, args=(specs, barrier)))
    try:
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
    codes = [proc.exitcode for proc in procs]
    if any(codes):
        raise RuntimeError(f"split worker exit codes {codes}")
    return {}


def _daisy_like(mod: Any, job: Job) -> dict[str, Any]:
    params = _task_params(mod.Task)
    worker_kw = "max_workers" if "max_workers" in params else "num_workers"
    is_bellis = mod.__name__ == "bellis"
    tasks: list[Any] = []
    for stage in job.stages:
        c, w = stage.context, stage.write
        kw: dict[str, Any] = {
            "total_roi": mod.Roi((-c,) * 3, (job.size + 2 * c,) * 3),
            "read_roi": mod.Roi((0,) * 3, (w + 2 * c,) * 3),
            "write_roi": mod.Roi((c,) * 3, (w,) * 3),
            "process_function": functools.partial(kernels.process_block, job.spec(stage)),
            "read_write_conflict": stage.conflict,
            "fit": "valid",
            worker_kw: job.workers,
        }
        if is_bellis:
            if len(job.stages) > 1:
                kw["requires"] = {"cpu": 1}
            for name, value in job.options.items():
                if name == "batch_target":
                    continue
                if name == "inputs":
                    if value:
                        # the stage's input; the outputs are declared too, so that an
                        # input this run writes (W3's smoothed array, read by the label
                        # task) is known to be written: cached only where bellis proves
                        # it final (a direct upstream writer with chunk-aligned write
                        # ROIs, as W3's smooth task: then written through), else
                        # ``bypassed``; ``outputs`` without ``verify_outputs`` adds
                        # nothing per block (docs/outputs.md)
                        kw["inputs"] = [job.paths[stage.input]]
                        kw["outputs"] = [job.paths[stage.output]]
                else:
                    kw[name] = value
        if tasks:
            kw["upstream_tasks"] = [tasks[-1]]
        tasks.append(mod.Task(stage.name, **kw))
    if is_bellis and "batch_target" in job.options:
        # an experiment, not an option: the seconds of work the server aims a batch at
        from bellis._scheduling import _batching

        _batching.BATCH_TARGET_SECONDS = float(job.options["batch_target"])  # type: ignore[misc]
    run_kw: dict[str, Any] = {"multiprocessing": True, "progress": False}
    if is_bellis:
        run_kw["summary"] = False
        if len(job.stages) > 1:
            run_kw["resources"] = {"cpu": job.workers}
    states = mod.run_blockwise(tasks, return_states=True, **run_kw)
    for tid, st in states.items():
        total = st.total_block_count
        if st.completed_count != total or st.failed_count or st.orphaned_count:
            raise RuntimeError(
                f"task {tid}: {st.completed_count}/{total} completed, "
                f"{st.failed_count} failed, {st.orphaned_count} orphaned"
            )
    info: dict[str, Any] = {
        "module": mod.__name__,
        "version": getattr(mod, "__version__", "?"),
        "file": mod.__file__,
    }
    if is_bellis:
        # per task: the workers' decoded-chunk cache counters (``task.report().input_cache``,
        # empty without inputs) and how coherent the workers' streams were
        # (``TaskState.locality_*``, distributed runs)
        per: dict[str, Any] = {}
        for task in tasks:
            st = states[task.task_id]
            rep = task.report()
            per[task.task_id] = {
                "blocks": st.completed_count,
                "input_cache": dict(getattr(rep, "input_cache", None) or {}) or None,
                "locality_blocks": int(getattr(st, "locality_blocks", 0)),
                "locality_local": int(getattr(st, "locality_local", 0)),
                "locality_steps": int(getattr(st, "locality_steps", 0)),
            }
        info["tasks"] = per
    return info


def run_bellis(job: Job) -> dict[str, Any]:
    import bellis

    return _daisy_like(bellis, job)


def _task_params(task_cls: Any) -> set[str]:
    """The keywords a Task class takes, over its MRO: ``bellis.Task`` is the daisy-1.x
    compatible subclass (``v1_compat.Task``), whose ``__init__(*args, **kwargs)`` hides the
    v2 Task's keywords from ``inspect.signature``."""
    names: set[str] = set()
    for cls in task_cls.__mro__:
        init = cls.__dict__.get("__init__")
        if init is not None:
            names |= set(inspect.signature(init).parameters)
    return names


def bellis_has_inputs() -> bool:
    import bellis

    return "inputs" in _task_params(bellis.Task)


def _is_daisy_2(mod: Any) -> bool:
    """Whether ``mod`` is daisy 2.0.0 itself (not bellis installed under daisy's name)."""
    return getattr(mod, "__version__", "") == "2.0.0" and "bellis" not in (mod.__file__ or "")


def run_daisy(job: Job) -> dict[str, Any]:
    import daisy

    if not _is_daisy_2(daisy):
        raise RuntimeError(f"daisy is {daisy.__version__} at {daisy.__file__}, not daisy 2.0.0")
    return _daisy_like(daisy, job)


def daisy_available() -> bool:
    try:
        import daisy
    except Exception:
        return False
    return _is_daisy_2(daisy)


def dask_available() -> bool:
    try:
        import dask.array  # noqa: F401
    except Exception:
        return False
    return True


def _timed(timing_dir: str, kernel: str, fn: Any, *args: Any) -> Any:
    import time

    c0 = time.process_time()
    t0 = time.perf_counter()
    out = fn(*args)
    kernels._log(timing_dir, kernel, 0.0, time.perf_counter() - t0, 0.0, time.process_time() - c0)
    return out


def run_dask(job: Job) -> dict[str, Any]:
    """dask.array over the same zarr arrays, ``map_overlap`` (zero boundary) where a stage has
    context, one ``da.store`` of every stage's output, threaded scheduler with ``workers``
    threads. A stage's input is its upstream stage's dask array (not re-read from zarr).
    The logged block time is the kernel's compute only: dask reads and writes outside it."""
    import dask
    import dask.array as da
    import numpy as np
    import zarr

    arrays: dict[str, Any] = {}
    sources, targets = [], []
    for stage in job.stages:
        if stage.input in arrays:
            x = arrays[stage.input]
        else:
            x = da.from_zarr(zarr.open_array(job.paths[stage.input], mode="r"))
        x = x.rechunk((stage.write,) * 3)

        def fn(b: Any, block_info: Any = None, _s: Stage = stage) -> Any:
            # the kernel on a block dask has padded (and crops) itself: no context here
            per = job.size // _s.write
            i, j, k = block_info[None]["chunk-location"]
            index = (i * per + j) * per + k
            return _timed(job.timing_dir, _s.kernel, kernels.compute, _s.kernel, b, 0, index)

        # else dask calls fn once more, for its meta
        meta = np.empty((0, 0, 0), dtype=stage.dtype)
        if stage.context:
            y = x.map_overlap(
                fn, depth=stage.context, boundary=0, trim=True, dtype=stage.dtype, meta=meta
            )
        else:
            y = x.map_blocks(fn, dtype=stage.dtype, meta=meta)
        arrays[stage.output] = y
        sources.append(y)
        targets.append(zarr.open_array(job.paths[stage.output], mode="r+"))
    with dask.config.set(scheduler="threads", num_workers=job.workers):
        da.store(sources, targets, lock=False)
    return {"dask": dask.__version__}


RUNNERS = {
    "single": run_single,
    "split": run_split,
    "split-shuffled": functools.partial(run_split, shuffle=True),
    "bellis": run_bellis,
    "bellis+inputs": run_bellis,
    # bellis from another source tree (``--base-src``): an earlier commit, in the same run
    "bellis-base": run_bellis,
    "daisy": run_daisy,
    "dask": run_dask,
}
