"""The memory ladder (``bellis._scheduling._memory``): sizes, grants, and the dispatcher's decisions
after an out-of-memory death, by scripted events with a fake clock. No sockets, processes
or sleeps."""

from __future__ import annotations

from typing import Any

import pytest

import bellis as daisy
from bellis._protocol import (
    BYE,
    OUT_OF_MEMORY,
    SHUTDOWN,
    WorkerExit,
    is_oom_exit,
    kernel_oom_message,
)
from bellis._scheduling._memory import MemoryRetries, build_ladder, charge, ladder_for
from bellis._scheduling._records import ManagedWorker
from bellis._scheduling._task_run import ABANDONED
from bellis._sizes import MIB, format_grant, parse_growth, parse_size
from bellis._task_spec import TaskSpec
from bellis.errors import ConfigurationError
from kit.dispatch import FAIL, OK, Script, send_of, sent, task

OOM_EXIT = WorkerExit("error", -9, "out of memory: SLURM job 3 exceeded its memory limit")


# -- sizes and ladders ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("150M", 150 * MIB),
        ("4G", 4 << 30),
        ("1.5G", 1536 * MIB),
        ("4GB", 4 << 30),
        ("4GiB", 4 << 30),
        ("512k", None),
        (" 2T ", 2 << 40),
    ],
)
def test_sizes_read_as_slurm_reads_them(text: str, size: int | None) -> None:
    if size is None:  # below the 1M floor
        with pytest.raises(ConfigurationError, match="at least 1M"):
            parse_size(text, "memory_limit")
    else:
        assert parse_size(text, "memory_limit") == size


def test_a_number_is_read_in_the_unit_given() -> None:
    assert parse_size(300 * MIB, "memory_limit") == 300 * MIB
    assert parse_size(300, "mem", int_unit=MIB) == 300 * MIB


@pytest.mark.parametrize("bad", ["4 gigs", "", "-1G", True, None, [4]])
def test_a_size_that_is_not_one_names_the_parameter_and_the_fix(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="max_memory=") as info:
        parse_size(bad, "max_memory")
    assert info.value.parameter == "max_memory"


@pytest.mark.parametrize("bad", [1, 0.5, float("nan"), "2", True])
def test_memory_growth_must_be_a_number_above_one(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="must be a number above 1"):
        parse_growth(bad)


def test_sizes_print_as_grants() -> None:
    assert [format_grant(s) for s in (300 * MIB, 4 << 30, 1536 * MIB)] == ["300M", "4G", "1.5G"]


def test_the_ladder_doubles_in_whole_megabytes_up_to_the_cap() -> None:
    lad = build_ladder(150 * MIB, 2.0, 1000 * MIB, "max_memory")
    assert [lad.text(s) for s in range(len(lad.grants))] == ["150M", "300M", "600M", "1000M"]
    assert lad.top == 3 and lad.megabytes(1) == 300


def test_a_ladder_whose_cap_is_the_request_has_one_grant() -> None:
    assert build_ladder(300 * MIB, 2.0, 300 * MIB, "max_memory").grants == (300 * MIB,)


class _Launcher:
    memory_grants = True
    is_local = False
    memory_request = 4 << 30
    memory_growth = None
    max_memory = None
    name = "fake"


def test_a_task_without_a_memory_request_on_a_local_launcher_has_no_ladder() -> None:
    lau = daisy.LocalLauncher()
    assert ladder_for(TaskSpec.of(task()), lau, {}) is None


def test_the_default_cap_is_two_steps_above_the_request() -> None:
    lad = ladder_for(TaskSpec.of(task(memory_limit="300M")), daisy.LocalLauncher(), {})
    assert lad is not None
    assert [lad.text(s) for s in range(3)] == ["300M", "600M", "1.17G"]
    lad = ladder_for(TaskSpec.of(task()), _Launcher(), {})
    assert lad is not None and lad.grants == (4 << 30, 8 << 30, 16 << 30)


def test_the_tasks_growth_and_cap_win_over_the_launchers() -> None:
    lad = ladder_for(TaskSpec.of(task(memory_growth=3, max_memory="20G")), _Launcher(), {})
    assert lad is not None and [lad.text(s) for s in range(3)] == ["4G", "12G", "20G"]


def test_a_requires_mem_budget_caps_the_ladder_at_what_can_ever_start() -> None:
    lad = ladder_for(TaskSpec.of(task(requires={"mem": 1000})), _Launcher(), {"mem": 2500})
    assert lad is not None and [lad.megabytes(s) for s in range(len(lad.grants))] == [1000, 2000]
    assert "resources" in lad.cap_parameter


