"""Worker process entry point: ``python -m bellis._worker._main`` (started by a launcher).

stdin (or the file ``BELLIS_PAYLOAD_FILE`` names) carries one payload frame
(``_payload.read_payload_frame``) holding a ``_payload.WorkerPayload``: the pickled
function, its arity, the driver's ``sys.path``, the logging settings and the code origins.
Everything else (server address, task id, worker id, secret) is in ``BELLIS_CONTEXT``; the
variables a worker reads are listed in ``_protocol.WORKER_ENV``, the task's settings come in
its server's WELCOME. The payload is msgpack, so the driver's ``sys.path`` is in place
*before* the function is unpickled, and a function from a module that only the driver's
path can find loads by reference. Functions shipped by value get their source files back
(``_code_origin``). Nothing here relies on fork or on inherited globals, so it works with
any start method and on any node.

Exit codes: 0 clean, 87 block timeout, 88 block stalled (watchdog), 89 a block raised
``MemoryError`` under the worker's memory limit (``BELLIS_MEMORY_LIMIT``, bytes, set as
``RLIMIT_AS`` first thing), 1 an exception escaped.
"""

from __future__ import annotations

import os
import pickle
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._payload import WorkerPayload


def _read_payload(stream: Any) -> tuple[WorkerPayload, Any]:
    """The payload on ``stream`` (a ``WorkerPayload``) and its function, unpickled."""
    from .._payload import WorkerPayload, read_payload_frame

    payload = WorkerPayload.from_bytes(read_payload_frame(stream))
    # The payload comes from our own parent process (a pipe, or a private file it wrote),
    # never from the network. The function may live in a module found only on the driver's
    # sys.path, so that path must be in place before it is unpickled.
    _extend_sys_path(list(payload.sys_path))
    return payload, pickle.loads(payload.function)


def _extend_sys_path(paths: list[str]) -> None:
    for p in reversed(paths):
        if p and p not in sys.path:
            sys.path.insert(0, p)


def run_block_function_loop(
    fn: Any,
    context: Any = None,
    setup: Any = None,
    passes_context: bool = False,
    *,
    setup_by_name: Any = None,
) -> int:
    """Run ``fn`` on the blocks the server hands out; the exit code.

    ``setup`` (``Task(setup=...)``, None: none) runs once, before the first block, and its
    teardown when the loop ends, or when a SIGTERM comes while no block runs (``_setup``);
    a setup that raises ends the worker (code 1). ``passes_context``: ``fn`` is called
    ``fn(block, ctx)`` with what the setup made. ``setup_by_name(ref, task_id)``: how a
    worker started by hand (``bellis worker``) without a setup of its own gets the task's,
    by the name its server's WELCOME gives (one it cannot import raises when called: the
    worker then ends as after a setup that raised).

    A block that raises an ``Exception`` is a failed attempt and the loop goes on, once the
    function has returned on a block of this worker (``Client.run_block_function``). One
    that ends the worker (the worker's first blocks all raised, as in daisy 2.0.0: code 1;
    a ``MemoryError`` under the memory limit: code 89) has its traceback in the log and in
    the server's error report already, so it is not printed a second time, with bellis's
    frames, on the way out.
    """
    from ._client import Client

    client = Client(context)
    warm = None
    if setup_by_name is not None and setup is None and client.connected:
        if client.setup_ref is not None:  # the task has a setup
            setup = setup_by_name(client.setup_ref, client.task_id)
    if setup is not None and client.connected:
        from ._setup import enter_in_worker, with_context

        # from the instant it is entered, a SIGTERM while no block runs runs its teardown
        # (``_leaving.leaving.teardown``), once
        warm = enter_in_worker(client, setup)
        if warm is None:
            return 1  # the setup raised: reported to the log and the server
        if passes_context:
            fn = with_context(fn, warm.ctx)
    try:
        client.run_block_function(fn)
    except Exception as exc:
        if exc is client.reported:
            return _failure_code(exc)
        raise
    finally:
        if warm is not None:
            from ._leaving import leaving, sigterm_deferred

            # a SIGTERM while the teardown runs waits for it; the worker then exits
            with sigterm_deferred():
                leaving.teardown = None
                warm.leave()
    return 0


