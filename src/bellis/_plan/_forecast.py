"""The sampled forecast: ``bellis.plan(tasks, sample=N)``.

Theory of operation
-------------------
0. **Follow a grown volume.** A store written for a smaller volume is moved onto the
   task's grid first, as the sample run's start would (the dry run does not count the
   done blocks of a store of another layout: a sample picked without them would take
   blocks already done).
1. **Pick.** Per task, ``N`` of the blocks left (default 2%, at least 20; every block left
   when fewer are): only blocks neither done nor masked, one block at a
   random place in each of ``N`` equal slices of the blocks left in Z-order (Morton), so
   the sample covers the grid in every axis. With a ``cost_hint`` (one value per block,
   the skip mask's shape) two thirds of the sample are stratified by the hint's order
   instead, and a third drawn with probability proportional to the hint: costly regions
   are seen, and a sample that is mostly costly blocks (which contend with each other as
   they would not in the run) is avoided. With conflict
   levels, blocks of the first level are picked (they wait for no neighbour); when it has
   too few, others too, with the lower-level blocks they wait for. A
   downstream block needs its upstream blocks' outputs, so the upstream blocks it reads
   that are not done join the sample, with the lower-level neighbours they wait for
   (transitively).
2. **Run.** The tasks run as they would (same launcher, workers, resources), each read
   through a spec (``TaskSpec``) whose skip mask leaves only its sampled blocks, with
   resource tracking on. The sampled
   blocks are recorded done in the tasks' own stores: the real run skips them.
3. **Measure.** Only the blocks the sample run ran count: a picked block whose stamps
   (``sent_at``, ``returned_at``, the server's ``time.time()``) lie outside the sample
   run's start and end did not run in it (a ``check_function`` found it done; its
   figures, if any, are another run's), is not counted as sampled and costs the blocks
   nearest it nothing; a timing of another run or clock never reaches the forecast
   (:func:`._costs.round_trips` raises on one). Each sampled block's wall, CPU and peak
   RSS are read back from the store;
   the sample run's report gives the worker starts, and the blocks' send and return times
   the round trip per batch. The sample's first blocks wait until the task's workers are
   all there (``_scheduling._gate``), so they run beside as many others as in the run; a
   worker's first few blocks pay for its warm-up, which is taken out of their cost and
   added to the worker's start (:func:`._costs.warm_up`).
4. **Predict.** Every block left gets a cost: the cost of the nearest sampled block in the
   grid (or, with a hint, a least-squares line in the hint). The run's schedule is then
   simulated (:mod:`._simulate`: levels, dependencies, worker start) at the tasks'
   ``max_workers`` and at x0.5, x2 and x4. The interval scales every cost by the 10th and
   90th percentiles of bootstrap resamples of the sample's mean cost.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from .._launchers._base import WorkerLauncher
from .._launchers._batch import BatchLauncher
from .._run._options import RunOptions
from .._run._runner import RunSettings, execute
from .._scheduling._memory import MEMORY_KEYS
from .._sizes import MIB, recommended_memory
from .._stats._forecast_score import sample_run, write_forecast
from .._task_spec import TaskSpec
from .._tracking import layout_hash, open_readonly, open_store, store_exists
from .._tracking._layout import plan_growth
from ..errors import ConfigurationError
from . import _costs
from ._dry import DryRun
from ._model import Plan, format_bytes, format_seconds
from ._simulate import simulate

__all__ = ["forecast", "sample_size"]

logger = logging.getLogger("bellis")

#: the default sample: this fraction of the blocks left, and at least MIN_SAMPLE per task
DEFAULT_FRACTION = 0.02
MIN_SAMPLE = 20
ALTERNATIVES = (0.5, 2.0, 4.0)
_BOOTSTRAP = 400
#: the most seconds a sample's first blocks wait for the task's workers to be all there
SAMPLE_GATE_SECONDS = 30.0


def sample_size(left: int, sample: int | bool) -> int:
    """Blocks to sample from ``left``: ``True`` is the default (2%, at least 20)."""
    if sample is True:
        n = max(MIN_SAMPLE, math.ceil(DEFAULT_FRACTION * left))
    else:
        n = int(sample)
    return max(0, min(n, left))


def _asked(left: int, sample: int | bool) -> int:
    """Blocks the sample asks for, before :func:`sample_size` caps it at the blocks left."""
    if sample is True:
        return max(MIN_SAMPLE, math.ceil(DEFAULT_FRACTION * left))
    return int(sample)


def _follow_grown_volumes(rp: RunSettings) -> None:
    """Move each store whose task's volume grew since it was written onto the task's grid
    now, as the sample run's start would (docs/tracking.md, "A grown volume"): the dry
    run does not count the done blocks of a store of another layout, and a sample picked
    without them would take blocks already done, and their figures from another run. A
    store that cannot follow its task is left alone (the sample run raises
    ``LayoutMismatch`` for it, as the real run would)."""
    for t in rp.specs.values():
        path = t.tracking_path
        if path is None or not store_exists(path):
            continue
        layout = t.store_layout
        with open_readonly(path) as store:
            grown = store.task_hash is not None and store.task_hash != layout_hash(layout)
            if grown:
                grown = not isinstance(plan_growth(store.record, layout), str)
        if grown:
            open_store(path, layout, resource_tracking=t.resource_tracking).close()


def _window(report: dict[str, Any]) -> tuple[float, float] | None:
    """The sample run's start and end (``time.time()``, the clock of its blocks' stamps)."""
    a, b = report.get("run_started_at"), report.get("run_finished_at")
    if a is None or b is None or not b >= a:
        return None
    return float(a), float(b)


def _check_sample(sample: Any) -> int | bool:
    if sample is True:
        return True
    if isinstance(sample, bool) or not isinstance(sample, int) or sample < 1:
        raise ConfigurationError(
            f"sample={sample!r} is not a number of blocks: pass a positive int (blocks per "
            "task), True for the default (2% of the blocks left, at least 20), or leave it "
            "out for a dry run",
            parameter="sample",
        )
    return sample


def _hints(cost_hint: Any, tasks: list[TaskSpec]) -> dict[str, np.ndarray[Any, Any]]:
    """``cost_hint`` per task id: one array (for every task whose grid has its shape) or a
    dict of task id to array, each of the task's block grid shape."""
    if cost_hint is None:
        return {}
    per: dict[str, Any] = {}
    if isinstance(cost_hint, dict):
        ids = {t.task_id for t in tasks}
        for k in cost_hint:
            if k not in ids:
                raise ConfigurationError(
                    f"cost_hint names task {k!r}, which is not in the pipeline "
                    f"(tasks: {sorted(ids)})",
                    parameter="cost_hint",
                )
        per = dict(cost_hint)
    out: dict[str, np.ndarray[Any, Any]] = {}
    for t in tasks:
        grid = tuple(t.geom.grid)
        raw = per.get(t.task_id) if per else cost_hint
        if raw is None:
            continue
        arr = np.asarray(raw, dtype=np.float64)
        if arr.shape != grid:
            if per:
                raise ConfigurationError(
                    f"cost_hint[{t.task_id!r}] has shape {list(arr.shape)} but task "
                    f"{t.task_id!r} has a block grid of shape {list(grid)} (one value per "
                    "block, as a skip mask; see Task.block_grid_shape)",
                    parameter="cost_hint",
                )
            if len(tasks) == 1:
                raise ConfigurationError(
                    f"cost_hint has shape {list(arr.shape)} but task {t.task_id!r} has a "
                    f"block grid of shape {list(grid)} (one value per block, as a skip "
                    "mask; see Task.block_grid_shape)",
                    parameter="cost_hint",
                )
            continue
        if not np.all(np.isfinite(arr)) or (arr < 0).any():
            raise ConfigurationError(
                f"cost_hint for task {t.task_id!r} holds negative or non-finite values; "
                "give a relative cost >= 0 per block",
                parameter="cost_hint",
            )
        out[t.task_id] = arr.reshape(-1)
    return out


