"""Declared outputs: ``Task(outputs=[...], write_safety=...)``, read once into plain values.

``outputs`` takes zarr v3 arrays, paths to them, and funlib.persistence ``Array``s (duck
typed: an object with ``voxel_size`` and ``offset`` whose ``data``, or ``_source_data``, is
a zarr array; funlib is not a dependency). An array on S3 is one opened through zarr's
``FsspecStore`` over s3fs, or its ``s3://bucket/key.zarr`` URL (docs/cloud.md). Each becomes an
:class:`~bellis._units.OutputSpec`: the store and array path, shapes, the voxel mapping.
World units map to voxels by funlib's ``voxel_size``/``offset``, else the array's
``voxel_size``/``offset`` attributes, else OME-Zarr's scale and translation of the
multiscales dataset the array is, else 1:1.

The write-safety check of one task runs here, at construction, so a bad configuration
fails before any run starts; the check between tasks runs when a pipeline is scheduled
(``_scheduling/_scheduler``). The record a tracking group keeps of its task's outputs
(``outputs.json``, :func:`outputs_record`) is what a later ``bellis verify`` reads.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from .._graph import TaskGeometry
from ..errors import ConfigurationError
from ._units import WRITE_SAFETY, OutputSpec, share_distances, sharing_message

logger = logging.getLogger("bellis")

__all__ = [
    "OUTPUTS_RECORD_VERSION",
    "declare_outputs",
    "downstream_record",
    "outputs_record",
    "resolve_output",
    "store_of",
]

#: the ``version`` of ``outputs.json``; a reader refuses a later one
OUTPUTS_RECORD_VERSION = 1


def _zarr_array_of(obj: Any) -> Any:
    """The zarr array behind ``obj`` (a zarr array, or a funlib-like ``Array``), else None."""
    import zarr

    if isinstance(obj, zarr.Array):
        return obj
    for name in ("_source_data", "data"):
        inner = getattr(obj, name, None)
        if isinstance(inner, zarr.Array):
            return inner
    return None


def _numbers(values: Any) -> tuple[int | float, ...] | None:
    try:
        return tuple(int(v) if float(v).is_integer() else float(v) for v in values)
    except (TypeError, ValueError):
        return None


def _ome_mapping(arr: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]] | None:
    """OME-Zarr's scale and translation of ``arr`` when its parent group's multiscales
    name it as a dataset (one metadata read); None otherwise."""
    import zarr

    path = arr.path.strip("/")
    parent, _, name = path.rpartition("/")
    try:
        attrs: dict[str, Any] = dict(zarr.open_group(arr.store, path=parent, mode="r").attrs)
    except (OSError, KeyError, ValueError, TypeError) as exc:  # zarr's errors are ValueErrors
        # no readable parent group: not OME-Zarr, so the 1:1 or attribute mapping stands;
        # say so, since a wrong mapping would size the write units wrongly
        logger.info("output %s: no OME-Zarr parent group (%s); not using its scale", path, exc)
        return None
    multiscales = attrs.get("multiscales") or (attrs.get("ome") or {}).get("multiscales")
    for ms in multiscales or []:
        for ds in ms.get("datasets", []):
            if str(ds.get("path", "")).strip("/") != name:
                continue
            scale = translation = None
            for t in ds.get("coordinateTransformations", []):
                if t.get("type") == "scale":
                    scale = t.get("scale")
                elif t.get("type") == "translation":
                    translation = t.get("translation")
            if scale is None:
                return None
            return tuple(scale), tuple(translation or [0] * len(scale))
    return None


def _need_s3fs(where: str, url: str, parameter: str) -> None:
    """A ConfigurationError naming ``where`` when zarr cannot open ``s3://`` URLs here."""
    try:
        import s3fs  # noqa: F401
    except ImportError:
        raise ConfigurationError(
            f"{where}={url!r} is on S3, and zarr opens S3 URLs through s3fs, which is not "
            "installed; install it with pip install 'bellis[s3]'",
            parameter=parameter,
        ) from None


