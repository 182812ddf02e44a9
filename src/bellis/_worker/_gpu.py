"""Per-block GPU figures from NVML: ``gpu_util_pct`` and ``gpu_mem_bytes``.

Theory of operation
-------------------
A worker with ``resource_tracking=True`` calls :func:`open_gpu_meter` once. It returns None,
and the block figures keep the seed's NaN and 0, unless all of these hold: the NVIDIA
driver is present (``/proc/driver/nvidia/version``, checked before anything is imported),
``pynvml`` (the ``nvidia-ml-py`` package, ``pip install 'bellis[gpu]'``) imports,
``nvmlInit`` succeeds, and ``CUDA_VISIBLE_DEVICES`` leaves at least one device visible.

``gpu_util_pct``
    The mean SM utilisation NVML attributes to this process and its live descendants while
    the block ran: :meth:`GpuMeter.finish` asks ``nvmlDeviceGetProcessUtilization`` for the
    samples since the block's start (its ``lastSeenTimeStamp``), keeps those of the
    process's pids, and averages ``smUtil`` per device, then over the devices that have
    samples. No sampling thread is needed for it. No sample for the process but the process
    holds a context on a visible device: a measured 0.0. The process never touched a
    visible device: NaN, as without a GPU.
``gpu_mem_bytes``
    The peak device memory of the process during the block. When torch is loaded and its
    CUDA state is initialised, its caching allocator's peak (``max_memory_reserved``, reset
    at each block's start) is the figure: exact, with no sampling. Otherwise the worker's
    sampling thread (:meth:`GpuMeter.sample`, never the per-block path) reads
    ``nvmlDeviceGetComputeRunningProcesses`` and keeps the largest total the process's pids
    held on the visible devices during the block; a block no sample fell in has 0, the
    seed's "not measured". The thread is the meter's own (``bellis-gpu-sampler``, started at
    the first block, a daemon): it samples every :data:`SAMPLE_PERIOD_SECONDS` while a block
    runs and sleeps on an event between blocks. It exists only in a process that found a
    device, in serial runs as in workers.

Devices
-------
``CUDA_VISIBLE_DEVICES`` is read as CUDA reads it: comma-separated entries, parsing stops at
the first entry that names no device, ``""`` or ``-1`` hides every device, and an unset
variable shows all of them. An entry is a ``GPU-``/``MIG-`` UUID (or a unique prefix of one),
mapped to NVML by UUID, or an index, mapped to NVML's index, which is CUDA's order when
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (SLURM's ``--gres`` sets indices in that order). A device in
MIG mode contributes its MIG instances' processes to ``gpu_mem_bytes``; NVML gives no
per-process utilisation for MIG, so such a device adds no utilisation sample.

The NVML functions are reached only through :class:`NvmlBinding`; the tests replace that
boundary with a double and drive every rule above without a GPU.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

__all__ = [
    "GpuMeter",
    "NvmlBinding",
    "load_nvml",
    "now_us",
    "open_gpu_meter",
    "visible_devices",
]

_DRIVER_MARKER = "/proc/driver/nvidia/version"
_log = logging.getLogger("bellis")
#: how often the sampling thread reads the device memory the process holds, while a block runs
SAMPLE_PERIOD_SECONDS = 0.05


class NvmlBinding(Protocol):
    """The NVML calls bellis makes, at the boundary a test double replaces."""

    def device_count(self) -> int: ...

    def handle_by_index(self, index: int) -> Any: ...

    def uuid(self, handle: Any) -> str: ...

    def mig_handles(self, handle: Any) -> list[Any]:
        """The MIG instances of a device in MIG mode; ``[]`` otherwise."""
        ...

    def process_utilization(self, handle: Any, since_us: int) -> list[tuple[int, int, int]]:
        """``(pid, timestamp_us, sm_util_pct)`` samples newer than ``since_us``; ``[]``
        when there are none or the device does not report them."""
        ...

    def running_processes(self, handle: Any) -> list[tuple[int, int]]:
        """``(pid, used_bytes)`` of the compute processes on the device."""
        ...


class _Pynvml:
    """:class:`NvmlBinding` on ``pynvml`` (the ``nvidia-ml-py`` package)."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        nvml.nvmlInit()

    def device_count(self) -> int:
        return int(self._nvml.nvmlDeviceGetCount())

    def handle_by_index(self, index: int) -> Any:
        return self._nvml.nvmlDeviceGetHandleByIndex(index)

    def uuid(self, handle: Any) -> str:
        value = self._nvml.nvmlDeviceGetUUID(handle)
        return value.decode() if isinstance(value, bytes) else str(value)

    def mig_handles(self, handle: Any) -> list[Any]:
        nvml = self._nvml
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        except nvml.NVMLError:
            return []  # no MIG support on this device or driver
        if current != nvml.NVML_DEVICE_MIG_ENABLE:
            return []
        out = []
        for i in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                out.append(nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i))
            except nvml.NVMLError:
                continue  # an index with no instance configured
        return out

    def process_utilization(self, handle: Any, since_us: int) -> list[tuple[int, int, int]]:
        nvml = self._nvml
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(handle, since_us)
        except nvml.NVMLError as exc:
            if exc.value in (nvml.NVML_ERROR_NOT_FOUND, nvml.NVML_ERROR_NOT_SUPPORTED):
                return []  # no sample since then / MIG or an old board: nothing measured
            raise
        return [(int(s.pid), int(s.timeStamp), int(s.smUtil)) for s in samples]

    def running_processes(self, handle: Any) -> list[tuple[int, int]]:
        procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        # usedGpuMemory is None where the driver cannot say (WDDM): not a measurement
        return [(int(p.pid), int(p.usedGpuMemory)) for p in procs if p.usedGpuMemory is not None]


