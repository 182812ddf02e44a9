"""The run's decisions, sans I/O: which block may run, which connection gets it, what
happens when something arrives, ends or runs late.

Owns:
  ``_scheduler``   which block is ready; releases, retries, orphans
  ``_startup``     the scheduler's start: edges checked and wired, first states in bulk
  ``_task_run``    one task's run state: block and task states, counters, store cells
  ``_dispatch``    the :class:`Dispatcher`: events in, instructions out
  ``_returns``     what a returned batch does: backups settle, rows recorded, releases
  ``_lost``        a block or batch lost to its deadline: timed out, stalled, reclaimed
  ``_attempts``    a failed attempt as an error record (``errors.jsonl``)
  ``_instructions``  the instructions out (SendFrame, Close, Launch, Kill, Progress)
  ``_ports``       ``DispatcherPort``: the dispatcher as its helper modules see it
  ``_staffing``    the managed workers: bookings, the restart budget, resources, exits
  ``_records``     the dispatcher's records: Peer, ManagedWorker, TaskRecord, Booking;
                   ``TaskBackups``/``TaskMemory``, what a record holds of the two below
  ``_batching``    batch sizes, and the checks on a returned batch
  ``_deadlines``   when each connection's blocks are due back
  ``_gate``        a plan's sample run: a task's first blocks wait for all its workers
  ``_locality``    ready blocks in Morton order, a coherent stream per connection
  ``_backups``     straggler backups: a second copy, first success wins
  ``_memory``      memory grants: the ladder, and which blocks wait for a big worker
  ``_ladder``      ``MemoryLadder``: a task's grants, smallest first (plain data)
  ``_abandon``     when a task is given up (blocks failing in a row), and what is said
  ``_sharing``     workers shared between tasks: which tasks, and when a worker moves

May import: ``plumbing``, ``model``, ``protocol``, ``_stats``, ``_outputs``, ``task``.
Imported by: ``_run``, ``_plan``, ``face``, ``_cli``.
The groups are those of ``tests/unit/test_layering.py``'s table, which checks these two
lines (``task`` is ``_task`` and ``_task_params``; ``face`` the public modules).

Nothing here reads a clock, a socket, a process or a file: time comes in as an argument
(``tests/unit/test_layering.py`` checks).
"""
