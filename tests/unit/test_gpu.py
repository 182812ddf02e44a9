"""GPU figures without a GPU: a double of the NVML calls at the binding boundary.

The double stands in for the NVML library only (``NvmlBinding``, and a pynvml-shaped
namespace for the adapter); bellis's own code runs as it does on a GPU node.
"""

from __future__ import annotations

import math
import sys
import types
from typing import Any

import pytest

from bellis._worker._gpu import GpuMeter, _Pynvml, open_gpu_meter, visible_devices
from kit.nvml import Dev, FakeNvml


def node(n: int = 2) -> FakeNvml:
    return FakeNvml([Dev(f"GPU-{i}aaa-{i}") for i in range(n)])


# ---------------------------------------------------------------- CUDA_VISIBLE_DEVICES


def test_unset_shows_every_device() -> None:
    nv = node(3)
    assert visible_devices(nv, {}) == nv.devices


@pytest.mark.parametrize("spec", ["", "-1", "NoDevFiles"])
def test_hidden_devices(spec: str) -> None:
    assert visible_devices(node(), {"CUDA_VISIBLE_DEVICES": spec}) == []


def test_indices_in_the_order_given() -> None:
    nv = node(3)
    assert visible_devices(nv, {"CUDA_VISIBLE_DEVICES": "2,0"}) == [nv.devices[2], nv.devices[0]]


def test_parsing_stops_at_the_first_invalid_entry() -> None:
    nv = node(3)
    got = visible_devices(nv, {"CUDA_VISIBLE_DEVICES": "1,7,0"})
    assert got == [nv.devices[1]]


def test_uuids_and_unique_prefixes() -> None:
    nv = node(3)
    got = visible_devices(nv, {"CUDA_VISIBLE_DEVICES": "GPU-2aaa-2, GPU-0"})
    assert got == [nv.devices[2], nv.devices[0]]


def test_an_ambiguous_prefix_names_no_device() -> None:
    nv = FakeNvml([Dev("GPU-ab1"), Dev("GPU-ab2")])
    assert visible_devices(nv, {"CUDA_VISIBLE_DEVICES": "GPU-ab"}) == []


def test_mig_uuids_map_to_their_instance() -> None:
    mig = Dev("MIG-7f00")
    nv = FakeNvml([Dev("GPU-0", migs=[mig]), Dev("GPU-1")])
    assert visible_devices(nv, {"CUDA_VISIBLE_DEVICES": "MIG-7f00"}) == [mig]


def test_no_visible_device_means_no_meter() -> None:
    nv = node()
    assert open_gpu_meter(lambda: [1], env={"CUDA_VISIBLE_DEVICES": ""}, load=lambda: nv) is None
    assert open_gpu_meter(lambda: [1], env={}, load=lambda: None) is None
    assert open_gpu_meter(lambda: [1], env={}, load=lambda: nv) is not None


# ---------------------------------------------------------------- figures


def meter(nv: FakeNvml, pids: list[int], spec: str | None = None) -> GpuMeter:
    """A meter whose samples the test takes itself (no thread)."""
    env = {} if spec is None else {"CUDA_VISIBLE_DEVICES": spec}
    return GpuMeter(nv, visible_devices(nv, env), lambda: pids, threaded=False)


def test_util_is_the_mean_of_this_process_samples_during_the_block() -> None:
    nv = node(1)
    d = nv.devices[0]
    d.procs = [(100, 2 << 30)]
    d.util = [
        (100, 900, 99),  # before the block: not counted
        (100, 1_100, 80),
        (100, 1_200, 60),
        (555, 1_150, 100),  # another process on the same device
    ]
    m = meter(nv, [100])
    m.begin(1_000)
    util, mem = m.finish()
    assert util == pytest.approx(70.0)
    assert nv.util_calls == [("GPU-0aaa-0", 1_000)]  # the block's start as lastSeenTimeStamp
    assert mem == 0  # no sample fell in the block: not measured


def test_children_count_and_devices_are_averaged() -> None:
    nv = node(2)
    nv.devices[0].util = [(100, 2_000, 40)]
    nv.devices[1].util = [(101, 2_000, 90), (101, 2_500, 70)]  # a child process
    m = meter(nv, [100, 101])
    m.begin(1_000)
    util, _ = m.finish()
    assert util == pytest.approx((40 + 80) / 2)


def test_a_process_on_the_device_without_samples_measured_zero() -> None:
    nv = node(1)
    nv.devices[0].procs = [(100, 300 << 20)]
    m = meter(nv, [100])
    m.begin(1_000)
    util, _ = m.finish()
    assert util == 0.0 and not math.isnan(util)