def test_a_memory_limit_a_launcher_cannot_enforce_is_a_configuration_error() -> None:
    class Dask(_Launcher):  # DaskLauncher's capabilities: it grants no memory
        name = "dask"
        memory_grants = False

    with pytest.raises(ConfigurationError, match="cannot be enforced by the dask launcher"):
        ladder_for(TaskSpec.of(task(memory_limit="1G")), Dask(), {})


def test_task_validates_the_ladder() -> None:
    with pytest.raises(ConfigurationError, match="below memory_limit") as info:
        task(memory_limit="4G", max_memory="2G")
    assert info.value.parameter == "max_memory"
    t = task(memory_limit="4G", memory_growth=1.5, max_memory="16G")
    assert (t.memory_limit, t.memory_growth, t.max_memory) == (4 << 30, 1.5, 16 << 30)


def test_a_big_worker_charges_its_grant_against_the_memory_budget() -> None:
    lad = build_ladder(300 * MIB, 2.0, 1200 * MIB, "max_memory")
    req = {"mem": 300, "gpu": 1}
    assert charge(req, lad, 0) is req
    assert charge(req, lad, 2) == {"mem": 1200, "gpu": 1}


def test_oom_exits_are_told_from_others() -> None:
    assert is_oom_exit(OOM_EXIT)
    assert not is_oom_exit(WorkerExit("error", 1, "bellis worker subprocess exited with code 1"))
    assert not is_oom_exit(None)
    assert kernel_oom_message(-9, 3, 4) is not None
    assert kernel_oom_message(-9, 3, 3) is None  # SIGKILL, but not the OOM killer
    assert kernel_oom_message(-9, None, None) is None  # no cgroup to read
    assert kernel_oom_message(1, 3, 4) is None


# -- the plan --------------------------------------------------------------------------------
class _Run:
    def __init__(self) -> None:
        self.oom_retries: dict[str, int] = {}
        self.oom_successes: dict[str, int] = {}
        self.oom_failures = 0
        self.store = None


def test_a_block_climbs_one_step_per_death_and_fails_past_the_top() -> None:
    run = _Run()
    plan = MemoryRetries(build_ladder(100 * MIB, 2.0, 400 * MIB, "max_memory"), run)
    assert plan.out_of_memory(5, 0) == 1
    assert plan.take(1) == 5 and plan.held_back == 0
    assert plan.out_of_memory(5, 1) == 2
    assert plan.take(1) == -1  # a 200M worker may not run a block that needs 400M
    assert plan.take(2) == 5
    assert plan.out_of_memory(5, 2) == -1
    assert run.oom_retries == {"200M": 1, "400M": 1} and run.oom_failures == 1
    assert 5 not in plan.need


def test_big_workers_are_wanted_per_step_up_to_the_limit() -> None:
    plan = MemoryRetries(build_ladder(100 * MIB, 2.0, 400 * MIB, "max_memory"), _Run())
    for k in range(3):
        plan.out_of_memory(k, 0)
    plan.out_of_memory(9, 1)
    assert plan.wanted(8) == [2, 1, 1, 1]
    assert plan.wanted(2) == [2, 1]
    plan.alive[1] = 2
    assert plan.wanted(8) == [2, 1]


def test_a_second_block_out_of_memory_gets_its_own_big_worker_while_the_first_is_busy() -> None:
    plan = MemoryRetries(build_ladder(100 * MIB, 2.0, 400 * MIB, "max_memory"), _Run())
    plan.out_of_memory(1, 0)
    assert plan.wanted(8) == [1]
    plan.alive[1] = 1
    assert plan.take(1) == 1  # the big worker runs block 1
    plan.out_of_memory(2, 0)  # block 2 runs out of memory meanwhile
    assert plan.wanted(8) == [1]  # a second big worker: the first one is busy
    plan.returned(_Scheduler(), 1, True, 1)  # block 1 succeeded: that worker is idle now
    assert plan.wanted(8) == []  # and takes block 2


class _Scheduler:
    def take_queued_index(self, run: Any, k: int) -> bool:
        raise AssertionError("a success is not requeued")


# -- the dispatcher --------------------------------------------------------------------------
def laddered(blocks: int = 4, **kw: Any) -> Script:
    """A task of ``blocks`` blocks with a 100M request, growth 2, cap 400M."""
    resources = kw.pop("resources", None)
    t = task(blocks=blocks, memory_limit="100M", max_memory="400M", **kw)
    sc = Script(t, resources)
    plan = sc.plans["t"]
    ladder = ladder_for(TaskSpec.of(t), daisy.LocalLauncher(), {})
    assert ladder is not None
    plan.memory = MemoryRetries(ladder, plan.run)
    return sc


