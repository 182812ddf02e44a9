"""Planning a run before paying for it: ``bellis.plan``, ``run_blockwise(dry_run=True)`` and
``bellis plan -- python script.py`` (docs/plan.md).

Owns:
  ``_model``     ``Plan`` and ``TaskOutlook``: what a plan says, its table and its JSON
  ``_dry``       the dry run: counts from the scheduler's own bulk initialisation over the
                 tracking stores opened read-only; no user code runs, nothing is written
  ``_simulate``  a pure discrete-event simulation of a run's schedule (levels,
                 dependencies, worker start) from per-block costs
  ``_costs``     which blocks a sample takes, and what each block left costs from the
                 sample's measurements (pure numpy)
  ``_forecast``  the sampled forecast: a sample of blocks really runs, and its figures feed
                 the simulation, the memory percentiles and the warnings
  ``_script``    planning switched on for a whole script (``BELLIS_PLAN``): each
                 ``run_blockwise`` call plans instead of running
  ``_api``       ``bellis.plan()``, and what the entry points route here: a dry run
                 (``plan_run``) and a run under ``bellis plan`` (``planned_states``)

May import: ``plumbing``, ``model``, ``protocol``, ``_tracking``, ``_stats``, ``_outputs``,
``task``, ``_scheduling``, ``_worker``, ``_launchers``, ``_report``, ``_run``.
Imported by: ``face``, ``_cli``.
The groups are those of ``tests/unit/test_layering.py``'s table, which checks these two
lines (``task`` is ``_task`` and ``_task_params``; ``face`` the public modules).

It uses ``_run``'s public names only (``RunSettings``, ``execute``, ``RunResult``);
``bellis._entrypoints``, above both, routes a call to one or the other.
"""