def _first_level(dry: DryRun, run: Any) -> np.ndarray[Any, Any]:
    """The blocks left of ``run`` that wait for no other block left of their own task: a
    sample of them needs no neighbour to have run first (conflict levels). All blocks
    left when none is."""
    left = dry.left_mask(run)
    if not run.intra:
        return left
    free = np.zeros_like(left)
    free[run.geom.level_slices(0)] = left[run.geom.level_slices(0)]
    return free if free.any() else left


def _close(dry: DryRun, picks: dict[str, np.ndarray[Any, Any]]) -> None:
    """Add to ``picks`` every block, not done, that a picked block waits for: the blocks
    of lower conflict levels it reads (a block added from downstream may be of any
    level), and the upstream tasks' blocks whose outputs it reads, transitively."""
    runs = dry.scheduler.runs
    left = {r.task_id: dry.left_mask(r).reshape(-1) for r in runs}
    for run in reversed(runs):  # downstream first: what it adds upstream is closed in turn
        chosen = picks.get(run.task_id)
        if chosen is None or not len(chosen):
            continue
        mine = left[run.task_id]
        if run.intra:
            seen = set(chosen.tolist())
            todo = list(seen)
            while todo:
                for u in run.geom.upstream_of(todo.pop()):
                    if mine[u] and u not in seen:
                        seen.add(u)
                        todo.append(u)
            chosen = picks[run.task_id] = np.fromiter(sorted(seen), dtype=np.int64)
        for edge, up in run.up_edges:
            need: set[int] = set()
            for k in chosen.tolist():
                need.update(u for u in edge.upstream_of(k) if left[up.task_id][u])
            if need:
                have = picks.get(up.task_id, np.zeros(0, dtype=np.int64))
                merged = np.union1d(have, np.fromiter(need, dtype=np.int64, count=len(need)))
                picks[up.task_id] = merged


