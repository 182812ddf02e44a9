"""Declared inputs: ``Task(inputs=[...], input_cache_bytes=...)``, read once into plain values.

``inputs`` mirrors ``outputs`` (:mod:`._declared`): zarr arrays (v3, or v2), paths to them,
and funlib.persistence ``Array``s, each read into an :class:`~._units.OutputSpec` with the
same voxel mapping. What a declaration buys is the worker's decoded-chunk cache
(``bellis._worker._chunkcache``): a read of a declared input inside a block is served from
the chunks the worker already decoded, plus the ones it lacks.

An input that any task of the run declares as an *output* is never cached: a chunk of it
may be rewritten while the run goes on, and a worker must never serve it stale.
:func:`wire_inputs` marks such inputs for the workers (and serial mode).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

from .._graph import TaskGeometry
from .._sizes import parse_size
from ..errors import ConfigurationError
from ._declared import resolve_output
from ._units import OutputSpec

__all__ = ["declare_inputs", "parse_input_cache_bytes", "run_outputs", "wire_inputs"]


def declare_inputs(geom: TaskGeometry, inputs: Any) -> tuple[OutputSpec, ...]:
    """``inputs`` as specs (``()`` for None); a ConfigurationError naming ``inputs[i]``
    and the value for one that is not a zarr array, a path to one or a funlib Array."""
    if inputs is None:
        return ()
    if isinstance(inputs, str | os.PathLike) or not isinstance(inputs, Sequence):
        inputs = [inputs]
    return tuple(resolve_output(o, geom.dims, i, "inputs") for i, o in enumerate(inputs))


def parse_input_cache_bytes(value: Any) -> int | None:
    """``input_cache_bytes``: None (the default, derived from each worker's memory
    limit), 0 (no cache), a number of bytes or a size such as ``"256M"``."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ConfigurationError(
                f"input_cache_bytes={value!r} must not be negative: pass a number of bytes, "
                "a size such as '256M', 0 to turn the input cache off, or None for the "
                "default (a quarter of the worker's memory limit, else 256M)",
                parameter="input_cache_bytes",
            )
        return value
    if isinstance(value, str) and value.strip() == "0":
        return 0
    if isinstance(value, str):
        return parse_size(value, "input_cache_bytes")
    raise ConfigurationError(
        f"input_cache_bytes={value!r} is not a size: pass a number of bytes, a size such "
        "as '256M', 0 to turn the input cache off, or None for the default",
        parameter="input_cache_bytes",
    )


def _abs_store(store: str) -> str:
    return store if "://" in store else os.path.abspath(store)


def wire_inputs(
    specs: Sequence[OutputSpec], written: Iterable[tuple[str, str]]
) -> list[tuple[str, str, bool]]:
    """The inputs as a worker gets them: ``(store, array path, cacheable)`` each, where
    ``cacheable`` is False for an array that ``written`` (the run's declared outputs,
    ``OutputSpec.key``s) names."""
    out_keys = {(_abs_store(s).rstrip("/"), p.strip("/")) for s, p in written}
    wired = []
    for spec in specs:
        store = _abs_store(spec.store).rstrip("/")
        path = spec.path.strip("/")
        wired.append((store, path, (store, path) not in out_keys))
    return wired


def run_outputs(tasks: Iterable[Any]) -> tuple[tuple[str, str], ...]:
    """The declared outputs of every task of a run (``OutputSpec.key`` each): the arrays
    the run writes, which no worker caches as an input."""
    return tuple(spec.key for t in tasks for spec in t.outputs)
