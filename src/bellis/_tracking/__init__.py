"""Block tracking: the per-task Zarr v3 group of done flags, failure counts and block stats.

This package sees plain integers and numpy only; the scheduler and runner translate
blocks into tracking cells (:meth:`StoreLayout.tracking_cell`) before calling it.

Owns:
  ``_store``    ``TrackingStore``: open, record, flush; crash-safe chunk writes
  ``_layout``   ``StoreLayout``: the grid, its anchor and the cells; the layout hash
  ``_files``    zarr.json documents, atomic and durable writes, memory-mapped chunk arrays,
                ``outputs.json`` (the declared outputs, for ``bellis verify``)
  ``_disk``     what it asks of its filesystem: reserved chunk blocks, the run lock
  ``_migrate``  a store moved to a grown volume, and recovery from an interrupted move
  ``_codever``  the fingerprint table and the ``code_version`` array: which code made a block
  ``_reset``    done markers cleared under the run lock (``bellis verify --reset``) and
                ``verify.json``, what the last verify found
  ``_status``   ``bellis status``: read-only snapshots, the map, the text

May import: ``plumbing``, ``model``.
Imported by: ``_outputs``, ``task``, ``_report``, ``_run``, ``_plan``, ``face``, ``_cli``.
The groups are those of ``tests/unit/test_layering.py``'s table, which checks these two
lines (``task`` is ``_task`` and ``_task_params``; ``face`` the public modules).
"""

from ._disk import is_run_in_progress, read_lock_holder
from ._files import OUTPUTS_NAME, read_outputs_record, write_outputs_record
from ._layout import NO_WORKER, STAT_ARRAYS, StoreLayout, format_roi, layout_hash
from ._status import (
    SlabReader,
    StatusSnapshot,
    failed_cells,
    format_status,
    read_status,
    render_status,
    status_record,
)
from ._store import TrackingStore, delete_store

__all__ = [
    "NO_WORKER",
    "OUTPUTS_NAME",
    "STAT_ARRAYS",
    "SlabReader",
    "StatusSnapshot",
    "StoreLayout",
    "TrackingStore",
    "delete_store",
    "failed_cells",
    "format_roi",
    "format_status",
    "is_run_in_progress",
    "layout_hash",
    "read_lock_holder",
    "read_outputs_record",
    "read_status",
    "render_status",
    "status_record",
    "write_outputs_record",
]
