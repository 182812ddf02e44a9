"""Block tracking: the per-task Zarr v3 group of done flags, failure counts and block stats.

This package sees plain integers and numpy only; the scheduler and runner translate
blocks into tracking cells (:meth:`StoreLayout.tracking_cell`) before calling it.
"""

from ._layout import NO_WORKER, STAT_ARRAYS, StoreLayout, layout_hash
from ._status import failed_cells, format_status
from ._store import TrackingStore, delete_store

__all__ = [
    "NO_WORKER",
    "STAT_ARRAYS",
    "StoreLayout",
    "TrackingStore",
    "delete_store",
    "failed_cells",
    "format_status",
    "layout_hash",
]