def _run_sample(rp: RunSettings, picks: dict[str, np.ndarray[Any, Any]]) -> dict[str, Any]:
    """Run only the picked blocks (see the module docstring); their run's report JSON."""
    specs: dict[str, TaskSpec] = {}
    for tid, t in rp.specs.items():
        keep = np.zeros(t.geom.num_blocks, dtype=bool)
        keep[picks.get(tid, np.zeros(0, dtype=np.int64))] = True
        mask = (~keep).astype(np.uint8).reshape(t.geom.grid)
        # the run reads its tasks through their specs only: the sample's own mask, and
        # the figures it needs recorded
        specs[tid] = dataclasses.replace(t, skip_mask=mask, resource_tracking=True)
    options = RunOptions(
        multiprocessing=rp.distributed,
        resources=rp.resources,
        progress=False,
        block_tracking=True,
        summary=False,
        launcher=rp.launcher,
        host=rp.host,
    )
    sample_plan = RunSettings.build(rp.pipeline, options)
    # the blocks wait for the workers: measured in the run's steady state (_scheduling._gate)
    sample_plan = dataclasses.replace(sample_plan, specs=specs, start_gate=SAMPLE_GATE_SECONDS)
    with sample_run():  # scores no waiting forecast
        result = execute(sample_plan)  # never planned again, also under bellis plan
    result.settle(True, raise_abandoned=True)
    assert result.report is not None  # a run that settles without raising wrote its report
    return {tid: rep.to_json() for tid, rep in result.report.tasks.items()}


def _grid_figures(dry: DryRun, run: Any) -> dict[str, np.ndarray[Any, Any]]:
    """The store's per-block figures of ``run``'s task, flat over its block grid."""
    store = dry.stores.get(run.task_id)
    out: dict[str, np.ndarray[Any, Any]] = {}
    if store is None:
        return out
    arrays = {"done": store.done, **store.stats}
    names = ("done", "wall_seconds", "cpu_seconds", "cpu_children_seconds", "peak_rss_bytes")
    for name in (*names, "worker_id", "sent_at", "returned_at"):
        if name not in arrays:
            continue
        full = np.zeros(run.geom.grid, dtype=np.float64)
        view, dst = run.store_view(arrays[name])
        full[dst] = view
        out[name] = full.reshape(-1)
    return out


def _worker_starts(report: dict[str, Any]) -> tuple[list[float], float]:
    """The sample run's worker starts (spawn to first request, sorted) and, for its
    workers that never connected before it ended (a SLURM job still pending), the floor of
    theirs: the sample run's wall."""
    records = (report.get("workers") or {}).get("records") or []
    seen = sorted(float(r["startup"]) for r in records if r.get("startup") is not None)
    floor = float(report.get("wall_seconds") or 0.0)
    return seen, max([floor, *seen[-1:]])