def visible_devices(binding: NvmlBinding, env: Mapping[str, str]) -> list[Any]:
    """The NVML handles ``CUDA_VISIBLE_DEVICES`` leaves this process, in its order."""
    count = binding.device_count()
    spec = env.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return [binding.handle_by_index(i) for i in range(count)]
    by_uuid: dict[str, Any] = {}
    for i in range(count):
        handle = binding.handle_by_index(i)
        by_uuid[binding.uuid(handle)] = handle
        for mig in binding.mig_handles(handle):
            by_uuid[binding.uuid(mig)] = mig
    out: list[Any] = []
    for raw in spec.split(","):
        entry = raw.strip()
        handle = _lookup(entry, count, by_uuid, binding)
        if handle is None:
            break  # CUDA ignores this entry and every one after it
        if not any(handle is h for h in out):
            out.append(handle)
    return out


def _lookup(entry: str, count: int, by_uuid: dict[str, Any], binding: NvmlBinding) -> Any:
    if entry.isdigit():
        index = int(entry)
        return binding.handle_by_index(index) if index < count else None
    if entry.startswith(("GPU-", "MIG-")):
        if entry in by_uuid:
            return by_uuid[entry]
        matches = [h for u, h in by_uuid.items() if u.startswith(entry)]
        return matches[0] if len(matches) == 1 else None  # CUDA refuses an ambiguous prefix
    return None