def start(sc: Script) -> list[tuple[ManagedWorker, int]]:
    """Rebalance and start what it books: (worker, its memory step) each."""
    return [(worker, booking.mem_step) for worker, booking in sc.launch()]


def test_a_memory_error_climbs_without_a_failed_attempt_and_runs_on_a_big_worker() -> None:
    sc = laddered(blocks=3, max_workers=1)
    ((w, step),) = start(sc)
    assert step == 0
    peer = sc.connect(worker=w)
    (k,) = send_of(sc.acquire(peer), peer)
    sc.acquire(peer, (k, OUT_OF_MEMORY, -1, "MemoryError"), op=BYE)
    run = sc.run()
    assert run.failed_attempts == 0 and run.retries == {} and run.oom_retries == {"200M": 1}
    sc.exit(w, WorkerExit("error", 89, "out of memory: a block raised MemoryError"))
    booked = start(sc)
    # the ordinary replacement and one big worker: the OOM death spent no restart
    assert sorted(s for _, s in booked) == [0, 1] and run.worker_restarts == 0
    big = next(w for w, s in booked if s == 1)
    small = next(w for w, s in booked if s == 0)
    bp, sp = sc.connect(worker=big), sc.connect(worker=small)
    assert send_of(sc.acquire(bp), bp) == [k]
    ordinary = send_of(sc.acquire(sp), sp)
    assert k not in ordinary
    # the big worker's success counts for its grant; then it is told to stop
    out = sc.acquire(bp, (k, OK, -1, None))
    assert sent(out, bp) == [[SHUTDOWN]]
    assert run.oom_successes == {"200M": 1} and run.completed == 1


def test_ordinary_blocks_never_go_to_a_big_worker() -> None:
    sc = laddered(blocks=6, max_workers=1)
    ((w, _),) = start(sc)
    peer = sc.connect(worker=w)
    (k,) = send_of(sc.acquire(peer), peer)
    sc.acquire(peer, (k, OUT_OF_MEMORY, -1, "MemoryError"), op=BYE)
    big = next(w for w, s in start(sc) if s == 1)
    bp = sc.connect(worker=big)
    assert send_of(sc.acquire(bp), bp) == [k]
    out = sc.acquire(bp, (k, OK, -1, None))
    assert sent(out, bp) == [[SHUTDOWN]]  # 4 ordinary blocks are ready: not for it
    assert sc.run().ready == 5


def test_a_kill_seen_before_the_exit_waits_for_the_exit_to_decide() -> None:
    sc = laddered(blocks=3, max_workers=1)
    ((w, _),) = start(sc)
    peer = sc.connect(worker=w)
    send_of(sc.acquire(peer), peer)
    sc.dispatcher.close(peer, sc.now)  # the connection ends first: nothing decided yet
    run = sc.run()
    assert run.processing == 1 and run.failed_attempts == 0 and w.lost is not None
    sc.exit(w, OOM_EXIT)
    assert run.oom_retries == {"200M": 1} and run.failed_attempts == 0
    assert sc.plans["t"].memory.held_back == 1


def test_a_worker_lost_for_another_reason_charges_its_block_as_before() -> None:
    sc = laddered(blocks=3, max_workers=1)
    ((w, _),) = start(sc)
    peer = sc.connect(worker=w)
    (k,) = send_of(sc.acquire(peer), peer)
    sc.dispatcher.close(peer, sc.now)
    sc.exit(w, WorkerExit("error", -11, "bellis worker subprocess exited with code -11"))
    run = sc.run()
    assert run.failed_attempts == 1 and run.retries == {k: 1} and run.oom_retries == {}


def test_two_connections_of_one_worker_lost_together_leave_no_block_behind() -> None:
    """A worker with two clients (each holding a block) loses both connections before its
    exit is seen: the first connection's block waits for the exit, the second's is
    released at once; none stays out for ever."""
    sc = laddered(blocks=4, max_workers=1)
    ((w, _),) = start(sc)
    first, second = sc.connect(worker=w), sc.connect(worker=w)
    (k1,) = send_of(sc.acquire(first), first)
    (k2,) = send_of(sc.acquire(second), second)
    sc.dispatcher.close(first, sc.now)
    sc.dispatcher.close(second, sc.now)
    run = sc.run()
    assert w.lost is not None and w.lost[1] == [k1]
    assert run.processing == 1 and run.retries == {k2: 1}
    sc.exit(w, OOM_EXIT)
    assert run.oom_retries == {"200M": 1} and sc.plans["t"].memory.held_back == 1


