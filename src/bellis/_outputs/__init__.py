"""Declared outputs: ``Task(outputs=[...], write_safety=...)``.

Owns:
  ``_units``     write units: which shard (or chunk) indices a block's write ROI touches,
                 how far apart two blocks may be and still share one, the error text
  ``_declared``  outputs read into plain values (zarr v3 arrays, paths, funlib-like
                 arrays; the voxel mapping), the task's own check, ``outputs.json``

May import: the plumbing (``errors``) and the model (``_graph``). Opens zarr arrays to read
their metadata only, when a task is built. Must never be imported by: the plumbing, the
model, ``_protocol``, ``_tracking``, ``_stats``, ``_worker`` or ``_launchers``; ``_task``,
``_scheduling`` and ``_run`` use it.
"""
