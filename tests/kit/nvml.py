"""NVML at the binding boundary: a double for the unit tests (``Dev``, ``FakeNvml``: what
NVML would answer for a node with these devices; bellis's own code runs as on a GPU node),
and the real device count for the tests that need a GPU (``nvml_device_count``)."""

from __future__ import annotations

from typing import Any


class Dev:
    """One device (or MIG instance): its UUID, MIG instances, utilization samples
    ``(pid, stamp_us, sm)`` and processes ``(pid, bytes)``."""

    def __init__(self, uuid: str, migs: list[Dev] | None = None) -> None:
        self.uuid = uuid
        self.migs = migs or []
        self.util: list[tuple[int, int, int]] = []
        self.procs: list[tuple[int, int]] = []


class FakeNvml:
    """What NVML would answer for a node with these devices."""

    def __init__(self, devices: list[Dev]) -> None:
        self.devices = devices
        self.util_calls: list[tuple[str, int]] = []
        self.fail_util = False

    def device_count(self) -> int:
        return len(self.devices)

    def handle_by_index(self, index: int) -> Any:
        return self.devices[index]

    def uuid(self, handle: Any) -> str:
        return str(handle.uuid)

    def mig_handles(self, handle: Any) -> list[Any]:
        return list(handle.migs)

    def process_utilization(self, handle: Any, since_us: int) -> list[tuple[int, int, int]]:
        self.util_calls.append((handle.uuid, since_us))
        if self.fail_util:
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        # NVML returns the samples newer than the timestamp it is given
        return [s for s in handle.util if s[1] > since_us]

    def running_processes(self, handle: Any) -> list[tuple[int, int]]:
        return list(handle.procs)


def nvml_device_count() -> int:
    """The GPUs the real NVML lists here: 0 without nvidia-ml-py or a driver."""
    try:
        import pynvml
    except ImportError:
        return 0
    try:
        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetCount())
    except pynvml.NVMLError:
        return 0