def _arrivals(seen: list[float], floor: float, workers: int, warm_up: float) -> list[float]:
    """Each of ``workers`` workers' start: those the sample saw, then the floor (a lower
    bound), plus the warm-up of a worker's first block. Empty when the sample saw no
    worker start: the simulation then uses the run's start delay for every worker."""
    if not seen:
        return []
    out = [*seen[:workers], *[floor] * max(0, workers - len(seen))]
    return [x + warm_up for x in out]


def _stat(values: np.ndarray[Any, Any]) -> dict[str, float]:
    if not len(values):
        return {"mean": 0.0, "p50": 0.0, "p95": 0.0, "p99": 0.0, "max": 0.0}
    p50, p95, p99 = np.percentile(values, [50, 95, 99])
    return {
        "mean": float(values.mean()),
        "p50": float(p50),
        "p95": float(p95),
        "p99": float(p99),
        "max": float(values.max()),
    }


def _ladder(request: int, growth: float) -> list[int]:
    return [int(request * growth**i) for i in range(3)]


def _configured_memory(task: TaskSpec, launcher: WorkerLauncher | None) -> tuple[int, str] | None:
    """The memory each worker of ``task`` asks for (bytes) and the parameter that sets it,
    as the run's memory ladder finds it (``_scheduling._memory.ladder_for``): the task's
    ``memory_limit``, else, on a launcher that grants memory, the task's ``requires``
    megabytes (batch launchers) or the launcher's ``mem`` (``memory_request``: SLURM, LSF,
    PBS, SGE). None: no request."""
    if task.memory_limit is not None:
        return int(task.memory_limit), "Task(memory_limit=...)"
    if launcher is None or not launcher.memory_grants:
        return None
    if not launcher.is_local:
        key = next((k for k in MEMORY_KEYS if task.requires.get(k)), None)
        if key is not None:
            return int(task.requires[key]) * MIB, f"Task(requires={{{key!r}: ...}}) (megabytes)"
    request = launcher.memory_request
    if isinstance(request, int) and not isinstance(request, bool) and request > 0:
        return request, f"{type(launcher).__name__}(mem=...)"
    return None


def _format_time(seconds: float) -> str:
    s = math.ceil(seconds)
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def forecast(
    rp: RunSettings,
    *,
    sample: Any = True,
    cost_hint: Any = None,
    seed: int = 0,
) -> Plan:
    """Run a sample of ``rp``'s blocks and forecast the rest (see the module docstring)."""
    sample = _check_sample(sample)
    hints = _hints(cost_hint, list(rp.specs.values()))
    if not rp.block_tracking or any(t.tracking_path is None for t in rp.specs.values()):
        raise ConfigurationError(
            "a forecast records its sampled blocks done in each task's tracking store, and "
            "reads their figures back from it; give every task one: "
            "bellis.set_tracking_basedir(...) or Task(tracking_path=...), and keep "
            "block_tracking=True",
            parameter="sample",
        )
    _follow_grown_volumes(rp)
    rng = np.random.default_rng(seed)
    before_counts: dict[str, dict[str, int]] = {}
    with DryRun(rp) as before:
        picks: dict[str, np.ndarray[Any, Any]] = {}
        for run in before.scheduler.runs:
            left = before.left_mask(run)
            n_left = int(left.sum())
            n = sample_size(n_left, sample)
            before_counts[run.task_id] = {
                "done": int(run.skipped_done),
                "left": n_left,
                "asked": _asked(n_left, sample),
            }
            hint = hints.get(run.task_id)
            picks[run.task_id] = _costs.choose(left, _first_level(before, run), n, hint, rng)
        _close(before, picks)
    n_picked = sum(len(v) for v in picks.values())
    logger.info("bellis plan: running a sample of %d blocks", n_picked)
    reports = _run_sample(rp, picks) if n_picked else {}
    with DryRun(rp) as after:
        plan = after.plan()
        _predict(rp, after, plan, picks, reports, hints, before_counts)
    _leave_for_scoring(plan)
    return plan


def _leave_for_scoring(plan: Plan) -> None:
    """Leave each task's forecast in its store: its next run scores it (_forecast_score)."""
    assert plan.forecast is not None
    for t in plan.tasks:
        f = t.forecast
        if t.store is None or f is None or not Path(t.store).is_dir():
            continue
        rss = f.get("peak_rss")
        write_forecast(
            t.store,
            {
                "made_at": time.time(),
                "tasks": [x.task_id for x in plan.tasks],  # the run it forecasts
                "sampled": f["sampled"],
                "blocks_left": t.left,
                "workers": t.workers,
                "wall": plan.forecast["wall"],
                "task_wall": f["wall"],
                "core_hours": f["core_hours"],
                "peak_rss_p99": None if rss is None else rss["p99"],
            },
        )