def test_a_process_that_never_touched_the_device_is_nan() -> None:
    nv = node(1)
    nv.devices[0].procs = [(555, 300 << 20)]
    nv.devices[0].util = [(555, 2_000, 100)]
    m = meter(nv, [100])
    m.begin(1_000)
    util, mem = m.finish()
    assert math.isnan(util)
    assert mem == 0


def test_hidden_devices_are_not_read() -> None:
    nv = node(2)
    nv.devices[0].util = [(100, 2_000, 100)]
    nv.devices[1].util = [(100, 2_000, 20)]
    m = meter(nv, [100], spec="1")
    m.begin(1_000)
    util, _ = m.finish()
    assert util == pytest.approx(20.0)
    assert [u for u, _ in nv.util_calls] == ["GPU-1aaa-1"]


def test_sampled_memory_is_the_peak_within_the_block() -> None:
    nv = node(1)
    d = nv.devices[0]
    m = meter(nv, [100, 101])
    d.procs = [(100, 5 << 30)]
    m.sample()  # between blocks: not counted
    m.begin(1_000)
    for held in [(1 << 30, 0), (2 << 30, 1 << 30), (1 << 30, 0)]:
        d.procs = [(100, held[0]), (101, held[1]), (555, 9 << 30)]
        m.sample()
    _, mem = m.finish()
    assert mem == 3 << 30
    d.procs = [(100, 7 << 30)]
    m.sample()  # after the block: not counted in it nor in the next one
    m.begin(2_000)
    _, mem = m.finish()
    assert mem == 0


def test_mig_instances_count_for_memory() -> None:
    mig = Dev("MIG-1")
    nv = FakeNvml([Dev("GPU-0", migs=[mig])])
    m = meter(nv, [100])
    m.begin(1_000)
    mig.procs = [(100, 4 << 30)]
    m.sample()
    util, mem = m.finish()
    assert mem == 4 << 30
    assert util == 0.0  # on the device (in its MIG instance), no utilisation sample


def test_an_nvml_failure_warns_once_and_stops_measuring(caplog: pytest.LogCaptureFixture) -> None:
    nv = node(1)
    nv.fail_util = True
    m = meter(nv, [100])
    for _ in range(3):
        m.begin(1_000)
        util, mem = m.finish()
        assert math.isnan(util) and mem == 0
    warnings = [r for r in caplog.records if "NVML call failed" in r.getMessage()]
    assert len(warnings) == 1
    assert len(nv.util_calls) == 1


def test_torch_allocator_peak_replaces_sampling(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    class Cuda:
        @staticmethod
        def is_initialized() -> bool:
            return True

        @staticmethod
        def device_count() -> int:
            return 2

        @staticmethod
        def reset_peak_memory_stats(i: int) -> None:
            calls.append(f"reset {i}")

        @staticmethod
        def max_memory_reserved(i: int) -> int:
            return (i + 1) << 30

    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=Cuda))
    nv = node(1)
    nv.devices[0].procs = [(100, 9 << 30)]
    m = meter(nv, [100])
    m.begin(1_000)
    m.sample()  # the allocator's peak is exact: no sample needed or used
    _, mem = m.finish()
    assert calls == ["reset 0", "reset 1"]
    assert mem == 3 << 30