class GpuMeter:
    """This worker's GPU figures for one block at a time (see the module docstring).

    :meth:`begin` and :meth:`finish` run on the per-block path; :meth:`sample` runs in the
    worker's sampling thread. ``pids`` returns the process and its live descendants.
    """

    __slots__ = (
        "_binding",
        "_broken",
        "_devices",
        "_peak",
        "_pids",
        "_sampling",
        "_since_us",
        "_stop",
        "_thread",
        "_threaded",
        "_torch",
        "_wake",
    )

    def __init__(
        self,
        binding: NvmlBinding,
        devices: list[Any],
        pids: Callable[[], Iterable[int]],
        *,
        threaded: bool = True,
    ) -> None:
        self._binding = binding
        self._devices: list[tuple[Any, list[Any]]] = [(d, binding.mig_handles(d)) for d in devices]
        self._pids = pids
        self._since_us = 0
        self._peak = 0
        self._sampling = False
        self._torch: Any = None
        #: an NVML call failed: warned once, and no figure is measured from then on
        self._broken = False
        self._wake = threading.Event()  # set while a block runs
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: False: no thread, :meth:`sample` is called by the owner (the tests)
        self._threaded = threaded

    def begin(self, now_us: int) -> None:
        """A block starts at ``now_us`` (wall clock, µs since the epoch, NVML's timebase)."""
        self._since_us = now_us
        self._peak = 0
        self._torch = _torch_cuda()
        if self._torch is not None:
            for i in range(self._torch.device_count()):
                self._torch.reset_peak_memory_stats(i)
        self._sampling = not self._broken
        if self._sampling and self._torch is None and self._threaded:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._sample_while_blocks_run, name="bellis-gpu-sampler", daemon=True
                )
                self._thread.start()
            self._wake.set()

    def close(self) -> None:
        """Stop the sampling thread (it is a daemon: a process may also just exit)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    @property
    def sampler_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _sample_while_blocks_run(self) -> None:
        wake, stop = self._wake, self._stop
        while not stop.is_set():
            wake.wait()
            if stop.is_set():
                return
            self.sample()
            stop.wait(SAMPLE_PERIOD_SECONDS)

    def sample(self) -> None:
        """Sampling thread: note the device memory the process holds now."""
        if not self._sampling or self._torch is not None:
            return
        try:
            held = self._held_bytes(set(self._pids()))
        except Exception as exc:  # any NVML failure ends the measuring
            self._fail(exc)
            return
        if held > self._peak:
            self._peak = held

    def finish(self) -> tuple[float, int]:
        """``(gpu_util_pct, gpu_mem_bytes)`` of the block that :meth:`begin` opened: NaN
        and 0 when nothing could be measured."""
        self._sampling = False
        self._wake.clear()
        if self._broken:
            return math.nan, 0
        try:
            return self._figures()
        except Exception as exc:  # any NVML failure ends the measuring
            self._fail(exc)
            return math.nan, 0

    def _fail(self, exc: BaseException) -> None:
        if not self._broken:
            self._broken = True
            _log.warning(
                "GPU figures are no longer measured in this worker: an NVML call failed: %r",
                exc,
            )

    def _figures(self) -> tuple[float, int]:
        pids = set(self._pids())
        binding = self._binding
        means = []
        for device, _migs in self._devices:
            mine = [
                util
                for pid, stamp, util in binding.process_utilization(device, self._since_us)
                if pid in pids and stamp >= self._since_us
            ]
            if mine:
                means.append(sum(mine) / len(mine))
        if means:
            util = sum(means) / len(means)
        else:
            util = 0.0 if self._held_bytes(pids, present=True) else math.nan
        if self._torch is not None:
            mem = sum(
                int(self._torch.max_memory_reserved(i)) for i in range(self._torch.device_count())
            )
        else:
            mem = self._peak
        return util, mem

    def _held_bytes(self, pids: set[int], present: bool = False) -> int:
        """Device memory the pids hold on the visible devices now; with ``present``, 1 as
        soon as any pid holds a context at all (even of 0 bytes)."""
        total = 0
        binding = self._binding
        for device, migs in self._devices:
            for handle in [device, *migs]:
                for pid, used in binding.running_processes(handle):
                    if pid in pids:
                        if present:
                            return 1
                        total += used
        return total


def _torch_cuda() -> Any:
    """torch.cuda when the block's code already loaded torch and initialised CUDA."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_initialized():
        return None
    return cuda


def open_gpu_meter(
    pids: Callable[[], Iterable[int]],
    env: Mapping[str, str] | None = None,
    load: Callable[[], NvmlBinding | None] | None = None,
) -> GpuMeter | None:
    """A :class:`GpuMeter` for this worker, or None when there is nothing to measure."""
    binding = (load or _load_pynvml)()
    if binding is None:
        return None
    devices = visible_devices(binding, os.environ if env is None else env)
    if not devices:
        return None
    return GpuMeter(binding, devices, pids)


def load_nvml() -> NvmlBinding | None:
    """NVML through ``pynvml`` where the driver and ``nvidia-ml-py`` are present; None
    otherwise (the driver's GPU discovery, ``bellis._launchers._gpus``, uses it too)."""
    return _load_pynvml()


def _load_pynvml() -> NvmlBinding | None:
    if not os.path.exists(_DRIVER_MARKER):
        return None  # no NVIDIA driver: import nothing
    try:
        import pynvml
    except ImportError:
        _log.info(
            "an NVIDIA driver is present but nvidia-ml-py is not installed: GPU figures are "
            "not measured (pip install 'bellis[gpu]')"
        )
        return None
    try:
        return _Pynvml(pynvml)
    except pynvml.NVMLError as exc:
        _log.warning("GPU figures are not measured: nvmlInit failed: %s", exc)
        return None


def now_us() -> int:
    """Wall clock in NVML's timebase (µs since the epoch)."""
    return time.time_ns() // 1000
