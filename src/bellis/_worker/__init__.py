"""The worker process: what runs beside the user's block function.

Owns:
  ``_main``        the entry point of a worker process (``python -m bellis._worker._main``)
  ``_client``      ``Client``: the worker's side of the protocol (re-exports ``Context``)
  ``_context``     ``bellis.Context``: what reaches a worker in ``BELLIS_CONTEXT``, encoded
  ``_watchdog``    the thread that ends a block past its timeout, or stalled
  ``_failure``     what a failed attempt says about itself (host, pid, job, log offsets)
  ``_profiling``   per-block measurement (``profile_block``) and the start-up clock
  ``_gpu``         per-block GPU figures from NVML
  ``_stall``       stall detection: is a running block still doing anything?
  ``_walltime``    stop taking blocks before the cluster job's time limit
  ``_shared``      a worker the server moves between tasks of a run (``MOVE``)
  ``_chunkcache``  the decoded-chunk cache of a task's declared inputs (numpy and zarr
                   load when a task declares inputs or outputs, only then)
  ``_chunkwrite``  chunk-aligned writes of declared outputs, encoded and written here
  ``_setup``       ``Task(setup=...)``: entered once per process, its context and teardown

May import: ``plumbing``, ``model``, ``protocol``, ``_outputs``.
Imported by: ``_launchers``, ``_run``, ``_plan``, ``face``, ``_cli``.
The groups are those of ``tests/unit/test_layering.py``'s table, which checks these two
lines (``task`` is ``_task`` and ``_task_params``; ``face`` the public modules).

Nothing here imports numpy at module level (a worker imports numpy only if the user's code
does; see ``tests/integration/test_worker_imports.py``). ``_launchers`` imports it: the fork
server preloads it.
"""