def test_an_oom_with_a_batch_makes_suspects_not_climbers() -> None:
    sc = laddered(blocks=40, max_workers=1)
    ((w, _),) = start(sc)
    peer = sc.connect(worker=w)
    peer.batch = 4
    held = send_of(sc.acquire(peer), peer)
    assert len(held) == 4
    sc.dispatcher.close(peer, sc.now)
    sc.exit(w, OOM_EXIT)
    plan = sc.plans["t"]
    assert plan.suspects == set(held) and plan.memory.held_back == 0


def test_a_block_out_of_memory_at_the_cap_fails_for_good_naming_the_grant() -> None:
    sc = laddered(blocks=2, max_workers=1)
    ((w, _),) = start(sc)
    peer = sc.connect(worker=w)
    (k,) = send_of(sc.acquire(peer), peer)
    for step in (1, 2):
        sc.acquire(peer, (k, OUT_OF_MEMORY, -1, "MemoryError"), op=BYE)
        sc.exit(w, WorkerExit("error", 89, "out of memory: MemoryError"))
        w = next(x for x, s in start(sc) if s == step)
        peer = sc.connect(worker=w)
        assert send_of(sc.acquire(peer), peer) == [k]
    sc.acquire(peer, (k, OUT_OF_MEMORY, -1, "MemoryError"), op=BYE)
    run = sc.run()
    assert run.failed == 1 and run.oom_failures == 1
    assert run.oom_retries == {"200M": 1, "400M": 1}
    assert "ran out of memory with 400M, the largest grant" in (run.last_worker_error or "")


def test_a_big_workers_ordinary_failure_is_charged_and_retried_on_a_big_worker() -> None:
    sc = laddered(blocks=3, max_workers=1)
    ((w, _),) = start(sc)
    peer = sc.connect(worker=w)
    (k,) = send_of(sc.acquire(peer), peer)
    sc.acquire(peer, (k, OUT_OF_MEMORY, -1, "MemoryError"), op=BYE)
    big = next(x for x, s in start(sc) if s == 1)
    bp = sc.connect(worker=big)
    assert send_of(sc.acquire(bp), bp) == [k]
    sc.acquire(bp, (k, FAIL, -1, "ValueError"), op=BYE)
    run, mem = sc.run(), sc.plans["t"].memory
    assert run.failed_attempts == 1 and mem.need == {k: 1} and mem.held_back == 1
    assert run.ready == 2  # not back in the ordinary queue


def test_waiting_blocks_are_lost_with_a_task_out_of_restarts() -> None:
    sc = laddered(blocks=1, max_workers=1, max_worker_restarts=0)
    ((w, _),) = start(sc)
    peer = sc.connect(worker=w)
    (k,) = send_of(sc.acquire(peer), peer)
    sc.acquire(peer, (k, OUT_OF_MEMORY, -1, "MemoryError"), op=BYE)
    sc.exit(w, WorkerExit("error", 89, "out of memory: MemoryError"))
    crash = WorkerExit("error", 1, "bellis worker subprocess exited with code 1")
    # the climb's big worker is no restart, and the OOM death gave its start back
    for _ in range(2):
        (big, step), *_ = start(sc)
        assert step == 1 and sc.run().worker_restarts == 0
        sc.exit(big, crash)
    sc.dispatcher.tick(sc.now)
    sc.take()
    run = sc.run()
    assert run.status == ABANDONED and run.orphaned == 1 and run.processing == 0


def test_a_big_worker_charges_its_grant_and_waits_for_room_in_the_budget() -> None:
    sc = laddered(blocks=2, max_workers=2, requires={"mem": 100}, resources={"mem": 250})
    (w, _), (other, _) = start(sc)
    assert sc.dispatcher.used == {"mem": 200}
    peer, op = sc.connect(worker=w), sc.connect(worker=other)
    (k,) = send_of(sc.acquire(peer), peer)
    (j,) = send_of(sc.acquire(op), op)
    sc.acquire(peer, (k, OUT_OF_MEMORY, -1, "MemoryError"), op=BYE)
    sc.exit(w, WorkerExit("error", 89, "out of memory: MemoryError"))
    # 100 + a 200M big worker is over the 250 of the budget: it waits for room
    assert start(sc) == [] and sc.dispatcher.used == {"mem": 100}
    assert sent(sc.acquire(op, (j, OK, -1, None)), op) == [[SHUTDOWN]]
    other.earned = True
    sc.exit(other, WorkerExit("clean", 0, ""))
    assert [s for _, s in start(sc)] == [1] and sc.dispatcher.used == {"mem": 200}