def test_torch_without_cuda_initialised_is_sampled(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = types.SimpleNamespace(is_initialized=lambda: False)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    nv = node(1)
    m = meter(nv, [100])
    m.begin(1_000)
    nv.devices[0].procs = [(100, 1 << 30)]
    m.sample()
    assert m.finish()[1] == 1 << 30


def test_the_sampling_thread_samples_only_while_a_block_runs() -> None:
    import threading

    nv = node(1)
    nv.devices[0].procs = [(100, 2 << 30)]
    sampled = threading.Event()
    calls: list[int] = []
    real = nv.running_processes

    def counting(handle: Any) -> list[tuple[int, int]]:
        calls.append(1)
        if len(calls) == 2:  # the first sample is complete
            sampled.set()
        return real(handle)

    nv.running_processes = counting  # type: ignore[method-assign]
    m = open_gpu_meter(lambda: [100], env={}, load=lambda: nv)
    assert m is not None
    assert not m.sampler_alive  # nothing starts before the first block
    m.begin(1_000)
    assert m.sampler_alive
    assert sampled.wait(30), "the sampling thread took no second sample during the block"
    _, mem = m.finish()
    assert mem == 2 << 30
    m.close()
    assert not m.sampler_alive
    assert [t for t in threading.enumerate() if t.name == "bellis-gpu-sampler"] == []


# ---------------------------------------------------------------- the pynvml adapter


class _NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


def fake_pynvml(util_error: int | None = None, mig: bool = False) -> Any:
    sample = types.SimpleNamespace(pid=100, timeStamp=2_000, smUtil=55, memUtil=1)

    def util(handle: Any, since: int) -> list[Any]:
        if util_error is not None:
            raise _NVMLError(util_error)
        return [sample]

    def mig_mode(handle: Any) -> tuple[int, int]:
        if handle == "mig-0":
            raise _NVMLError(3)
        return (1, 1) if mig else (0, 0)

    def mig_handle(handle: Any, i: int) -> Any:
        if i == 1:
            raise _NVMLError(6)  # no instance at this index
        return f"mig-{i}"

    return types.SimpleNamespace(
        NVMLError=_NVMLError,
        NVML_ERROR_NOT_FOUND=6,
        NVML_ERROR_NOT_SUPPORTED=3,
        NVML_DEVICE_MIG_ENABLE=1,
        nvmlInit=lambda: None,
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: f"dev-{i}",
        nvmlDeviceGetUUID=lambda h: b"GPU-0",
        nvmlDeviceGetMigMode=mig_mode,
        nvmlDeviceGetMaxMigDeviceCount=lambda h: 3,
        nvmlDeviceGetMigDeviceHandleByIndex=mig_handle,
        nvmlDeviceGetProcessUtilization=util,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [
            types.SimpleNamespace(pid=100, usedGpuMemory=1 << 20),
            types.SimpleNamespace(pid=101, usedGpuMemory=None),
        ],
    )


def test_adapter_converts_nvml_answers() -> None:
    b = _Pynvml(fake_pynvml())
    assert b.uuid("dev-0") == "GPU-0"
    assert b.process_utilization("dev-0", 1_000) == [(100, 2_000, 55)]
    assert b.running_processes("dev-0") == [(100, 1 << 20)]  # None is not a measurement
    assert b.mig_handles("dev-0") == []
    assert _Pynvml(fake_pynvml(mig=True)).mig_handles("dev-0") == ["mig-0", "mig-2"]


@pytest.mark.parametrize("code", [6, 3])
def test_adapter_no_samples_is_an_empty_list(code: int) -> None:
    assert _Pynvml(fake_pynvml(util_error=code)).process_utilization("dev-0", 0) == []


def test_adapter_other_errors_propagate() -> None:
    with pytest.raises(_NVMLError):
        _Pynvml(fake_pynvml(util_error=15)).process_utilization("dev-0", 0)


# ---------------------------------------------------------------- SLURM GPU requests


def test_slurm_gpus_per_worker_requests_gres() -> None:
    from pathlib import Path

    from bellis import ConfigurationError, SlurmLauncher
    from bellis._launchers._base import WorkerSpec

    spec = WorkerSpec(task_id="t", worker_id=0, env={}, payload=b"", out_path=None, err_path=None)
    flags = SlurmLauncher(gpus_per_worker=2)._resource_flags(spec)
    assert "--gres=gpu:2" in flags
    # a task's requires={"gpu": n} still overrides the launcher's default
    spec_req = WorkerSpec(
        task_id="t",
        worker_id=0,
        env={},
        payload=b"",
        out_path=Path("o"),
        err_path=Path("e"),
        requires={"gpu": 1},
    )
    assert "--gres=gpu:1" in SlurmLauncher(gpus_per_worker=2)._resource_flags(spec_req)
    assert not any(f.startswith("--gres") for f in SlurmLauncher()._resource_flags(spec))
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigurationError, match="gpus_per_worker"):
            SlurmLauncher(gpus_per_worker=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="not both"):
        SlurmLauncher(gpus_per_worker=1, gres="gpu:a100:1")


def test_local_gpu_discovery_through_the_adapter() -> None:
    # the devices a LocalLauncher hands out, as NVML lists them (issue 30): by index, or a
    # device in MIG mode as its MIG instances, by UUID; an id NVML gives twice (the
    # stand-in names every instance GPU-0) is one device
    from bellis._launchers._gpus import find_gpus

    assert find_gpus({}, lambda: _Pynvml(fake_pynvml())) == ["0"]
    assert find_gpus({}, lambda: _Pynvml(fake_pynvml(mig=True))) == ["GPU-0"]
