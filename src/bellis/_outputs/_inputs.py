"""Declared inputs: ``Task(inputs=[...], input_cache_bytes=...)``, read once into plain values.

``inputs`` mirrors ``outputs`` (:mod:`._declared`): zarr arrays (v3, or v2), paths to them,
and funlib.persistence ``Array``s, each read into an :class:`~._units.OutputSpec` with the
same voxel mapping. What a declaration buys is the worker's decoded-chunk cache
(``bellis._worker._chunkcache``): a read of a declared input inside a block is served from
the chunks the worker already decoded, plus the ones it lacks.

An input that any task of the run declares as an *output* is never cached: a chunk of it
may be rewritten while the run goes on, and a worker must never serve it stale.
:func:`wire_inputs` marks such inputs for the workers (and serial mode).

A worker imports this module (for :func:`array_location`): it loads neither numpy nor zarr.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .._sizes import parse_size
from ..errors import ConfigurationError

if TYPE_CHECKING:
    from .._graph import TaskGeometry
    from ._units import OutputSpec

__all__ = [
    "array_location",
    "declare_inputs",
    "parse_input_cache_bytes",
    "run_outputs",
    "wire_inputs",
]


def declare_inputs(geom: TaskGeometry, inputs: Any) -> tuple[OutputSpec, ...]:
    """``inputs`` as specs (``()`` for None); a ConfigurationError naming ``inputs[i]``
    and the value for one that is not a zarr array, a path to one or a funlib Array."""
    if inputs is None:
        return ()
    from ._declared import resolve_output

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


def array_location(store: str, path: str) -> str:
    """Where an array lives, one string whichever way it was opened (its store and its path
    in it, or a group's store and the path below): a local store's absolute path joined
    with the array path, else the store's URL and the path."""
    path = path.strip("/")
    if "://" in store:
        return store.rstrip("/") + ("/" + path if path else "")
    return os.path.normpath(os.path.join(os.path.abspath(store), path))


def wire_inputs(
    specs: Sequence[OutputSpec], written: Iterable[tuple[str, str]]
) -> list[tuple[str, str, bool]]:
    """The inputs as a worker gets them: ``(store, array path, cacheable)`` each, where
    ``cacheable`` is False for an array that ``written`` (the run's declared outputs,
    ``OutputSpec.key``s) names."""
    out = {array_location(s, p) for s, p in written}
    return [
        (spec.store, spec.path, array_location(spec.store, spec.path) not in out) for spec in specs
    ]


def run_outputs(tasks: Iterable[Any]) -> tuple[tuple[str, str], ...]:
    """The declared outputs of every task of a run (``OutputSpec.key`` each): the arrays
    the run writes, which no worker caches as an input."""
    return tuple(spec.key for t in tasks for spec in t.outputs)
