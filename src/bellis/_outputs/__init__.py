"""Declared outputs: ``Task(outputs=[...], write_safety=...)``.

Owns:
  ``_units``     write units: which shard (or chunk) indices a block's write ROI touches,
                 how far apart two blocks may be and still share one, the error text
  ``_declared``  outputs read into plain values (zarr v3 arrays, paths, funlib-like
                 arrays; the voxel mapping), the task's own check, ``outputs.json``
  ``_readback``  ``verify_outputs``: a block's outputs read back and checksummed (the
                 worker, serial mode and ``bellis verify``)
  ``_verify``    ``bellis verify`` / ``Task.verify()``: every done block's outputs re-read
                 in parallel and compared; ``--reset`` and the blocks downstream
  ``_inputs``    declared inputs (``Task(inputs=..., input_cache_bytes=...)``), read like
                 outputs, and which of them a worker may cache

May import: ``plumbing``, ``model``, ``_tracking``.
Imported by: ``task``, ``_scheduling``, ``_worker``, ``_run``, ``_plan``, ``face``,
``_cli``.
The groups are those of ``tests/unit/test_layering.py``'s table, which checks these two
lines (``task`` is ``_task`` and ``_task_params``; ``face`` the public modules).

Opens zarr arrays to read their metadata when a task is built, and their data only to verify
it; ``_worker`` imports ``_readback`` only when its task verifies outputs (numpy and zarr
come with it, then only).
"""