def _predict(
    rp: RunSettings,
    dry: DryRun,
    plan: Plan,
    picks: dict[str, np.ndarray[Any, Any]],
    reports: dict[str, Any],
    hints: dict[str, np.ndarray[Any, Any]],
    before: dict[str, dict[str, int]],
) -> None:
    runs = dry.scheduler.runs
    all_costs: list[np.ndarray[Any, Any]] = []
    all_cpu: list[np.ndarray[Any, Any]] = []
    index_of: dict[str, dict[int, int]] = {}
    groups: list[int] = []
    ratios: list[np.ndarray[Any, Any]] = []
    total = 0
    start_delays: list[float] = []
    #: per task: the sample's worker starts (seconds, sorted), and a floor for the others
    starts: list[tuple[list[float], float]] = []
    round_trips: list[float] = []
    warm_ups: list[float] = []
    done_before = sampled = 0
    for gi, run in enumerate(runs):
        out = plan[run.task_id]
        figs = _grid_figures(dry, run)
        chosen = picks.get(run.task_id, np.zeros(0, dtype=np.int64))
        rep = reports.get(run.task_id) or {}
        window = _window(rep)
        stamped = {"sent_at", "returned_at"} <= set(figs)
        ran, completed, found_done = _costs.sample_outcome(
            figs["done"][chosen] if "done" in figs else np.zeros(len(chosen)),
            figs["sent_at"][chosen] if stamped else None,
            figs["returned_at"][chosen] if stamped else None,
            window,
        )
        # only the sample run's own blocks: their figures and stamps are of its clock
        ok = chosen[completed]
        wall = figs["wall_seconds"][ok] if "wall_seconds" in figs else np.zeros(0)
        cpu = (figs.get("cpu_seconds", np.zeros(0))[ok] if len(ok) else np.zeros(0)) + (
            figs["cpu_children_seconds"][ok] if "cpu_children_seconds" in figs else 0.0
        )
        rss = figs["peak_rss_bytes"][ok] if "peak_rss_bytes" in figs else np.zeros(0)
        targets = np.flatnonzero(dry.left_mask(run).reshape(-1))
        model_wall = wall
        if rp.distributed and {"worker_id", "sent_at", "returned_at"} <= set(figs):
            warm, model_wall = _costs.warm_up(
                figs["worker_id"][ok], figs["sent_at"][ok], wall, (ok, run.geom.grid)
            )
            if warm is not None:
                warm_ups.append(warm)
        # a picked block that a check_function found done costs its neighbours nothing
        # either: the run's check skips them as it skipped it
        skipped = chosen[found_done]
        costs, model = _costs.predict_costs(
            run.geom.grid,
            targets,
            np.concatenate([ok, skipped]),
            np.concatenate([model_wall, np.zeros(len(skipped))]),
            hints.get(run.task_id),
        )
        cpu_ratio = float(cpu.sum() / wall.sum()) if wall.sum() > 0 else 1.0
        index_of[run.task_id] = {int(k): total + j for j, k in enumerate(targets.tolist())}
        total += len(targets)
        all_costs.append(costs)
        all_cpu.append(costs * cpu_ratio)
        groups.extend([gi] * len(targets))
        if len(wall):
            means = _bootstrap_means(model_wall)
            ratios.append(means / max(model_wall.mean(), 1e-12))
        started, first = rep.get("run_started_at"), rep.get("first_sent_at")
        if started is not None and first is not None and not run.up_edges:
            start_delays.append(max(0.0, float(first) - float(started)))
        starts.append(_worker_starts(rep))
        if rp.distributed and window is not None and stamped and "worker_id" in figs:
            round_trips.extend(
                _costs.round_trips(
                    figs["worker_id"][ok],
                    figs["sent_at"][ok],
                    figs["returned_at"][ok],
                    wall,
                    window,
                )
            )
        lau = run.spec.launcher or rp.launcher
        memory = _configured_memory(run.spec, lau)
        configured = None if memory is None else memory[0]
        growth = run.spec.memory_growth or (lau.memory_growth if lau is not None else None) or 2.0
        rss_stat = _stat(rss) if len(rss) else None
        was = before.get(run.task_id, {"done": 0, "left": len(chosen), "asked": len(chosen)})
        f: dict[str, Any] = {
            "sampled": int(ran.sum()),
            "sampled_done": len(ok),
            "sample_failed": int(len(chosen) - len(ok) - int(found_done.sum())),
            "sample_asked": was["asked"],
            "sample_picked": len(chosen),
            "sample_found_done": int(found_done.sum()),
            "done_before": was["done"],
            "left_before": was["left"],
            "cost_model": model,
            "block_wall": _stat(wall),
            "block_cpu": _stat(cpu),
            "peak_rss": None,
            "time_limit": None,
        }
        done_before += was["done"]
        sampled += f["sampled"]
        if rss_stat is not None:
            request = recommended_memory(float(rss.max()))
            f["peak_rss"] = {
                **rss_stat,
                "request": request,
                "ladder": _ladder(request, growth),
                "configured": configured,
            }
            if memory is not None and memory[0] < rss_stat["p99"]:
                plan.warnings.append(
                    f"task {run.task_id!r}: the memory request {format_bytes(memory[0])} is "
                    f"below the sampled p99 peak RSS {format_bytes(rss_stat['p99'])}; request "
                    f"{format_bytes(request)} ({memory[1]})"
                )
        if len(targets) and not len(ok):
            plan.warnings.append(
                f"task {run.task_id!r}: no sampled block completed, so its {len(targets)} "
                "blocks left are forecast at no cost: the forecast is too low"
            )
        if f["sample_failed"]:
            plan.warnings.append(
                f"task {run.task_id!r}: {f['sample_failed']} of {len(chosen)} sampled blocks "
                "did not complete; they are left for the run (see bellis status --failed)"
            )
        if f["sample_found_done"]:
            out.notes.append(
                f"{f['sample_found_done']} of the {len(chosen)} blocks picked for the sample "
                "were done without running in it (a check_function found their output, or "
                "another run did them): not measured, and not counted as sampled"
            )
        if was["asked"] > was["left"]:
            out.notes.append(
                f"the sample asked for {was['asked']} blocks but only {was['left']} were "
                "left to do: it took all of them"
            )
        if len(wall) and wall.max() > 0.5 * run.spec.timeout_secs:
            plan.warnings.append(
                f"task {run.task_id!r}: a sampled block took "
                f"{format_seconds(float(wall.max()))}, over half the block timeout "
                f"({run.spec.timeout_secs:g} s); raise Task(timeout=...)"
            )
        out.forecast = f
    deps = _dependencies(runs, index_of, total)
    costs = np.concatenate(all_costs) if all_costs else np.zeros(0)
    cpu_all = np.concatenate(all_cpu) if all_cpu else np.zeros(0)
    lo_hi = np.percentile(np.concatenate(ratios), [10, 90]) if ratios else np.array([1.0, 1.0])
    start_delay = float(np.median(start_delays)) if start_delays else 0.0
    warm_up = float(np.median(warm_ups)) if warm_ups else 0.0
    start_delay += warm_up
    round_trip = float(np.median(round_trips)) if round_trips else 0.0
    overhead = _costs.per_block_overhead(round_trip, costs)
    base_workers = [max(1, plan[r.task_id].workers or r.spec.max_workers) for r in runs]
    if not rp.distributed:  # one block at a time, in this process
        groups = [0] * total
        base_workers = [1]

    def sim(scale: float, workers: list[int]) -> Any:
        arrivals = None
        if rp.distributed:
            arrivals = [
                _arrivals(seen, floor, w, warm_up)
                for (seen, floor), w in zip(starts, workers, strict=True)
            ]
        scaled = costs * scale  # what a worker holds each block: its cost and round trip
        return simulate(
            list(scaled + _costs.per_block_overhead(round_trip, scaled)),
            deps,
            groups,
            workers,
            start_delay=start_delay if rp.distributed else 0.0,
            arrivals=arrivals,
        )

    est, low, high = (sim(s, base_workers) for s in (1.0, float(lo_hi[0]), float(lo_hi[1])))
    forecast_json: dict[str, Any] = {
        "blocks_left": int(total),
        "blocks_done": int(sum(plan[r.task_id].done for r in runs)),
        "done_before": done_before,
        "sampled": sampled,
        "start_delay_seconds": start_delay,
        "warm_up_seconds": warm_up,
        "round_trip_seconds": round_trip,
        "overhead_seconds_per_block": float(overhead.mean()) if len(overhead) else 0.0,
        "workers": {r.task_id: w for r, w in zip(runs, base_workers, strict=False)},
        "wall": _interval(est.wall, low.wall, high.wall),
        "core_hours": _interval(
            float(cpu_all.sum()) / 3600,
            float(cpu_all.sum()) * float(lo_hi[0]) / 3600,
            float(cpu_all.sum()) * float(lo_hi[1]) / 3600,
        ),
        "worker_hours": _interval(
            est.worker_seconds(base_workers) / 3600,
            low.worker_seconds(base_workers) / 3600,
            high.worker_seconds(base_workers) / 3600,
        ),
        "alternatives": [],
    }
    if rp.distributed:
        for scale in ALTERNATIVES:
            ws = []
            for r, _w in zip(runs, base_workers, strict=True):
                cap = max(1, plan[r.task_id].max_parallel)
                ws.append(max(1, min(cap, round(r.spec.max_workers * scale))))
            alt = sim(1.0, ws).wall  # its interval: the base run's, in proportion
            forecast_json["alternatives"].append(
                {
                    "scale": scale,
                    "workers": int(sum(ws)),
                    "wall": _interval(
                        alt,
                        alt * low.wall / max(est.wall, 1e-12),
                        alt * high.wall / max(est.wall, 1e-12),
                    ),
                }
            )
    for gi, run in enumerate(runs):
        task_forecast = plan[run.task_id].forecast
        assert task_forecast is not None
        gx = gi if rp.distributed else 0
        task_forecast["wall"] = _interval(est.finished[gx], low.finished[gx], high.finished[gx])
        cpu_h = float(all_cpu[gi].sum()) / 3600
        task_forecast["core_hours"] = _interval(
            cpu_h, cpu_h * float(lo_hi[0]), cpu_h * float(lo_hi[1])
        )
        lau = run.spec.launcher or rp.launcher
        if isinstance(lau, BatchLauncher):  # SLURM, LSF, PBS, Grid Engine
            need = high.finished[gx] * 1.25 + 300.0
            task_forecast["time_limit"] = _format_time(need)
            limit = lau.limit_seconds
            if limit and limit * (1 + run.spec.max_worker_restarts) < est.finished[gx]:
                shown = lau.time_limit or _format_time(limit)
                plan.warnings.append(
                    f"task {run.task_id!r}: the forecast wall {format_seconds(est.finished[gx])} "
                    f"outlasts the job time limit ({shown}) times its "
                    f"{1 + run.spec.max_worker_restarts} starts; set "
                    f"{type(lau).__name__}(time_limit={task_forecast['time_limit']!r}) or more "
                    "workers"
                )
    plan.forecast = forecast_json