def store_of(store: Any) -> str:
    """Where a zarr store is, as every process of the run can open it again: a local
    store by its absolute path (``outputs.json`` must name the array wherever ``bellis
    verify`` runs from, not relative to the directory the task ran in), a store on S3
    (zarr's ``FsspecStore`` over s3fs) as ``s3://bucket/key``. Only the location: the
    endpoint and credentials that opened it are never recorded, each process takes them
    from its own AWS configuration (docs/cloud.md)."""
    root = getattr(store, "root", None)
    if root is not None:
        return str(os.path.abspath(os.fspath(root)))
    fs = getattr(store, "fs", None)
    protocol = getattr(fs, "protocol", None)
    protocols = (protocol,) if isinstance(protocol, str) else tuple(protocol or ())
    if fs is not None and ("s3" in protocols or "s3a" in protocols):
        return "s3://" + str(getattr(store, "path", "")).strip("/")
    return str(store)


def resolve_output(obj: Any, dims: int, index: int, parameter: str = "outputs") -> OutputSpec:
    """``outputs[index]`` of a task with ``dims`` spatial dimensions, as an OutputSpec
    (``parameter="inputs"``: ``inputs[index]``, which may be a zarr v2 array too)."""
    import zarr

    where = f"{parameter}[{index}]"
    what = "an output" if parameter == "outputs" else "an input"
    arr = _zarr_array_of(obj)
    mapping = "1:1"
    if arr is None and isinstance(obj, str | os.PathLike):
        if os.fspath(obj).startswith("s3://"):
            _need_s3fs(where, os.fspath(obj), parameter)
        try:
            arr = zarr.open_array(os.fspath(obj), mode="r")
        except Exception as exc:
            raise ConfigurationError(
                f"{where}={os.fspath(obj)!r} is not a zarr array that can be opened ({exc}); "
                "create the array before the task, or pass the array itself",
                parameter=parameter,
            ) from exc
    if arr is None:
        raise ConfigurationError(
            f"{where}={obj!r} is not {what}: pass a zarr array, the path of one, or a "
            "funlib.persistence Array",
            parameter=parameter,
        )
    if parameter == "outputs" and arr.metadata.zarr_format != 3:
        raise ConfigurationError(
            f"{where} is a zarr v{arr.metadata.zarr_format} array; declared outputs must "
            "be zarr v3 arrays (write safety reads their shard and chunk shapes)",
            parameter="outputs",
        )
    vs = off = None
    if hasattr(obj, "voxel_size") and arr is not obj:
        vs = _numbers(obj.voxel_size)
        off = _numbers(getattr(obj, "offset", None) or [0] * len(vs or ()))
        mapping = "funlib"
    if vs is None:
        attrs = dict(arr.attrs)
        if "voxel_size" in attrs:
            vs = _numbers(attrs["voxel_size"])
            off = _numbers(attrs.get("offset", [0] * len(vs or ())))
            mapping = "attributes"
    if vs is None:
        ome = _ome_mapping(arr)
        if ome is not None:
            vs, off = _numbers(ome[0]), _numbers(ome[1])
            if vs is not None and len(vs) > dims:  # OME lists channel axes too
                vs, off = vs[-dims:], (off or ())[-dims:]
            mapping = "ome-zarr"
    if vs is None:
        vs, off, mapping = (1,) * dims, (0,) * dims, "1:1"
    if off is None or len(off) != len(vs):
        off = (0,) * len(vs)
    shape = tuple(int(s) for s in arr.shape)
    if len(vs) != dims or len(shape) < dims or any(v <= 0 for v in vs):
        raise ConfigurationError(
            f"{where} ({arr.store}/{arr.path}) has shape {list(shape)} and voxel size "
            f"{list(vs)} ({mapping}), which does not fit the task's {dims} dimensions: the "
            f"last axes of {what} are the task's axes, one positive voxel size each",
            parameter=parameter,
        )
    return OutputSpec(
        store=store_of(arr.store),
        path=arr.path,
        shape=shape,
        chunks=tuple(int(c) for c in arr.chunks),
        shards=None if getattr(arr, "shards", None) is None else tuple(int(s) for s in arr.shards),
        voxel_size=vs,
        offset=off,
        dtype=str(arr.dtype),
        mapping=mapping,
    )


