"""The ``bellis`` command (``bellis._cli._main:main``, also ``python -m bellis``).

Owns:
  ``_main``   the parser and the subcommands: ``demo``, ``worker``, ``status``, ``report``,
              ``serve``, ``as-daisy``
  ``_demo``   ``bellis demo``: a real two-task pipeline on a synthetic zarr volume
  ``_watch``  ``bellis status PATH --watch``: the status redrawn while a run goes
  ``_errors`` ``bellis status PATH --failed`` and ``--block 3,7,2``: the error records
  ``_serve``  ``bellis serve PATH...``: the live page of a run, from its stores

May import: ``plumbing``, ``model``, ``protocol``, ``_tracking``, ``_stats``, ``_outputs``,
``task``, ``_scheduling``, ``_worker``, ``_launchers``, ``_report``, ``_run``, ``_plan``,
``face``.
Imported by: ``entry``.
The groups are those of ``tests/unit/test_layering.py``'s table, which checks these two
lines (``task`` is ``_task`` and ``_task_params``; ``face`` the public modules).

The demo is a user of ``import bellis``.
"""
