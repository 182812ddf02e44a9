"""How worker processes start, end and are watched: local, batch systems and Dask.

Owns:
  ``_base``        ``WorkerLauncher``, ``LocalLauncher``, ``WorkerSpec``, ``WorkerHandle``
  ``_gpus``        which GPU(s) each local worker sees (``CUDA_VISIBLE_DEVICES``)
  ``_zygote``      the fork server for local workers
  ``_exits``       event-driven exit detection for local workers (pidfds, one epoll fd)
  ``_batch``       the batch-system core: one job (or array task) per worker; dialects
                   say how to submit, query, cancel and read a job's end
  ``_batch_text``  the text every batch system shares: names, array ranges, time limits
  ``_slurm``       ``SlurmLauncher``: one ``sbatch`` job (or array task) per worker
  ``_lsf``         ``LsfLauncher``: one ``bsub`` job (or array element) per worker
  ``_pbs``         ``PbsLauncher``: one ``qsub`` job (or subjob) per worker
  ``_sge``         ``SgeLauncher``: one Grid Engine ``qsub`` job (or array task) per worker
  ``_slurm_text``  the text SLURM reads and writes: names, sizes, limits, exit states
  ``_dask``        ``DaskLauncher``: one long-lived Dask task per worker
  ``_net``         which address the server advertises to workers on other machines

A launcher never sees a block: it starts workers that connect back over TCP, reports how
they ended, and stops them.

May import: ``plumbing``, ``model``, ``protocol``, ``_worker``.
Imported by: ``_run``, ``_plan``, ``face``, ``_cli``.
The groups are those of ``tests/unit/test_layering.py``'s table, which checks these two
lines (``task`` is ``_task`` and ``_task_params``; ``face`` the public modules).
"""