def _rebuild(geom: TaskGeometry, unit_stride: tuple[int, ...]) -> TaskGeometry:
    """``geom`` with conflict levels at least ``unit_stride`` blocks wide."""
    from funlib.geometry import Roi

    zero = (0,) * geom.dims
    return TaskGeometry(
        geom.task_id,
        Roi(geom.total_offset, geom.total_shape),
        Roi(zero, geom.read_shape),
        Roi(geom.ctx_ul, geom.write_shape),
        fit=geom.fit,
        read_write_conflict=geom.read_write_conflict,
        unit_stride=unit_stride,
    )


def declare_outputs(
    geom: TaskGeometry, outputs: Any, write_safety: Any
) -> tuple[tuple[OutputSpec, ...], str, TaskGeometry, tuple[OutputSpec, ...]]:
    """Validate ``outputs`` and ``write_safety`` and check the task's own blocks.

    Returns the specs, the write safety, the geometry the task runs with (with wider
    conflict levels under ``serialize`` when blocks share units) and the outputs whose
    units its blocks share. Raises ConfigurationError under ``error`` when they share one.
    """
    if write_safety not in WRITE_SAFETY:
        raise ConfigurationError(
            f"write_safety={write_safety!r} is not a write safety; use 'error' (refuse blocks "
            "that share a shard or chunk of a declared output), 'serialize' (never run two "
            "of them at once) or 'off'",
            parameter="write_safety",
        )
    if outputs is None:
        return (), write_safety, geom, ()
    if isinstance(outputs, str | os.PathLike) or not isinstance(outputs, Sequence):
        outputs = [outputs]
    specs = tuple(resolve_output(o, geom.dims, i) for i, o in enumerate(outputs))
    shared = []
    stride = [1] * geom.dims
    for spec in specs:
        dist = share_distances(geom, spec)
        if any(dist):
            shared.append(spec)
            stride = [max(s, d + 1) for s, d in zip(stride, dist, strict=True)]
            if write_safety == "error":
                raise ConfigurationError(
                    sharing_message(geom.task_id, geom, spec), parameter="write_safety"
                )
    if shared and write_safety == "serialize":
        geom = _rebuild(geom, tuple(stride))
    return specs, write_safety, geom, tuple(shared)


def downstream_record(
    task_id: str, edges: Sequence[tuple[str, str]], paths: dict[str, str | None]
) -> list[dict[str, Any]]:
    """The tasks below ``task_id`` in a pipeline of ``edges`` (task id pairs), each with its
    tracking store (``paths``; None: untracked) and its upstream tasks among them, in
    breadth-first order: what ``bellis verify --reset`` follows to the blocks that read a
    mismatched block."""
    below: list[str] = []
    seen = {task_id}
    frontier = [task_id]
    while frontier:
        nxt = []
        for up in frontier:
            for a, b in edges:
                if a == up and b not in seen:
                    seen.add(b)
                    below.append(b)
                    nxt.append(b)
        frontier = nxt
    return [
        {
            "task_id": down,
            "tracking": paths.get(down),
            "upstream": sorted({a for a, b in edges if b == down and a in seen}),
        }
        for down in below
    ]


def outputs_record(
    specs: Sequence[OutputSpec],
    write_safety: str,
    verify_outputs: bool | str = False,
    downstream: Sequence[dict[str, Any]] = (),
    task_id: str | None = None,
    stored: Sequence[bool] = (),
) -> dict[str, Any]:
    """What the tracking group keeps of a task's outputs (``outputs.json``): enough to
    open each array again and map a block's world ROI to its voxels, whether (and with
    which hash) its blocks record checksums, and the tasks downstream of it."""
    return {
        "version": OUTPUTS_RECORD_VERSION,
        "task_id": task_id,
        "write_safety": write_safety,
        "verify_outputs": verify_outputs,
        "checksum": "crc32c",
        "downstream": list(downstream),
        "outputs": [
            {
                "store": s.store,
                "path": s.path,
                "shape": list(s.shape),
                "chunks": list(s.chunks),
                "shards": None if s.shards is None else list(s.shards),
                "dtype": s.dtype,
                "voxel_size": list(s.voxel_size),
                "offset": list(s.offset),
                "mapping": s.mapping,
                # what verify_outputs checksums: the units' stored bytes, or the values
                "readback": "stored" if own else "data",
            }
            for s, own in zip(specs, list(stored) or [False] * len(specs), strict=True)
        ],
    }
