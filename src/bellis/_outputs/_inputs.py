"""Declared inputs: ``Task(inputs=[...], input_cache_bytes=...)``, read once into plain values.

``inputs`` mirrors ``outputs`` (:mod:`._declared`): zarr arrays (v3, or v2), paths to them,
and funlib.persistence ``Array``s, each read into an :class:`~._units.OutputSpec` with the
same voxel mapping. What a declaration buys is the worker's decoded-chunk cache
(``bellis._worker._chunkcache``): a read of a declared input inside a block is served from
the chunks the worker already decoded, plus the ones it lacks.

An input that a task of the run declares as an *output* is cached only where that is
provably safe (:func:`plan_inputs`, "Upstream outputs read downstream" below); otherwise a
chunk of it may be rewritten while the run goes on, a worker must never serve it stale,
and its reads go to zarr. :func:`wire_inputs` marks the inputs for the workers (and
serial mode).

Upstream outputs read downstream
--------------------------------
An array ``A`` that tasks ``W1..Wn`` of the run declare as an output is *cacheable* for a
task ``D`` that declares it as an input when

(a) every ``Wi`` is a *direct* upstream task of ``D`` (an edge ``Wi -> D``; ``D`` itself
    not among them), and
(b) every ``Wi``'s write ROIs are chunk-aligned for ``A``: each chunk of ``A`` that a
    block of ``Wi`` writes lies inside that block's write ROI (or is cut off by the
    array's end), so exactly one block of ``Wi`` writes it, whole
    (:func:`~._units.owns_units` on the chunks, shards aside).

Why a chunk ``C`` that a block ``d`` of ``D`` reads is then final when ``d`` runs: ``d``
reads ``C`` because ``d``'s read ROI meets ``C``. If a block ``w`` of some ``Wi`` writes
into ``C``, then by (b) ``C`` lies inside ``w``'s write ROI, so ``w``'s write ROI meets
``d``'s read ROI, and by (a) the edge ``Wi -> D`` makes ``d`` wait for ``w``
(``_graph.InterTaskEdge``: a downstream block depends on every upstream block whose write
ROI meets its read ROI). By (b) no other block of ``Wi`` writes ``C``, and by (a) no task
outside the ``Wi`` does: every write ``C`` will ever get is done before ``d`` is
dispatched. A chunk no block writes holds what it held before the run. So whichever
worker keeps ``C`` (read for any block of a task for which ``A`` is cacheable) keeps its
final bytes.

*Write-through* (``WRITE_THROUGH``): where ``A`` is cacheable for some task and exactly
one task ``W`` writes it, ``W``'s workers keep the whole chunks of ``A`` that a block
writes through ``[]=``, committed when the block function returns without error
(``_worker._chunkcache``): by (b) that block is the only writer of those chunks, so its
bytes are final once it has succeeded. With two writer tasks a chunk's bytes from the
first may be rewritten by the second on another worker, so there is no write-through.

What breaks the argument, and what bellis does about it:

* a block function that reads outside its ``read_roi``: the dependency covers only the
  read ROI, so such a read may see (and cache) a chunk before its writer has run. This
  is the same promise the scheduler already relies on for correctness without a cache
  (daisy's contract); bellis cannot see the read and does not check it.
* a block function that is not idempotent on its write ROI, run with straggler backups
  (``Task(speculative=True)`` or ``backup_after=``): the losing copy may rewrite a chunk
  after the winner's block was reported done and the downstream block read it. The
  losing copy's worker is killed (its cache with it, nothing committed), but the chunk on
  disk and in other workers' caches may then differ. Backups already require idempotent
  block functions (docs/failures.md); with an idempotent function both copies write the
  same bytes.
* an array written by a task that does not declare it as an output: not known to be
  written (the user's risk, as before: declare it, or leave it out of ``inputs``).

Where (a) or (b) fails the array stays bypassed: its reads go to zarr.

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
    "CACHE_READS",
    "WRITE_THROUGH",
    "array_location",
    "declare_inputs",
    "parse_input_cache_bytes",
    "plan_inputs",
    "run_outputs",
    "wire_inputs",
]

#: flags of a wired input (``(store, path, flags)``): reads served from the cache
CACHE_READS = 1
#: whole chunks that this task's blocks write are kept at block success (write-through)
WRITE_THROUGH = 2


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
    specs: Sequence[OutputSpec],
    written: Iterable[tuple[str, str]],
    cacheable: Iterable[str] = (),
) -> list[tuple[str, str, int]]:
    """The inputs as a worker gets them: ``(store, array path, flags)`` each, where
    ``flags`` is :data:`CACHE_READS` for an array that ``written`` (the run's declared
    outputs, ``OutputSpec.key``s) does not name, or that ``cacheable`` (the
    :func:`array_location`s that :func:`plan_inputs` proved safe for this task) names,
    else 0."""
    out = {array_location(s, p) for s, p in written}
    safe = set(cacheable)
    wired = []
    for spec in specs:
        where = array_location(spec.store, spec.path)
        ok = where not in out or where in safe
        wired.append((spec.store, spec.path, CACHE_READS if ok else 0))
    return wired


def run_outputs(tasks: Iterable[Any]) -> tuple[tuple[str, str], ...]:
    """The declared outputs of every task of a run (``OutputSpec.key`` each): the arrays
    the run writes, which a worker caches as an input only where :func:`plan_inputs`
    proves it safe."""
    return tuple(spec.key for t in tasks for spec in t.outputs)


def plan_inputs(
    tasks: Sequence[Any], edges: Iterable[tuple[str, str]]
) -> dict[str, list[tuple[str, str, int]]]:
    """Per task id, what its workers get as ``inputs`` (``(store, path, flags)`` each):
    its declared inputs (:func:`wire_inputs`, with an upstream output cacheable where
    rules (a) and (b) of the module docstring hold), then, for a task that is the one
    writer of an array cacheable for some task, that array with :data:`WRITE_THROUGH`
    (or'ed into its own entry when it also declares it as an input).

    ``tasks``: objects with ``task_id``, ``geom`` (a ``TaskGeometry``), ``inputs`` and
    ``outputs`` (``OutputSpec``s); ``edges``: ``(upstream id, downstream id)`` pairs."""
    from ._units import owns_units

    direct = set(edges)
    writers: dict[str, list[tuple[Any, OutputSpec]]] = {}
    for t in tasks:
        for spec in t.outputs:
            writers.setdefault(array_location(spec.store, spec.path), []).append((t, spec))
    aligned: dict[tuple[str, str], bool] = {}

    def owns_chunks(t: Any, spec: OutputSpec) -> bool:
        key = (t.task_id, array_location(spec.store, spec.path))
        if key not in aligned:
            aligned[key] = owns_units(t.geom, spec._replace(shards=None))
        return aligned[key]

    plan: dict[str, list[tuple[str, str, int]]] = {}
    through: dict[str, list[OutputSpec]] = {}  # writer task id -> its write-through arrays
    kept: set[str] = set()
    for d in tasks:
        wired = []
        for spec in d.inputs:
            where = array_location(spec.store, spec.path)
            ws = writers.get(where, [])
            ok = all(
                w.task_id != d.task_id and (w.task_id, d.task_id) in direct and owns_chunks(w, ws_)
                for w, ws_ in ws
            )
            wired.append((spec.store, spec.path, CACHE_READS if ok else 0))
            if ok and len(ws) == 1 and where not in kept:
                kept.add(where)
                through.setdefault(ws[0][0].task_id, []).append(ws[0][1])
        plan[d.task_id] = wired
    for t in tasks:
        wired = plan.setdefault(t.task_id, [])
        for spec in through.get(t.task_id, []):
            where = array_location(spec.store, spec.path)
            for i, (st, pth, flags) in enumerate(wired):
                if array_location(st, pth) == where:
                    wired[i] = (st, pth, flags | WRITE_THROUGH)
                    break
            else:
                wired.append((spec.store, spec.path, WRITE_THROUGH))
    return plan
