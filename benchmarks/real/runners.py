"""The runners of the real-workload benchmark: the same kernels (``kernels.py``) run by one
process, by a static split over processes, by bellis, by daisy 2.0.0 and by dask's threads.

Each runner is called in a fresh measurement process with the workload's stages, the array
paths by name, the directory the kernels log their block times to, and the number of
workers; it returns a dict of figures (``wall_s`` is added by the caller) or raises.
"""

from __future__ import annotations

import functools
import inspect
import multiprocessing as mp
import random
from typing import Any

from real import kernels
from real.work import Stage, blocks


def _spec(stage: Stage, paths: dict[str, str], timing_dir: str, size: int) -> dict[str, Any]:
    return {
        "kernel": stage.kernel,
        "input": paths[stage.input],
        "output": paths[stage.output],
        "context": stage.context,
        "size": size,
        "timing_dir": timing_dir,
    }


def run_single(
    stages: tuple[Stage, ...],
    paths: dict[str, str],
    timing_dir: str,
    size: int,
    workers: int,
    options: dict[str, Any],
) -> dict[str, Any]:
    """Every block in one process, in z, y, x order (the ideal is its block-time sum ÷
    workers)."""
    for stage in stages:
        spec = _spec(stage, paths, timing_dir, size)
        for b in blocks(stage, size):
            kernels.run_block(spec, *b)
    return {}


def _split_worker(specs: list[tuple[dict[str, Any], list[Any]]], barrier: Any) -> None:
    for spec, mine in specs:
        for b in mine:
            kernels.run_block(spec, *b)
        barrier.wait()


def run_split(
    stages: tuple[Stage, ...],
    paths: dict[str, str],
    timing_dir: str,
    size: int,
    workers: int,
    options: dict[str, Any],
    shuffle: bool = False,
) -> dict[str, Any]:
    """A static split: process ``p`` of ``workers`` runs the ``p``-th contiguous share of
    every stage's block list (z slabs), stages separated by a barrier. Processes are
    forked from the measurement process (their start is in the wall), so they inherit its
    imports (numpy, zarr, scipy): the best case of a scheduler-free loop, as a
    ``multiprocessing`` script gets on Linux (zarr resets its event loop in a forked
    child). Each opens the arrays once. ``shuffle``
    (runner ``split-shuffled``): each process runs its share in a random order (a fixed
    seed), to see what block order does to the block times."""
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(workers)
    procs = []
    for p in range(workers):
        specs = []
        for stage in stages:
            bl = blocks(stage, size)
            lo, hi = len(bl) * p // workers, len(bl) * (p + 1) // workers
            mine = bl[lo:hi]
            if shuffle:
                random.Random(p).shuffle(mine)
            specs.append((_spec(stage, paths, timing_dir, size), mine))
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


def _daisy_like(
    mod: Any,
    stages: tuple[Stage, ...],
    paths: dict[str, str],
    timing_dir: str,
    size: int,
    workers: int,
    options: dict[str, Any],
) -> dict[str, Any]:
    params = _task_params(mod.Task)
    worker_kw = "max_workers" if "max_workers" in params else "num_workers"
    is_bellis = mod.__name__ == "bellis"
    tasks: list[Any] = []
    for stage in stages:
        c, w = stage.context, stage.write
        kw: dict[str, Any] = {
            "total_roi": mod.Roi((-c,) * 3, (size + 2 * c,) * 3),
            "read_roi": mod.Roi((0,) * 3, (w + 2 * c,) * 3),
            "write_roi": mod.Roi((c,) * 3, (w,) * 3),
            "process_function": functools.partial(
                kernels.process_block, _spec(stage, paths, timing_dir, size)
            ),
            "read_write_conflict": stage.conflict,
            "fit": "valid",
            worker_kw: workers,
        }
        if is_bellis:
            if len(stages) > 1:
                kw["requires"] = {"cpu": 1}
            for name, value in options.items():
                if name == "batch_target":
                    continue
                if name == "inputs":
                    if value:
                        # the stage's input; the outputs are declared too, so that an
                        # input this run writes (W3's smoothed array, read by the label
                        # task) is known to be written and never cached (counted as
                        # ``bypassed``); ``outputs`` without ``verify_outputs`` adds
                        # nothing per block (docs/outputs.md)
                        kw["inputs"] = [paths[stage.input]]
                        kw["outputs"] = [paths[stage.output]]
                else:
                    kw[name] = value
        if tasks:
            kw["upstream_tasks"] = [tasks[-1]]
        tasks.append(mod.Task(stage.name, **kw))
    if is_bellis and "batch_target" in options:
        # an experiment, not an option: the seconds of work the server aims a batch at
        from bellis._scheduling import _batching

        _batching.BATCH_TARGET_SECONDS = float(options["batch_target"])  # type: ignore[misc]
    run_kw: dict[str, Any] = {"multiprocessing": True, "progress": False}
    if is_bellis:
        run_kw["summary"] = False
        if len(stages) > 1:
            run_kw["resources"] = {"cpu": workers}
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


