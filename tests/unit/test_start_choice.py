"""The local launcher's start policy (``_zygote.choose_start``): spawn while every worker
has a core, fork from the zygote once more workers than cores run, and start the zygote
beside a replacement so that the next ones are forked."""

from __future__ import annotations

import pytest

from bellis._launchers._zygote import StartChoice, choose_start

FORK = StartChoice(fork=True, start_zygote=False)
FORK_AND_START = StartChoice(fork=True, start_zygote=True)
SPAWN = StartChoice(fork=False, start_zygote=False)
SPAWN_AND_START = StartChoice(fork=False, start_zygote=True)


@pytest.mark.parametrize(
    ("live", "batch", "cpus", "expected"),
    [
        (0, 1, 2, SPAWN),  # dist_noop_w1 on 2 cores
        (0, 2, 2, SPAWN),  # w2: a core for each
        (0, 4, 2, FORK_AND_START),  # w4 on 2 cores: one interpreter start, four forks
        (0, 3, 2, FORK_AND_START),
        (2, 2, 2, FORK_AND_START),  # a pipeline's second task: four would run at once
        (1, 1, 2, SPAWN),
        (0, 32, 32, SPAWN),  # a core per worker
        (0, 33, 32, FORK_AND_START),
        (0, 1, 1, SPAWN),
        (1, 1, 1, FORK_AND_START),
    ],
)
def test_first_starts(live: int, batch: int, cpus: int, expected: StartChoice) -> None:
    assert (
        choose_start(zygote_running=False, live=live, batch=batch, restart=False, cpus=cpus)
        == expected
    )


def test_a_replacement_is_spawned_and_starts_the_zygote_for_the_next() -> None:
    assert (
        choose_start(zygote_running=False, live=0, batch=1, restart=True, cpus=2) == SPAWN_AND_START
    )
    # more workers than cores: forked, as a first start would be
    assert (
        choose_start(zygote_running=False, live=2, batch=1, restart=True, cpus=2) == FORK_AND_START
    )


@pytest.mark.parametrize("restart", [False, True])
@pytest.mark.parametrize(("live", "batch"), [(0, 1), (0, 2), (5, 10)])
def test_once_the_zygote_runs_every_worker_is_forked(restart: bool, live: int, batch: int) -> None:
    assert (
        choose_start(zygote_running=True, live=live, batch=batch, restart=restart, cpus=2) == FORK
    )


@pytest.mark.parametrize(
    ("expected", "choice"),
    [
        (0, SPAWN),  # unknown: as many as start now
        (2, SPAWN),  # dist_noop_w2 on 2 cores
        (4, FORK_AND_START),  # a 2-task pipeline of 2 workers each: its first 2 are forked
    ],
)
def test_what_the_run_expects_counts_from_its_first_worker(
    expected: int, choice: StartChoice
) -> None:
    assert (
        choose_start(
            zygote_running=False, live=0, batch=2, restart=False, cpus=2, expected=expected
        )
        == choice
    )
