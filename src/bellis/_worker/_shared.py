"""A shared worker: one process that serves several tasks of a run, one after another.

The server moves a worker whose task has no ready block to another task of the same run
that it can serve (``bellis._scheduling._sharing`` decides when, and which tasks are
compatible): in reply to an ``ACQUIRE`` it sends ``MOVE task_id`` instead of blocks or a
``SHUTDOWN``. The worker then closes that connection (its finished blocks went home with
the ``ACQUIRE``), leaves its task (:func:`leave_task`), connects again as the same managed
worker of the new task (a new ``HELLO``: the task's own ``WELCOME``, with its timeout,
geometry and read-back) and runs the new task's block function on its blocks.

The other tasks' functions come in the worker's payload (``WorkerPayload.shared``, from the
driver, never from the network) and are unpickled on the first move to their task.
:class:`FunctionCache` keeps at most :data:`MAX_LOADED_FUNCTIONS` of them loaded, the
least recently used dropped first (and loaded again from its pickle if the worker comes
back to that task).
"""

from __future__ import annotations

import os
import pickle
import sys
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final

from .._protocol import CONTEXT_ENV, DAISY_CONTEXT_ENV, SharedFunction

__all__ = ["MAX_LOADED_FUNCTIONS", "FunctionCache", "leave_task", "run_shared_loop"]

#: how many block functions a shared worker keeps loaded at once
MAX_LOADED_FUNCTIONS: Final = 4


class FunctionCache:
    """The block functions a shared worker may run, by task: loaded on first use, at most
    ``limit`` at once (least recently used dropped first)."""

    def __init__(
        self,
        task_id: str,
        fn: Any,
        shared: tuple[SharedFunction, ...],
        limit: int = MAX_LOADED_FUNCTIONS,
    ) -> None:
        self._pickles = {s.task_id: s for s in shared}
        self._loaded: OrderedDict[str, Any] = OrderedDict({task_id: fn})
        self._limit = max(1, limit)
        #: how many times a function was unpickled (the first task's is not counted)
        self.loads = 0

    def get(self, task_id: str) -> Any:
        """The block function of ``task_id``; KeyError when this worker has none for it."""
        fn = self._loaded.get(task_id)
        if fn is not None:
            self._loaded.move_to_end(task_id)
            return fn
        entry = self._pickles[task_id]
        fn = pickle.loads(entry.function)  # from our own driver's payload (see _main)
        if entry.code_origins:
            from .._code_origin import restore

            restore(fn, list(entry.code_origins))
        self.loads += 1
        self._loaded[task_id] = fn
        while len(self._loaded) > self._limit:
            self._loaded.popitem(last=False)
        return fn

    @property
    def loaded(self) -> list[str]:
        """The tasks whose function is loaded now, least recently used first."""
        return list(self._loaded)


def leave_task(task_id: str) -> None:
    """The worker leaves ``task_id`` for another task of the run (a move): the one point
    where whatever the worker holds for that task alone ends. Nothing is held today; a
    per-worker setup's teardown belongs here."""


def _announce(worker_id: str, left: str, joined: str) -> None:
    """A line in both of the worker's log files: the blocks after it are ``joined``'s."""
    line = f"=== bellis worker {worker_id} moves from task '{left}' to task '{joined}' ===\n"
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.write(line)
            stream.flush()
        except (OSError, ValueError):
            pass


def run_shared_loop(
    fn: Any,
    shared: tuple[SharedFunction, ...],
    failure_code: Callable[[BaseException], int],
) -> int:
    """Run ``fn`` on its task's blocks, and the other tasks' functions of ``shared`` on
    theirs whenever the server moves this worker; the exit code (as
    ``_main.run_block_function_loop``'s)."""
    from ._client import Client, Context

    context = Context.from_env()
    task_id = context["task_id"]
    functions = FunctionCache(task_id, fn, shared)
    while True:
        client = Client(context)
        try:
            client.run_block_function(fn)
        except Exception as exc:
            if exc is client.reported:
                return failure_code(exc)
            raise
        target = client.moved_to
        if target is None:
            return 0
        leave_task(task_id)
        _announce(context.get("worker_id", "?"), task_id, target)
        context = context.copy()
        context["task_id"] = target
        # user code that reads its context (daisy.Client(), Context.from_env()) sees the
        # task it serves now
        os.environ[CONTEXT_ENV] = os.environ[DAISY_CONTEXT_ENV] = context.to_env()
        fn = functions.get(target)
        task_id = target
