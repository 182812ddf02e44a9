"""Block tracking: the per-task Zarr v3 group of done flags, failure counts and block stats.

This package sees plain integers and numpy only; the scheduler and runner translate
blocks into tracking cells (:meth:`StoreLayout.tracking_cell`) before calling it.

It is the only owner of the done markers: the rest of the package reaches a store through
``bellis._donemarks`` (``BlockStore``, ``StoreBackend``) and the functions below, and
never opens the arrays itself.

Owns:
  ``_backends`` which kind of store a path holds: ``store_exists``, ``is_store``,
                ``find_stores``, ``open_readonly``, ``open_store``, ``delete_store``,
                ``backend_for`` (local directories and ``s3://`` URLs)
  ``_store``    ``TrackingStore``: the open store's arrays, record, flush; crash-safe
                chunk writes
  ``_opening``  opening a store: its group against the layout (reuse, migrate, refuse),
                its arrays checked and mapped, writable or read-only
  ``_layout``   ``StoreLayout``: the grid, its anchor and the cells; the layout hash
  ``_files``    zarr.json documents, atomic and durable writes, memory-mapped chunk arrays,
                ``outputs.json`` (the declared outputs, for ``bellis verify``)
  ``_disk``     what it asks of its filesystem: reserved chunk blocks, the run lock
  ``_migrate``  a store moved to a grown volume, and recovery from an interrupted move
  ``_codever``  the fingerprint table and the ``code_version`` array: which code made a block
  ``_reset``    done markers cleared under the run lock (``bellis verify --reset``) and
                ``verify.json``, what the last verify found
  ``_status``   ``bellis status``: read-only snapshots, the map, the text
  ``_s3``       stores at ``s3://`` URLs: in the driver's memory, flushed with conditional
                writes, the lock a lease object (docs/cloud.md)
  ``_s3io``     the requests of an S3 store (``Bucket``: retries, conditional writes)
                and its lease lock (``S3Lock``)
  ``_s3http``   who makes the requests: bellis's own SigV4 client (``LeanS3``) where
                the AWS configuration is plain; ``_s3boto``: botocore elsewhere
  ``_s3open``   opening an S3 store: the lock with the first read, the rest at once
  ``_s3stats``  an S3 store's per-block statistics: one object per flush, merged by the
                readers
  ``_s3objects`` an S3 store's ``outputs.json`` and ``verify.json``, one object each

May import: ``plumbing``, ``model``.
Imported by: ``_stats``, ``_outputs``, ``task``, ``_report``, ``_run``, ``_plan``, ``face``,
``_cli``.
The groups are those of ``tests/unit/test_layering.py``'s table, which checks these two
lines (``task`` is ``_task`` and ``_task_params``; ``face`` the public modules).
"""

from ._backends import (
    backend_for,
    delete_store,
    find_stores,
    is_run_in_progress,
    is_store,
    lease_holder,
    open_readonly,
    open_store,
    read_lock_holder,
    record_outputs,
    store_exists,
)
from ._files import OUTPUTS_NAME, read_outputs_record, write_outputs_record
from ._layout import NO_WORKER, STAT_ARRAYS, StoreLayout, format_roi, layout_hash
from ._s3 import is_s3_url, s3_url
from ._status import (
    SlabReader,
    StatusSnapshot,
    failed_cells,
    format_status,
    read_status,
    render_status,
    status_record,
)
from ._store import TrackingStore

__all__ = [
    "NO_WORKER",
    "OUTPUTS_NAME",
    "STAT_ARRAYS",
    "SlabReader",
    "StatusSnapshot",
    "StoreLayout",
    "TrackingStore",
    "backend_for",
    "delete_store",
    "failed_cells",
    "find_stores",
    "format_roi",
    "format_status",
    "is_run_in_progress",
    "is_s3_url",
    "is_store",
    "layout_hash",
    "lease_holder",
    "open_readonly",
    "open_store",
    "read_lock_holder",
    "read_outputs_record",
    "read_status",
    "record_outputs",
    "render_status",
    "s3_url",
    "status_record",
    "store_exists",
    "write_outputs_record",
]