def _failure_code(exc: BaseException) -> int:
    """The exit code of a worker whose block raised ``exc``: an out-of-memory death under
    its memory limit, or an ordinary failure."""
    from .._protocol import EXIT_OUT_OF_MEMORY, MEMORY_LIMIT_ENV

    if isinstance(exc, MemoryError) and os.environ.get(MEMORY_LIMIT_ENV):
        return EXIT_OUT_OF_MEMORY
    return 1


def _limit_memory() -> None:
    """Cap this process's address space at ``BELLIS_MEMORY_LIMIT`` bytes, if set."""
    from .._protocol import MEMORY_LIMIT_ENV

    limit = os.environ.get(MEMORY_LIMIT_ENV)
    if not limit:
        return
    import resource

    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    value = int(limit)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(resource.RLIMIT_AS, (value, hard))


def run_worker_function(fn: Any, context: Any = None) -> int:
    """Call the 0-argument worker function ``fn`` (``fn(context=...)`` when it takes a
    keyword-only ``context``); the exit code.

    A client sends the blocks it finished with its next request, so the blocks of a function
    that returns (or raises) without asking for another are still in its clients: they are
    sent home here, and the blocks it never started are given back. While a thread the
    function started (not a daemon) still runs, it may still use them: then the exit hook in
    ``bellis._worker._client`` closes them, which runs once such threads have ended.
    """
    import inspect  # only worker functions need it; block-function workers start faster
    import threading

    from ._client import Context, close_clients

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    p = params.get("context") if params else None
    try:
        if p is not None and p.kind == inspect.Parameter.KEYWORD_ONLY:
            fn(context=Context.from_env() if context is None else context)
        else:
            fn()
    finally:
        me = threading.current_thread()
        if not any(t is not me and not t.daemon for t in threading.enumerate()):
            close_clients(skip_busy=True)
    return 0


def main() -> int:
    _limit_memory()
    from .._protocol import PAYLOAD_FILE_ENV

    payload_file = os.environ.get(PAYLOAD_FILE_ENV)
    if payload_file:
        # cluster launchers (SLURM, PBS, SGE, ...) put the payload in a file next to the logs
        with open(payload_file, "rb") as f:
            payload, fn = _read_payload(f)
    else:
        payload, fn = _read_payload(sys.stdin.buffer)
    from .. import logging as blog

    blog.apply_settings(payload.log_settings)
    blog.guard_std_streams()  # a full disk under the logs must not fail the blocks that print
    # this process's stdout and stderr lead to its slot's log files (or to the pipes a
    # "both" run tees into them): what current_slot_files() gives the user's code
    blog._bind_slot_files((sys.stdout, sys.stderr))
    setup = None if payload.setup is None else pickle.loads(payload.setup)
    if payload.code_origins:
        from .._code_origin import restore

        restore(fn, list(payload.code_origins))
        if setup is not None:
            restore(setup, list(payload.code_origins))
    if payload.inputs or payload.outputs:
        # numpy and zarr load here, for a task that declares inputs or outputs only
        from ._chunkcache import install_for_task

        install_for_task(payload.inputs, payload.input_cache_bytes, payload.outputs)
    if payload.arity:
        if payload.shared:  # a worker the server may move to other tasks of the run
            from ._shared import TaskCode, run_shared_loop

            own = TaskCode(
                fn,
                setup,
                payload.arity == 2,
                payload.inputs,
                payload.input_cache_bytes,
                payload.outputs,
            )
            return run_shared_loop(own, payload.shared, _failure_code)
        return run_block_function_loop(fn, setup=setup, passes_context=payload.arity == 2)
    try:
        return run_worker_function(fn)
    except MemoryError as exc:
        code = _failure_code(exc)
        if code == 1:
            raise
        import traceback

        traceback.print_exc()
        return code


if __name__ == "__main__":
    sys.exit(main())
