"""A run, with its I/O: the run itself, the distributed loop and serial mode. The public
entry points that start one (``run_blockwise``, ``Server``...) are ``bellis._entrypoints``.

Owns:
  ``_runner``      ``RunSettings``, ``execute()``, ``RunResult``: checks, stores, summary
  ``_options``     ``RunOptions``: ``run_blockwise``'s options, declared once
  ``_server``      the shell around the dispatcher: selectors loop, clock, exits, signals
  ``_transport``   the sockets: accept with the handshake cap, send buffers, orderly close
  ``_pool``        the workers through their launchers: start what was booked, poll, kill
  ``_serial``      serial mode: every block in this process, in dependency order
  ``_shared``      workers shared between tasks: their groups and payloads, at run start
  ``_provenance``  at run start: each task's code fingerprint and ``on_code_change``
  ``_observers``   observers attached to a server (``CLMonitor(server)``)
  ``_progress``    the progress observers (bar, JSON lines)
  ``_summary``     the end-of-run summary, its error groups and the resume notice
  ``_dashboard``   ``run_blockwise(..., dashboard=True)``: the live page during the run

May import: ``plumbing``, ``model``, ``protocol``, ``_tracking``, ``_stats``, ``_outputs``,
``task``, ``_scheduling``, ``_worker``, ``_launchers``, ``_report``.
Imported by: ``_plan``, ``face``, ``_cli``.
The groups are those of ``tests/unit/test_layering.py``'s table, which checks these two
lines (``task`` is ``_task`` and ``_task_params``; ``face`` the public modules).

``_worker``: serial mode runs blocks here; ``_report``: the panel and the live page.
``Pipeline.run_blockwise`` reaches the entry point through :mod:`bellis._seams`.
"""
