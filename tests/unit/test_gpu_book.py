"""Local GPU assignment, the pure part (``bellis._launchers._gpus``): which worker slot gets
which device, fractional packing, replacement, and where the devices come from."""

from __future__ import annotations

from typing import Any

import pytest

import bellis
from bellis._launchers._gpus import (
    GpuBook,
    GpuShortage,
    check_gpus_argument,
    find_gpus,
    parse_visible,
)
from bellis._sizes import GPU_SHARES
from bellis.errors import ConfigurationError
from kit.nvml import Dev, FakeNvml

ONE = GPU_SHARES
HALF = GPU_SHARES // 2


# ------------------------------------------------------------------------ the book


def test_whole_gpus_one_per_slot_in_order() -> None:
    book = GpuBook(["0", "2", "3"])
    got = [book.take(("t", s), ONE) for s in range(3)]
    assert got == [("0",), ("2",), ("3",)]
    with pytest.raises(GpuShortage, match="3 GPU"):
        book.take(("t", 3), ONE)


def test_a_worker_that_holds_devices_keeps_them() -> None:
    book = GpuBook(["0", "1"])
    assert book.take(("t", 0), ONE) == ("0",)
    assert book.take(("t", 0), ONE) == ("0",)
    assert book.take(("t", 1), ONE) == ("1",)


def test_two_gpus_per_worker() -> None:
    book = GpuBook(["0", "1", "2", "3"])
    assert book.take(("t", 0), 2 * ONE) == ("0", "1")
    assert book.take(("t", 1), 2 * ONE) == ("2", "3")


def test_halves_pack_two_workers_per_gpu() -> None:
    book = GpuBook(["a", "b"])
    got = [book.take(("t", s), HALF) for s in range(4)]
    assert got == [("a",), ("a",), ("b",), ("b",)]
    with pytest.raises(GpuShortage):
        book.take(("t", 4), HALF)


def test_fractions_leave_whole_devices_for_whole_needs() -> None:
    book = GpuBook(["a", "b", "c"])
    assert book.take(("half", 0), HALF) == ("a",)
    assert book.take(("whole", 0), ONE) == ("b",)
    assert book.take(("half", 1), HALF) == ("a",)  # the fullest device it fits on
    assert book.take(("whole", 1), ONE) == ("c",)


def test_a_replacement_gets_the_device_of_the_worker_it_replaces() -> None:
    book = GpuBook(["0", "1", "2", "3"])
    for s in range(4):
        book.take(("t", s), ONE)
    book.release(("t", 0))
    book.release(("t", 2))
    assert book.holding(("t", 2)) is None
    # slot 2's replacement starts first: it gets device 2, not the lowest free one
    assert book.take(("t", 2), ONE) == ("2",)
    assert book.take(("t", 0), ONE) == ("0",)


def test_a_replacement_of_a_shared_gpu_rejoins_its_partner() -> None:
    book = GpuBook(["a", "b"])
    for s in range(4):
        book.take(("t", s), HALF)  # a, a, b, b
    book.release(("t", 0))
    book.release(("t", 3))
    # slot 3's replacement: back on b with its partner, though a is as full
    assert book.take(("t", 3), HALF) == ("b",)


def test_a_freed_device_goes_to_another_task_when_its_slot_is_gone() -> None:
    book = GpuBook(["0"])
    book.take(("first", 0), ONE)
    with pytest.raises(GpuShortage):
        book.take(("second", 0), ONE)
    book.release(("first", 0))
    assert book.take(("second", 0), ONE) == ("0",)
    # the old slot's device is taken: its next worker would wait for room, not share
    with pytest.raises(GpuShortage):
        book.take(("first", 0), ONE)


def test_release_of_an_unknown_worker_changes_nothing() -> None:
    book = GpuBook(["0"])
    book.release(("t", 5))
    assert book.take(("t", 0), ONE) == ("0",)


# ------------------------------------------------------------------------ the devices


def test_the_launcher_argument() -> None:
    assert check_gpus_argument(None) is None
    assert check_gpus_argument([0, 2, 3]) == ["0", "2", "3"]
    assert check_gpus_argument(["GPU-8f2c", " MIG-1a2b "]) == ["GPU-8f2c", "MIG-1a2b"]


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("0,1", "list of device indices"),
        ([-1], "non-negative index"),
        ([True], "non-negative index"),
        (["0,1"], "no device"),
        ([0, "0"], "device 0 twice"),
    ],
)
def test_a_bad_launcher_argument_is_named(value: Any, words: str) -> None:
    with pytest.raises(ConfigurationError, match=words) as err:
        bellis.LocalLauncher(gpus=value)
    assert err.value.parameter == "gpus"


@pytest.mark.parametrize(
    ("spec", "devices"),
    [
        ("0,1", ["0", "1"]),
        ("3, 1", ["3", "1"]),
        ("GPU-aaa,MIG-bbb", ["GPU-aaa", "MIG-bbb"]),
        ("MIG-GPU-aaa/1/0", ["MIG-GPU-aaa/1/0"]),
        ("0,-1,1", ["0"]),
        ("0,,1", ["0"]),
        ("", []),
        ("-1", []),
        ("0,0", ["0"]),
    ],
)
def test_cuda_visible_devices_as_cuda_reads_it(spec: str, devices: list[str]) -> None:
    assert parse_visible(spec) == devices


def test_the_drivers_cuda_visible_devices_comes_before_nvml() -> None:
    def load() -> Any:
        raise AssertionError("NVML is not asked when CUDA_VISIBLE_DEVICES is set")

    env = {"CUDA_VISIBLE_DEVICES": "GPU-x,GPU-y"}
    assert find_gpus(env, load) == ["GPU-x", "GPU-y"]


def test_nvml_enumerates_devices_by_index_and_mig_instances_by_uuid() -> None:
    nv = FakeNvml([Dev("GPU-0"), Dev("GPU-1", migs=[Dev("MIG-1a"), Dev("MIG-1b")]), Dev("GPU-2")])
    assert find_gpus({}, lambda: nv) == ["0", "MIG-1a", "MIG-1b", "2"]


def test_no_nvml_and_no_variable_means_no_gpu() -> None:
    assert find_gpus({}, lambda: None) == []


# ------------------------------------------------------------------------ requires


def task(requires: dict[str, Any]) -> bellis.Task:
    roi = bellis.Roi((0,), (4,))
    return bellis.Task("t", total_roi=roi, read_roi=roi, write_roi=roi, requires=requires)


@pytest.mark.parametrize("share", [0.5, 0.25, 1 / 3, 0.125])
def test_gpu_fractions_count_in_whole_shares(share: float) -> None:
    t = task({"gpu": share})
    assert t.requires == {"gpu": share}
    assert t._budget == {"gpu": round(GPU_SHARES * share)}
    assert GPU_SHARES % t._budget["gpu"] == 0


def test_whole_gpus_and_other_resources_stay_ints() -> None:
    t = task({"gpu": 2.0, "cpu": 3})
    assert t.requires == {"gpu": 2, "cpu": 3}
    assert t._budget == {"gpu": 2 * GPU_SHARES, "cpu": 3}


@pytest.mark.parametrize("share", [0.3, 0.1, 1.5, 0.05])
def test_a_gpu_share_that_cannot_pack_is_refused(share: float) -> None:
    with pytest.raises(ConfigurationError, match="requires\\['gpu'\\]") as err:
        task({"gpu": share})
    assert err.value.parameter == "requires"


def test_only_gpu_may_be_a_fraction() -> None:
    with pytest.raises(TypeError, match="only 'gpu' may be a fraction"):
        task({"cpu": 0.5})
