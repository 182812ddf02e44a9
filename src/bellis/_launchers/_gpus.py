"""Local GPU assignment: which GPU(s) each local worker sees (``CUDA_VISIBLE_DEVICES``).

Theory of operation
-------------------
A task with ``requires={"gpu": n}`` run by a :class:`~bellis.LocalLauncher` gets each of its
workers its own device(s): the launcher sets the worker's ``CUDA_VISIBLE_DEVICES`` to them
when the worker starts (never on the per-block path).

The devices
    :func:`find_gpus`: the launcher's ``gpus=[...]`` argument where given; else the
    driver's own ``CUDA_VISIBLE_DEVICES`` where set (what SLURM's ``--gres`` or a MIG slice
    gave this process: bellis splits it, entries kept verbatim, ``GPU-``/``MIG-`` UUIDs
    included, parsed as CUDA parses it: up to the first entry that names no device, ``""``
    or ``-1`` hides all); else NVML's enumeration (``nvidia-ml-py``, optional): one entry per
    device by index, or, for a device in MIG mode, one per MIG instance by its UUID. None of
    these: no GPU.
Shares
    A worker's need is counted in integer shares, :data:`~bellis._sizes.GPU_SHARES` to
    a GPU, so that ``gpu=0.5`` (two workers on a GPU) is exact arithmetic. A whole number of
    GPUs takes that many free devices; a fraction takes room on one device, the fullest one
    it still fits on (so fractions pack, and whole devices stay free for whole needs).
Replacement
    :class:`GpuBook` keys a worker by its task and log slot. A worker that ends gives its
    devices back, and the book remembers them: the next worker of that slot (its
    replacement, which takes the slot of the worker it replaces) gets them again when they
    fit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._sizes import GPU_SHARES
from ..errors import ConfigurationError

__all__ = ["GpuBook", "GpuShortage", "check_gpus_argument", "find_gpus", "parse_visible"]

#: a worker's key in the book: (task id, log slot)
Key = tuple[str, int]


class GpuShortage(Exception):
    """No device has room for a worker's share (a fragmentation of mixed fractions)."""


def check_gpus_argument(gpus: Any) -> list[str] | None:
    """``LocalLauncher(gpus=...)``: device indices (ints) or ids (``"GPU-..."``, ``"MIG-..."``,
    ``"3"``) as ``CUDA_VISIBLE_DEVICES`` entries; None: find them (:func:`find_gpus`)."""
    if gpus is None:
        return None
    if isinstance(gpus, str | bytes) or not isinstance(gpus, Sequence):
        raise ConfigurationError(
            f"LocalLauncher(gpus={gpus!r}) must be a list of device indices or ids, e.g. "
            "gpus=[0, 2, 3] or gpus=['GPU-8f2c...', 'MIG-1a2b...']",
            parameter="gpus",
        )
    out: list[str] = []
    for g in gpus:
        if isinstance(g, int) and not isinstance(g, bool) and g >= 0:
            entry = str(g)
        elif isinstance(g, str) and g.strip() and "," not in g:
            entry = g.strip()
        else:
            raise ConfigurationError(
                f"LocalLauncher(gpus=...) has {g!r}, which is no device: pass a "
                "non-negative index (0, 1, ...) or a device id ('GPU-...', 'MIG-...')",
                parameter="gpus",
            )
        if entry in out:
            raise ConfigurationError(
                f"LocalLauncher(gpus={list(gpus)!r}) names device {entry} twice: name each "
                "GPU once (requires={'gpu': 0.5} shares a GPU between two workers)",
                parameter="gpus",
            )
        out.append(entry)
    return out


def parse_visible(spec: str) -> list[str]:
    """The entries of a ``CUDA_VISIBLE_DEVICES`` value that name devices, as CUDA reads
    them: comma-separated, up to the first entry that names none."""
    out: list[str] = []
    for raw in spec.split(","):
        entry = raw.strip()
        if not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
            break  # "", "-1" or anything else: CUDA stops here
        if entry not in out:
            out.append(entry)
    return out


def find_gpus(env: Mapping[str, str], load: Callable[[], Any]) -> list[str]:
    """The GPUs of this machine a run may hand out (see the module docstring); ``load``
    returns an NVML binding (``bellis._worker._gpu.NvmlBinding``) or None, and is called only
    when ``CUDA_VISIBLE_DEVICES`` is unset."""
    spec = env.get("CUDA_VISIBLE_DEVICES")
    if spec is not None:
        return parse_visible(spec)
    binding = load()
    if binding is None:
        return []
    out: list[str] = []
    for i in range(binding.device_count()):
        handle = binding.handle_by_index(i)
        migs = binding.mig_handles(handle)
        for entry in [binding.uuid(m) for m in migs] if migs else [str(i)]:
            if entry not in out:  # one device is never two workers' own
                out.append(entry)
    return out


class GpuBook:
    """Which worker holds which devices, and how full each device is (in shares)."""

    __slots__ = ("_held", "_last", "_used", "devices")

    def __init__(self, devices: Sequence[str]) -> None:
        self.devices = list(devices)
        self._used = [0] * len(self.devices)
        self._held: dict[Key, tuple[list[int], int]] = {}  # key: (device indices, share each)
        self._last: dict[Key, list[int]] = {}  # the devices a slot's last worker held

    def take(self, key: Key, shares: int) -> tuple[str, ...]:
        """The devices for the worker ``key`` that needs ``shares`` (whole GPUs are
        multiples of ``GPU_SHARES``); a worker that holds some already keeps them. Raises
        :class:`GpuShortage` when no device has room."""
        if key in self._held:
            return tuple(self.devices[i] for i in self._held[key][0])
        whole, part = divmod(shares, GPU_SHARES)
        if whole and part:
            raise ValueError(f"a worker needs whole GPUs or a fraction of one, not {shares}")
        each = GPU_SHARES if whole else part
        count = whole or 1
        used = self._used
        before = self._last.get(key)
        if (
            before is not None
            and len(before) == count
            and all(used[i] + each <= GPU_SHARES for i in before)
        ):
            chosen = before
        elif whole:
            chosen = [i for i, u in enumerate(used) if u == 0][:count]
        else:
            fits = [i for i, u in enumerate(used) if u + each <= GPU_SHARES]
            chosen = [max(fits, key=lambda i: (used[i], -i))] if fits else []
        if len(chosen) < count:
            free = sum(GPU_SHARES - u for u in used) / GPU_SHARES
            raise GpuShortage(
                f"no room on the {len(self.devices)} GPU(s) ({free:g} GPU free in all, "
                f"split between devices) for a worker that needs {shares / GPU_SHARES:g}"
            )
        for i in chosen:
            used[i] += each
        self._held[key] = (list(chosen), each)
        return tuple(self.devices[i] for i in chosen)

    def release(self, key: Key) -> None:
        """The worker ``key`` ended: its devices are free (and remembered for its slot)."""
        held = self._held.pop(key, None)
        if held is None:
            return
        chosen, each = held
        for i in chosen:
            self._used[i] -= each
        self._last[key] = chosen

    def holding(self, key: Key) -> tuple[str, ...] | None:
        held = self._held.get(key)
        return None if held is None else tuple(self.devices[i] for i in held[0])
