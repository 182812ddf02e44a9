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

May import: the plumbing (``errors``), the model (``_graph``) and ``_tracking`` (``_verify``
reads and resets stores). Opens zarr arrays to read their metadata when a task is built,
and their data only to verify it. Must never be imported by: the plumbing, the model,
``_protocol``, ``_tracking``, ``_stats`` or ``_launchers``; ``_task``, ``_scheduling`` and
``_run`` use it, and ``_worker`` imports ``_readback`` only when its task verifies outputs
(numpy and zarr come with it, then only).
"""
