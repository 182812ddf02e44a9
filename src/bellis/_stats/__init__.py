"""What a run cost: running aggregates, the run reports and ``runs.jsonl``.

Owns:
  ``_aggregates``   Welford mean/std and trends in O(1) memory; per-task block aggregates
  ``_reports``      ``TaskReport``, ``RunReport``, ``BlockRecord``, ``WorkerRecord``, ``Stat``
  ``_runlog``       ``runs.jsonl``: append one run line, read the last one, the schema
  ``_timeline``     the lifecycle phases of managed workers, stamped by the server
  ``_report_load``  where a task's last report lives, for ``task.report()``
  ``_errorlog``     ``errors.jsonl``: the bounded error records of failed attempts
  ``_errorgroups``  ``ErrorCollector``: each task's failed attempts grouped by distinct error
  ``_forecast_score``  a forecast left in a store, scored by the next run (its run line)

May import: ``plumbing``, ``model``, ``_tracking``.
Imported by: ``task``, ``_scheduling``, ``_report``, ``_run``, ``_plan``, ``face``,
``_cli``.
The groups are those of ``tests/unit/test_layering.py``'s table, which checks these two
lines (``task`` is ``_task`` and ``_task_params``; ``face`` the public modules).

A report's views (panel, page, notebook) live in ``_report``, above this folder, and are
reached through :mod:`bellis._seams`.
"""
