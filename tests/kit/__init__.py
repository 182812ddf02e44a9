"""The shared test kit: helpers every test folder imports as ``kit.<module>`` (pyproject's
``pythonpath = ["tests"]`` puts ``tests/`` on ``sys.path``; worker processes get the
driver's ``sys.path``, so block functions defined here load by reference there too). No
test module imports another: what two of them share lives here.

* ``dispatch``: the dispatcher driven by scripted events on a fake clock (unit tests).
* ``blocks``: block and worker functions that record each attempt in a file, the records
  read back, and 1-D tasks.
* ``procs``: whether a process is alive, waiting for one to go.
* ``launchers``: scenarios every launcher runs alike (``test_dask``, ``test_slurm``,
  ``test_sge``, ``test_batch_standins``), and a launcher driven alone (worker specs whose
  function takes no block, such functions, their exits).
* ``slurm``: whether a SLURM controller takes jobs, a test's jobs by name, command shims.
* ``user_script``: a user's script run in a subprocess, and what it leaves behind (the
  memory ladder's script and its checks among them).
* ``browser``: headless Chromium for the HTML report tests, and the page's network requests.
* ``terminal``: a real terminal (a tmux pane on a private server) for the tests of what a
  user sees on a TTY: progress bars, ``bellis status --watch``.
* ``failing_pipeline``: a user's pipeline script whose blocks fail in known ways (two
  exceptions, a timeout, a block that fails once), for the error records and the report.
"""