def run_bellis(
    stages: tuple[Stage, ...],
    paths: dict[str, str],
    timing_dir: str,
    size: int,
    workers: int,
    options: dict[str, Any],
) -> dict[str, Any]:
    import bellis

    return _daisy_like(bellis, stages, paths, timing_dir, size, workers, options)


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


def run_daisy(
    stages: tuple[Stage, ...],
    paths: dict[str, str],
    timing_dir: str,
    size: int,
    workers: int,
    options: dict[str, Any],
) -> dict[str, Any]:
    import daisy

    if getattr(daisy, "__version__", "") != "2.0.0" or "bellis" in (daisy.__file__ or ""):
        raise RuntimeError(f"daisy is {daisy.__version__} at {daisy.__file__}, not daisy 2.0.0")
    return _daisy_like(daisy, stages, paths, timing_dir, size, workers, options)


def daisy_available() -> bool:
    try:
        import daisy
    except Exception:
        return False
    return getattr(daisy, "__version__", "") == "2.0.0" and "bellis" not in (daisy.__file__ or "")


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


def run_dask(
    stages: tuple[Stage, ...],
    paths: dict[str, str],
    timing_dir: str,
    size: int,
    workers: int,
    options: dict[str, Any],
) -> dict[str, Any]:
    """dask.array over the same zarr arrays, ``map_overlap`` (zero boundary) where a stage has
    context, one ``da.store`` of every stage's output, threaded scheduler with ``workers``
    threads. A stage's input is its upstream stage's dask array (not re-read from zarr).
    The logged block time is the kernel's compute only: dask reads and writes outside it."""
    import dask
    import dask.array as da
    import zarr

    arrays: dict[str, Any] = {}
    sources, targets = [], []
    for stage in stages:
        if stage.input in arrays:
            x = arrays[stage.input]
        else:
            x = da.from_zarr(zarr.open_array(paths[stage.input], mode="r"))
        x = x.rechunk((stage.write,) * 3)
        per = size // stage.write
        if stage.kernel == "gaussian":

            def fn(b: Any, _s: Stage = stage) -> Any:
                return _timed(timing_dir, _s.kernel, kernels.gaussian_compute, b, 0)

            dtype = "uint8"
        elif stage.kernel == "threshold":

            def fn(b: Any, _s: Stage = stage) -> Any:
                return _timed(timing_dir, _s.kernel, kernels.threshold_compute, b)

            dtype = "uint8"
        else:

            def fn(b: Any, block_info: Any = None, _s: Stage = stage, per: int = per) -> Any:
                i, j, k = block_info[None]["chunk-location"]
                index = (i * per + j) * per + k
                return _timed(timing_dir, _s.kernel, kernels.label_compute, b, 0, index)

            dtype = "uint32"
        import numpy as np

        meta = np.empty((0, 0, 0), dtype=dtype)  # else dask calls fn once more, for its meta
        if stage.context:
            y = x.map_overlap(
                fn, depth=stage.context, boundary=0, trim=True, dtype=dtype, meta=meta
            )
        else:
            y = x.map_blocks(fn, dtype=dtype, meta=meta)
        arrays[stage.output] = y
        sources.append(y)
        targets.append(zarr.open_array(paths[stage.output], mode="r+"))
    with dask.config.set(scheduler="threads", num_workers=workers):
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
