"""A shared worker: one process that serves several tasks of a run, one after another.

The server moves a worker whose task has no ready block to another task of the same run
that it can serve (``bellis._scheduling._sharing`` decides when, and which tasks are
compatible): in reply to an ``ACQUIRE`` it sends ``MOVE task_id`` instead of blocks or a
``SHUTDOWN``, on the same connection, with the new task's ``WELCOME`` (its timeout,
geometry and read-back) and, when no setup or teardown must run first, its first blocks:
one round trip in all. The worker (its finished blocks went home with the ``ACQUIRE``)
leaves its task (:func:`leave_task`), serves the new task on that connection
(``Client.rejoin``: no reconnection, no handshake; the connection proved the run's secret
and the worker's token when it opened) and runs the new task's block function on its
blocks.

The other tasks' functions come in the worker's payload (``WorkerPayload.shared``, from the
driver, never from the network) and are unpickled on the first move to their task.
:class:`FunctionCache` keeps at most :data:`MAX_LOADED_FUNCTIONS` of them loaded, the
least recently used dropped first (and loaded again from its pickle if the worker comes
back to that task).

What is the task's alone goes with each move, in this order: the old task's teardown
(``Task(setup=...)``'s ``__exit__``, when its setup made a context manager) runs once the
server said MOVE; the decoded-chunk cache then serves the new task's declared inputs
(``_chunkcache.install_for_task``: the same cache and chunks, the new task's inputs, bound and
counts); the worker serves the new task on its connection and runs its setup, which
reports to the server in a SETUP message as a first setup does (no reply awaited), then
asks for its first blocks. A setup that raises ends the
worker there, as in a worker started for that task: its error record and its exit are
the new task's. A worker that comes back to a task runs its setup again.
"""

from __future__ import annotations

import os
import pickle
import sys
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from .._payload import SharedFunction
from .._protocol import CONTEXT_ENV, DAISY_CONTEXT_ENV

if TYPE_CHECKING:
    from ._setup import Warm

__all__ = [
    "MAX_LOADED_FUNCTIONS",
    "FunctionCache",
    "TaskCode",
    "leave_task",
    "run_shared_loop",
]

#: how many block functions a shared worker keeps loaded at once
MAX_LOADED_FUNCTIONS: Final = 4


class TaskCode(NamedTuple):
    """What a shared worker runs a task's blocks with: its block function, its setup
    (None: none), whether the function takes the setup's context (``fn(block, ctx)``),
    its declared inputs with their cache bound, and its declared outputs
    (``WorkerPayload``'s fields)."""

    fn: Any
    setup: Any
    passes_context: bool
    inputs: tuple[tuple[str, str, int], ...]
    input_cache_bytes: int | None
    outputs: tuple[tuple[str, str], ...] = ()


class FunctionCache:
    """The block functions (with their setups) a shared worker may run, by task: loaded
    on first use, at most ``limit`` at once. The worker's own task's code (``task_id``,
    ``code``: from its payload, unpickled already, with no pickle to load it again from)
    is always kept; of the others, the least recently used is dropped first."""

    def __init__(
        self,
        task_id: str,
        code: TaskCode,
        shared: tuple[SharedFunction, ...],
        limit: int = MAX_LOADED_FUNCTIONS,
    ) -> None:
        self._pickles = {s.task_id: s for s in shared}
        self._own = (task_id, code)
        self._loaded: OrderedDict[str, TaskCode] = OrderedDict()
        self._limit = max(1, limit - 1)
        #: how many times a function was unpickled (the first task's is not counted)
        self.loads = 0

    def get(self, task_id: str) -> TaskCode:
        """The code of ``task_id``; KeyError when this worker has none for it."""
        if task_id == self._own[0]:
            return self._own[1]
        code = self._loaded.get(task_id)
        if code is not None:
            self._loaded.move_to_end(task_id)
            return code
        entry = self._pickles[task_id]
        # from our own driver's payload (see _main)
        fn = pickle.loads(entry.function)
        setup = None if entry.setup is None else pickle.loads(entry.setup)
        if entry.code_origins:
            from .._code_origin import restore

            restore(fn, list(entry.code_origins))
            if setup is not None:
                restore(setup, list(entry.code_origins))
        self.loads += 1
        code = TaskCode(
            fn, setup, entry.arity == 2, entry.inputs, entry.input_cache_bytes, entry.outputs
        )
        self._loaded[task_id] = code
        while len(self._loaded) > self._limit:
            self._loaded.popitem(last=False)
        return code

    @property
    def loaded(self) -> list[str]:
        """The tasks whose function is loaded now: the worker's own task, then the others,
        least recently used first."""
        return [self._own[0], *self._loaded]


def leave_task(warm: Warm | None) -> None:
    """The worker leaves its task (a move, or its end): the one point where what it
    held for that task alone ends: the teardown of the task's setup, if it made one."""
    if warm is not None:
        warm.leave()


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
    own: TaskCode,
    shared: tuple[SharedFunction, ...],
    failure_code: Callable[[BaseException], int],
) -> int:
    """Run the worker's own task's code ``own`` on its blocks (after its setup, if any),
    and the other tasks' code of ``shared`` on theirs whenever the server moves this
    worker; the exit code (as ``_main.run_block_function_loop``'s). ``own``'s inputs are
    installed already (``_main``)."""
    from ._client import Client, Context
    from ._leaving import leaving, sigterm_deferred

    context = Context.from_env()
    task_id = context["task_id"]
    functions = FunctionCache(task_id, own, shared)
    code = own
    client = Client(context)
    while True:
        run = code.fn
        warm = None
        if code.setup is not None and client.connected:
            from ._setup import enter_in_worker, with_context

            # from the instant it is entered, a SIGTERM while no block runs (waiting for
            # blocks, between them, or between a MOVE and the teardown) runs its teardown
            # (``leaving.teardown``), then the worker exits
            warm = enter_in_worker(client, code.setup)
            if warm is None:
                return 1  # the setup raised: reported to the log and the server
            if code.passes_context:
                run = with_context(run, warm.ctx)
        try:
            client.run_block_function(run)
        except Exception as exc:
            if exc is client.reported:
                return failure_code(exc)
            raise
        finally:
            # a SIGTERM while the teardown runs waits for it, then ends the worker here
            with sigterm_deferred():
                leaving.teardown = None
                leave_task(warm)
        target = client.moved_to
        if target is None or leaving.came:
            # the server said stop, or a SIGTERM did (its block went home); blocks of the
            # task it was moved to go back unstarted
            client.close()
            return 0
        _announce(context.get("worker_id", "?"), task_id, target)
        context = context.copy()
        context["task_id"] = target
        # user code that reads its context (daisy.Client(), Context.from_env()) sees the
        # task it serves now
        os.environ[CONTEXT_ENV] = os.environ[DAISY_CONTEXT_ENV] = context.to_env()
        code = functions.get(target)
        if code.inputs or code.outputs or "bellis._worker._chunkcache" in sys.modules:
            # (numpy and zarr load only where some task of this worker declares inputs or
            # outputs)
            from ._chunkcache import install_for_task

            install_for_task(code.inputs, code.input_cache_bytes, code.outputs)
        # the same connection serves the new task: no reconnection, no handshake
        client.rejoin(context)
        task_id = target
