"""daisy 2.0.0's module path ``daisy._subprocess_worker``, kept as a thin alias.

In daisy it is the entry point of a worker subprocess. bellis starts its workers its own
way (``python -m bellis.worker``, :mod:`bellis._worker._main`), so this path only keeps
``import daisy._subprocess_worker`` working under ``bellis as-daisy``: it offers bellis's
two worker loops, a block function's and a worker function's.
"""

from __future__ import annotations

from ._worker._main import (
    run_block_function_loop as run_block_function_loop,
    run_worker_function as run_worker_function,
)

__all__ = ["run_block_function_loop", "run_worker_function"]