def _dependencies(
    runs: Any, index_of: dict[str, dict[int, int]], total: int
) -> list[list[int]] | None:
    """Per block left (numbered as ``index_of`` says), the blocks left it waits for: the
    lower conflict levels of its task, and the upstream blocks it reads. None when no
    block waits for another (the simulation's fast path)."""
    if not any(run.intra or run.up_edges for run in runs):
        return None
    deps: list[list[int]] = [[] for _ in range(total)]
    for run in runs:
        mine = index_of[run.task_id]
        g = run.geom
        for k, i in mine.items():
            if run.intra:
                deps[i].extend(mine[u] for u in g.upstream_of(k) if u in mine)
            for edge, up in run.up_edges:
                theirs = index_of[up.task_id]
                deps[i].extend(theirs[u] for u in edge.upstream_of(k) if u in theirs)
    return deps


def _bootstrap_means(values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Bootstrap means of ``values`` (a fixed seed: the forecast is reproducible)."""
    rng = np.random.default_rng(12345)
    idx = rng.integers(0, len(values), size=(_BOOTSTRAP, len(values)))
    out: np.ndarray[Any, Any] = values[idx].mean(axis=1)
    return out


def _interval(estimate: float, low: float, high: float) -> dict[str, float]:
    return {
        "estimate": float(estimate),
        "low": float(min(low, estimate)),
        "high": float(max(high, estimate)),
    }