def test_a_parked_ordinary_worker_makes_room_for_a_big_one() -> None:
    # with conflicts, the blocks that read the one waiting for memory keep ordinary workers
    # parked: one of them is told to stop so that the big worker fits in the budget
    t = daisy.Task(
        "t",
        daisy.Roi((0,), (100,)),
        daisy.Roi((-10,), (30,)),
        daisy.Roi((0,), (10,)),
        process_function=lambda b: None,
        max_workers=2,
        requires={"mem": 100},
        memory_limit="100M",
        fit="shrink",
    )
    sc = Script(t, {"mem": 250})
    plan = sc.plans["t"]
    ladder = ladder_for(TaskSpec.of(t), daisy.LocalLauncher(), {"mem": 250})
    assert ladder is not None
    plan.memory = MemoryRetries(ladder, plan.run)
    (w, _), (other, _) = start(sc)
    peer, op = sc.connect(worker=w), sc.connect(worker=other)
    (k,) = send_of(sc.acquire(peer), peer)
    sc.acquire(peer, (k, OUT_OF_MEMORY, -1, "MemoryError"), op=BYE)
    got = sc.acquire(op)
    while sent(got, op):  # the other blocks it can run, then it parks
        (j,) = send_of(got, op)
        got = sc.acquire(op, (j, OK, -1, None))
    assert op.parked and sc.run().pending > 0
    sc.exit(w, WorkerExit("error", 89, "out of memory: MemoryError"))
    sc.dispatcher.rebalance(sc.now)
    assert sent(sc.take(), op) == [[SHUTDOWN]]
    other.earned = True
    sc.exit(other, WorkerExit("clean", 0, ""))
    assert [s for _, s in start(sc)] == [1]


def test_blocks_of_a_dropped_connection_whose_process_goes_on_are_released_in_time() -> None:
    sc = laddered(blocks=3, max_workers=1)
    ((w, _),) = start(sc)
    peer = sc.connect(worker=w)
    (k,) = send_of(sc.acquire(peer), peer)
    sc.dispatcher.close(peer, sc.now)
    sc.now += 29.0
    sc.dispatcher.tick(sc.now)
    assert sc.run().processing == 1
    sc.now += 2.0
    sc.dispatcher.tick(sc.now)
    run = sc.run()
    assert run.processing == 0 and run.retries == {k: 1} and w.lost is None
    sc.exit(w, OOM_EXIT)  # its exit, later, finds nothing left to release
    assert run.oom_retries == {} and sc.plans["t"].memory.held_back == 0


def test_a_worker_out_of_memory_outside_any_block_spends_its_start() -> None:
    sc = laddered(blocks=3, max_workers=1, max_worker_restarts=1)
    ((w, _),) = start(sc)
    sc.exit(w, WorkerExit("error", 89, "out of memory: MemoryError"))
    ((w, _),) = start(sc)
    assert sc.run().worker_restarts == 1
    sc.exit(w, WorkerExit("error", 89, "out of memory: MemoryError"))
    assert start(sc) == []  # no start left: it cannot loop for ever


def test_slurm_launcher_takes_the_ladder_and_asks_for_each_grant() -> None:
    from bellis._launchers._base import WorkerSpec

    lau = daisy.SlurmLauncher(mem="4G", memory_growth=2, max_memory="64G")
    assert (lau.memory_request, lau.memory_growth, lau.max_memory) == (4 << 30, 2.0, 64 << 30)
    lad = ladder_for(TaskSpec.of(task()), lau, {})
    assert lad is not None and [lad.text(s) for s in range(lad.top + 1)] == [
        "4G",
        "8G",
        "16G",
        "32G",
        "64G",
    ]

    def flags(memory: int | None) -> list[str]:
        spec = WorkerSpec("t", 0, {}, b"", None, None, memory=memory)
        return [f for f in lau._resource_flags(spec) if f.startswith("--mem")]

    assert flags(None) == flags(4 << 30) == ["--mem=4G"]  # the request, as given
    assert flags(8 << 30) == ["--mem=8192M"]
    assert daisy.SlurmLauncher(mem=150).memory_request == 150 * MIB  # an int is megabytes


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"mem": "4G", "max_memory": "2G"}, "max_memory"),
        ({"mem": "4G", "memory_growth": 1}, "memory_growth"),
        ({"mem": "4G", "max_memory": "lots"}, "max_memory"),
    ],
)
def test_slurm_launcher_refuses_a_ladder_that_is_not_one(
    kwargs: dict[str, Any], parameter: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        daisy.SlurmLauncher(**kwargs)
    assert info.value.parameter == parameter and parameter in str(info.value)
