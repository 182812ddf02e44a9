"""What ``run_blockwise`` checks before a run starts: the pipeline it was given, the
resource budget, each task's process function for the mode, and the address workers dial.

Owns: the "invalid configuration: ..." errors of a run (each names the parameter and the
fix) and the choice of bind and advertised host. May import the model, ``_task`` and
``_launchers._net``; used by ``_runner`` (and ``v1_compat`` for daisy 1.x task lists).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import warnings
from typing import Any

from .._launchers._base import LocalLauncher, WorkerLauncher
from .._task import Pipeline, Task, function_arity
from .._task_params import (
    budget_units,
    check_setup_function,
    user_stacklevel as _user_stacklevel,
)
from .._task_spec import TaskSpec
from ..errors import ConfigurationError, CoverageWarning

__all__ = [
    "_check_config",
    "_check_gpus",
    "_check_launchers",
    "_check_resources",
    "_choose_hosts",
    "_coerce_pipeline",
    "_config_error",
    "_pipeline_from_list",
    "warn_uncovered",
]

logger = logging.getLogger("bellis")


def _coerce_pipeline(obj: Any) -> Pipeline:
    if isinstance(obj, Pipeline):
        return obj
    if isinstance(obj, Task):
        return Pipeline.from_task(obj)
    if isinstance(obj, list | tuple):
        return _pipeline_from_list(list(obj))
    raise TypeError(f"expected a Pipeline, a Task, or a list of tasks; got {type(obj).__name__}")


def _pipeline_from_list(tasks: list[Any]) -> Pipeline:
    """The daisy 1.x bridge: follow ``upstream_tasks`` transitively."""
    seen: dict[int, Task] = {}
    edges: list[tuple[Task, Task]] = []
    todo = list(tasks)
    while todo:
        t = todo.pop(0)
        if not isinstance(t, Task):
            raise TypeError(
                f"expected a Pipeline, a Task, or a list of tasks; the list holds a "
                f"{type(t).__name__}"
            )
        if id(t) in seen:
            continue
        seen[id(t)] = t
        for up in getattr(t, "upstream_tasks", None) or []:
            edges.append((up, t))
            todo.append(up)
    return Pipeline(list(seen.values()), edges, _validate=True)


def _config_error(msg: str, parameter: str | None = None) -> ConfigurationError:
    return ConfigurationError(f"invalid configuration: {msg}", parameter=parameter)


def _check_launchers(order: list[TaskSpec], launcher: object) -> None:
    """The run's ``launcher`` and each task's are ``WorkerLauncher``s (or None): the run
    reads their capabilities as typed members of that class."""
    given = [("launcher", launcher)] + [
        (f"Task({t.task_id!r}, launcher=...)", t.launcher) for t in order
    ]
    for where, lau in given:
        if lau is not None and not isinstance(lau, WorkerLauncher):
            raise _config_error(
                f"{where} is {type(lau).__name__}, not a launcher: pass "
                "bellis.LocalLauncher(), bellis.SlurmLauncher(...) or another "
                "bellis.WorkerLauncher (a subclass of it for a launcher of your own)",
                "launcher",
            )


def _check_config(
    order: list[TaskSpec], *, distributed: bool, resources: dict[str, int], external: bool
) -> None:
    for t in order:
        fn = t.process_function
        if fn is not None:  # set after construction (Task.process_function = ...)
            try:
                check_setup_function(t.task_id, t.setup, function_arity(fn))
            except ConfigurationError as exc:
                raise _config_error(str(exc), "setup") from exc
        if distributed:
            if fn is None and not external:
                raise _config_error(
                    f'task "{t.task_id}" has no process_function; distributed mode starts '
                    "workers that run it, so without one the run would wait forever. Pass "
                    "Task(process_function=...), or serve external workers with "
                    "Server(external_workers=True)",
                    "process_function",
                )
            have = budget_units(resources)
            for k, v in t.budget.items():
                if v > have.get(k, 0):
                    raise _config_error(
                        f'task "{t.task_id}" requires {{{k}: {t.requires[k]:g}}} but the global '
                        f"budget only has {{{k}: {resources.get(k, 0)}}}. Raise "
                        "run_blockwise(resources=...) or lower Task(requires=...)",
                        "requires",
                    )
        else:
            if fn is None or function_arity(fn) == 0:
                raise _config_error(
                    f'task "{t.task_id}" has no 1-argument process_function; serial mode '
                    "(multiprocessing=False) runs block functions in-process and cannot run "
                    "a worker function that expects to connect to a server",
                    "process_function",
                )


def _check_gpus(
    order: list[TaskSpec], launcher: WorkerLauncher | None, resources: dict[str, int]
) -> None:
    """The GPUs of the tasks a local launcher runs: the run's ``gpu`` budget, where not
    given, is the GPUs that launcher hands out (its ``gpus=``, else those this machine
    shows; ``_launchers._gpus``), and no worker may need more GPUs than there are."""
    for t in order:
        need = t.requires.get("gpu", 0)
        lau = t.launcher or launcher or None
        if not need or not (lau is None or isinstance(lau, LocalLauncher)):
            continue
        devices = lau.gpu_devices() if lau is not None else LocalLauncher.find_devices()
        have = len(devices)
        given = resources.get("gpu")
        if not have and given is not None:
            # no device to hand out, but the user counts GPUs themselves (daisy's abstract
            # resources, or NVML not installed): count, and leave CUDA_VISIBLE_DEVICES alone
            logger.warning(
                'task "%s" requires a GPU and resources={"gpu": %s} counts them, but no GPU '
                "was found to assign (no LocalLauncher(gpus=...), no CUDA_VISIBLE_DEVICES, "
                "and NVML lists none or nvidia-ml-py is not installed): 'gpu' is counted as "
                "an abstract resource and workers keep the driver's CUDA_VISIBLE_DEVICES; "
                "pip install 'bellis[gpu]' or pass LocalLauncher(gpus=[...]) to give each "
                "worker its own GPU",
                t.task_id,
                given,
            )
            continue
        where = (
            f"LocalLauncher(gpus={devices!r})"
            if lau is not None and lau.gpus is not None
            else "this machine (NVML, or the driver's CUDA_VISIBLE_DEVICES)"
        )
        if need > have:
            raise _config_error(
                f"task \"{t.task_id}\" requires {{'gpu': {need:g}}} per worker but {where} "
                f"has {have} GPU(s). Lower Task(requires={{'gpu': ...}}) (0.5 puts two workers on "
                "a GPU) or name the GPUs with LocalLauncher(gpus=[0, 1, ...])"
                + (
                    "; without them, pip install 'bellis[gpu]' lets NVML list them"
                    if not have
                    else ""
                ),
                "requires",
            )
        if given is None:
            resources["gpu"] = have
        elif given > have:
            raise _config_error(
                f"resources={{'gpu': {given}}} asks for {given} GPUs but {where} has {have}: "
                "lower run_blockwise(resources=...) or leave 'gpu' out to use every GPU",
                "resources",
            )


def _check_resources(resources: Any) -> dict[str, int]:
    if resources is None:
        return {}
    if not isinstance(resources, dict):
        raise TypeError(
            f"resources must be a dict of resource name to int, e.g. {{'gpu': 2}} (got "
            f"{type(resources).__name__})"
        )
    out = {}
    for k, v in resources.items():
        if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise _config_error(f"resources[{k!r}] = {v!r} is not a non-negative int", "resources")
        out[k] = v
    return out


def _choose_hosts(host: str | None, launchers: list[WorkerLauncher]) -> tuple[str, str]:
    """(bind address, advertised address)."""
    host = host or os.environ.get("BELLIS_HOST") or os.environ.get("DAISY_HOST")
    if host is None:
        if all(launcher.is_local for launcher in launchers):
            return "127.0.0.1", "127.0.0.1"
        from .._launchers._net import detect_reachable_host

        host = detect_reachable_host()
        logger.info("bellis server advertises %s to its workers", host)
    if host in ("localhost",):
        return "127.0.0.1", "127.0.0.1"
    try:
        ip = ipaddress.ip_address(host)
        if ip.is_loopback:
            return host, host
    except ValueError:
        from .._launchers._net import resolve_interface

        resolved = resolve_interface(host)
        if resolved is not None:
            return "0.0.0.0", resolved
    return "0.0.0.0", host


def _extent(offset: tuple[int, ...], shape: tuple[int, ...]) -> str:
    return " x ".join(f"[{o}, {o + max(0, n)})" for o, n in zip(offset, shape, strict=True))


def warn_uncovered(order: list[TaskSpec]) -> None:
    """A :class:`CoverageWarning` for each task whose blocks leave part of its
    ``total_write_roi`` unwritten (``fit="valid"`` drops partial blocks), or that has no
    block at all (a block larger than the volume). Called once per run, so once per task
    and run; the run goes on (daisy runs such tasks too, and returns True)."""
    for t in order:
        g = t.geom
        if g.num_blocks and g.fit != "valid":
            continue  # overhang and shrink reach the end of every axis
        tw_shape, w_shape = tuple(g.tw_shape), tuple(g.write_shape)
        written = tuple(n * w for n, w in zip(g.grid, w_shape, strict=True))
        uncovered = tuple(
            (o + c, o + max(0, tw)) if tw > c else None
            for o, tw, c in zip(g.tw_offset, tw_shape, written, strict=True)
        )
        if g.num_blocks and not any(uncovered):
            continue
        context = tuple(a + b for a, b in zip(g.ctx_ul, g.ctx_lr, strict=True))
        grown = tuple(
            -(-max(tw, w) // w) * w + c for tw, w, c in zip(tw_shape, w_shape, context, strict=True)
        )
        total = _extent(tuple(g.total_offset), tuple(g.total_shape))
        if not g.num_blocks:
            message = (
                f'task "{t.task_id}" has no block: total_roi {total} less the read context '
                f"{context} leaves {tuple(max(0, n) for n in tw_shape)} to write, and with "
                f'fit="{g.fit}" no write_roi of shape {w_shape} fits in it. The run does '
                f"nothing. Grow total_roi to shape {grown}, or make the blocks smaller"
            )
        else:
            gaps = " and ".join(
                f"[{u[0]}, {u[1]}) on axis {i}" for i, u in enumerate(uncovered) if u is not None
            )
            message = (
                f'task "{t.task_id}": its blocks write {_extent(tuple(g.tw_offset), written)}, '
                f"less than its total_write_roi {_extent(tuple(g.tw_offset), tw_shape)} "
                f"(total_roi {total} less the read context); no block writes {gaps}, "
                f'because fit="valid" drops the partial blocks there. Grow total_roi to '
                f'shape {grown} (a whole number of write_roi {w_shape}), or pass fit="shrink" '
                '(smaller last blocks) or fit="overhang" (last blocks write past the end)'
            )
        warnings.warn(
            CoverageWarning(message, task_id=t.task_id, uncovered=uncovered),
            stacklevel=_user_stacklevel(),
        )
