"""The worker process: what runs beside the user's block function.

Owns:
  ``_main``        the entry point of a worker process (``python -m bellis._worker._main``)
  ``_client``      ``Client`` and ``Context``: the worker's side of the protocol
  ``_watchdog``    the thread that ends a block past its timeout, or stalled
  ``_failure``     what a failed attempt says about itself (host, pid, job, log offsets)
  ``_profiling``   per-block measurement (``profile_block``) and the start-up clock
  ``_gpu``         per-block GPU figures from NVML
  ``_stall``       stall detection: is a running block still doing anything?
  ``_walltime``    stop taking blocks before the cluster job's time limit

May import: the plumbing, the model and ``_protocol``, and nothing that imports numpy at
module level (a worker imports numpy only if the user's code does; see
``tests/integration/test_worker_imports.py``).

Must never be imported by: the model, ``_scheduling``, ``_tracking``, ``_stats`` or
``_report``. ``_launchers`` (the fork server preloads it), ``_run`` (serial mode) and the
public face may.
"""
