"""Workers shared between a run's tasks: the tasks each task's workers may move to
(``_scheduling._sharing`` decides which and when) and the payloads that let them (each
task's function, setup and declared inputs), built once at run start."""

from __future__ import annotations

import dataclasses

from .._launchers._base import WorkerLauncher
from .._payload import SharedFunction, WorkerPayload
from .._scheduling._records import TaskRecord
from .._scheduling._sharing import share_groups

__all__ = ["share_workers"]


def share_workers(
    plans: dict[str, TaskRecord],
    launchers: dict[str, WorkerLauncher],
    payloads: dict[str, bytes | None],
) -> None:
    """Set each plan's ``shares_with`` and put the block functions of the tasks its
    workers may move to into its payload (``WorkerPayload.shared``). ``payloads``: each
    task's own payload, as built at run start."""
    decoded = {tid: WorkerPayload.from_bytes(p) for tid, p in payloads.items() if p is not None}
    arities = {tid: p.arity for tid, p in decoded.items()}
    groups = share_groups(plans.values(), launchers, arities)
    for tid, others in groups.items():
        shared = tuple(_shared_function(o.run.task_id, decoded[o.run.task_id]) for o in others)
        plans[tid].payload = dataclasses.replace(decoded[tid], shared=shared).to_bytes()


def _shared_function(task_id: str, p: WorkerPayload) -> SharedFunction:
    """What a worker that moves to ``task_id`` needs of its payload ``p``: its function,
    setup, declared inputs and outputs."""
    return SharedFunction(
        task_id,
        p.function,
        p.code_origins,
        p.setup,
        p.arity,
        p.inputs,
        p.input_cache_bytes,
        p.outputs,
    )
