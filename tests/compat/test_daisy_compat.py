"""A daisy-style script, unchanged but for ``import bellis as daisy``."""

from __future__ import annotations

import bellis as daisy


def test_v1_list_form_runs_upstream_first() -> None:
    # SPEC §7 item 25: run_blockwise([b]) with b.upstream_tasks = [a]
    written: dict[int, str] = {}
    order: list[tuple[str, int]] = []

    def write_a(block: daisy.Block) -> None:
        start = int(block.write_roi.offset[0])
        for x in range(start, start + int(block.write_roi.shape[0])):
            written[x] = "a"
        order.append(("a", block.block_id[1]))

    def read_b(block: daisy.Block) -> None:
        begin = int(block.read_roi.offset[0])
        end = begin + int(block.read_roi.shape[0])
        # everything b reads that a writes is there already
        assert all(written.get(x) == "a" for x in range(max(begin, 0), min(end, 40)))
        order.append(("b", block.block_id[1]))

    a = daisy.Task(
        "a",
        daisy.Roi((0,), (40,)),
        daisy.Roi((0,), (10,)),
        daisy.Roi((0,), (10,)),
        process_function=write_a,
        read_write_conflict=False,
    )
    b = daisy.Task(
        "b",
        daisy.Roi((0,), (40,)),
        daisy.Roi((-5,), (20,)),
        daisy.Roi((0,), (10,)),
        process_function=read_b,
        read_write_conflict=False,
    )
    b.upstream_tasks = [a]
    ok = daisy.run_blockwise([b], multiprocessing=False, progress=False, summary=False)
    assert ok is True
    assert sorted(x for t, x in order if t == "a") == [0, 1, 2, 3]
    assert sorted(x for t, x in order if t == "b") == [0, 1, 2]
    assert len(order) == 7


def test_serial_run_returns_states() -> None:
    seen = []
    task = daisy.Task(
        "t",
        daisy.Roi((0, 0), (20, 30)),
        daisy.Roi((0, 0), (10, 10)),
        daisy.Roi((0, 0), (10, 10)),
        process_function=lambda block: seen.append(block.block_id),
    )
    states = daisy.run_blockwise(
        [task], multiprocessing=False, progress=False, summary=False, return_states=True
    )
    assert states["t"].completed_count == 6
    assert sorted(s for _, s in seen) == [0, 1, 2, 3, 4, 7]
