"""Record reference behaviour of the released daisy 2.0.0 for bellis' compatibility tests.

Run it with an interpreter that has daisy 2.0.0 and zarr installed, e.g. the benchmark anchor::

    .anchors/daisy2/bin/python tools/make_daisy_reference.py

It writes ``tests/compat/daisy_reference.json`` and replaces ``tests/compat/daisy_store_fixture/``
with a tracking store written by daisy. Everything it records except the fixture's resource figures
is deterministic, so running it twice gives the same JSON.

What the JSON holds:

- ``tasks``: per small task, the blocks ``Scheduler(task)`` hands out when each acquired block is
  released as SUCCESS at once (``serial_order``), the rounds of blocks that are ready together when
  the scheduler is drained before releasing (``batch_rounds``), ``block_grid_shape`` and, for small
  cases, the ``BlockwiseDependencyGraph`` figures and its ``enumerate_all_dependencies()``.
- ``pipelines``: the same two loops for ``a + b`` pipelines, acquiring from the tasks in turn.
- ``tracking``: ``daisy_task_hash`` of the stores daisy writes for several layouts, and a
  description of the fixture store.
- ``text``: ``repr(TaskState)`` in several states and the execution summaries daisy prints.

A block is recorded as ``[spatial_id, read_offset, read_shape, write_offset, write_shape]``.
"""

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import daisy

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "tests" / "compat" / "daisy_reference.json"
DEFAULT_FIXTURE = REPO / "tests" / "compat" / "daisy_store_fixture"

# Dependency lists are recorded only up to this many blocks, to keep the file small.
MAX_DEPGRAPH_BLOCKS = 64


def roi(offset, shape):
    return daisy.Roi(tuple(offset), tuple(shape))


def ints(values):
    return [int(v) for v in values]


def block_record(block):
    return [
        int(block.block_id[1]),
        ints(block.read_roi.offset),
        ints(block.read_roi.shape),
        ints(block.write_roi.offset),
        ints(block.write_roi.shape),
    ]


def error_text(exc):
    return f"{type(exc).__name__}: {exc}"


def noop(block):
    return None


# --------------------------------------------------------------------------------------------------
# (a) single tasks


def task_cases():
    """(name, total, read, write, read_write_conflict, fit); each ROI is (offset, shape)."""
    cases = []
    fits = ("valid", "overhang", "shrink")

    # 1D: the spec's tracking-grid example, a total that is not a block multiple, no context
    for fit in fits:
        cases.append(
            (f"1d_ctx10_conflict_{fit}", ((0,), (100,)), ((-10,), (30,)), ((0,), (10,)), True, fit)
        )
        cases.append(
            (
                f"1d_ctx10_95_conflict_{fit}",
                ((0,), (95,)),
                ((-10,), (30,)),
                ((0,), (10,)),
                True,
                fit,
            )
        )
        cases.append(
            (f"1d_noctx_95_{fit}", ((0,), (95,)), ((0,), (10,)), ((0,), (10,)), False, fit)
        )
        cases.append(
            (
                f"1d_ctx3_97_noconflict_{fit}",
                ((0,), (97,)),
                ((-3,), (16,)),
                ((0,), (10,)),
                False,
                fit,
            )
        )
    # 1D: context wider than a block, with and without conflicts
    for conflict in (True, False):
        cases.append(
            (
                f"1d_ctx25_conflict{conflict}",
                ((0,), (120,)),
                ((-25,), (60,)),
                ((0,), (10,)),
                conflict,
                "valid",
            )
        )

    # 2D: context smaller than a block
    for fit in fits:
        for conflict in (True, False):
            cases.append(
                (
                    f"2d_ctx5_{'conflict' if conflict else 'noconflict'}_{fit}",
                    ((0, 0), (43, 37)),
                    ((-5, -5), (20, 20)),
                    ((0, 0), (10, 10)),
                    conflict,
                    fit,
                )
            )
    # 2D: context exactly one block, and wider than one block
    for conflict in (True, False):
        tag = "conflict" if conflict else "noconflict"
        cases.append(
            (
                f"2d_ctx10_{tag}",
                ((0, 0), (60, 50)),
                ((-10, -10), (30, 30)),
                ((0, 0), (10, 10)),
                conflict,
                "valid",
            )
        )
        cases.append(
            (
                f"2d_ctx15_{tag}",
                ((0, 0), (70, 62)),
                ((-15, -15), (40, 40)),
                ((0, 0), (10, 10)),
                conflict,
                "overhang",
            )
        )
    # 2D: asymmetric context, non-square blocks, shifted and negative offsets
    for conflict in (True, False):
        tag = "conflict" if conflict else "noconflict"
        cases.append(
            (
                f"2d_asym_offset_{tag}",
                ((3, -7), (41, 29)),
                ((-2, -4), (14, 12)),
                ((0, 0), (8, 5)),
                conflict,
                "shrink",
            )
        )
    # 2D: no context, conflicts requested (no overlap, so nothing to wait for)
    cases.append(
        (
            "2d_noctx_conflict",
            ((0, 0), (30, 20)),
            ((0, 0), (10, 10)),
            ((0, 0), (10, 10)),
            True,
            "valid",
        )
    )
    # 2D: the total is smaller than one block (non-conflict)
    for fit in fits:
        cases.append(
            (
                f"2d_total_lt_block_{fit}",
                ((0, 0), (7, 5)),
                ((0, 0), (10, 10)),
                ((0, 0), (10, 10)),
                False,
                fit,
            )
        )
    cases.append(
        (
            "1d_total_lt_block_overhang_ctx",
            ((0,), (12,)),
            ((-2,), (14,)),
            ((0,), (10,)),
            False,
            "overhang",
        )
    )

    # 3D
    for fit in fits:
        cases.append(
            (
                f"3d_ctx5_conflict_{fit}",
                ((0, 0, 0), (32, 27, 35)),
                ((-5, -5, -5), (20, 20, 20)),
                ((0, 0, 0), (10, 10, 10)),
                True,
                fit,
            )
        )
    cases.append(
        (
            "3d_ctx2_noconflict",
            ((0, 0, 0), (24, 24, 24)),
            ((-2, -2, -2), (12, 12, 12)),
            ((0, 0, 0), (8, 8, 8)),
            False,
            "valid",
        )
    )
    cases.append(
        (
            "3d_ctx8_conflict",
            ((0, 0, 0), (40, 40, 40)),
            ((-8, -8, -8), (24, 24, 24)),
            ((0, 0, 0), (8, 8, 8)),
            True,
            "valid",
        )
    )
    return cases


def make_task(task_id, total, read, write, conflict, fit, process_function=noop, **kwargs):
    return daisy.Task(
        task_id,
        roi(*total),
        roi(*read),
        roi(*write),
        process_function=process_function,
        read_write_conflict=conflict,
        fit=fit,
        max_workers=1,
        **kwargs,
    )


def drain_one_by_one(scheduler, task_ids):
    """Acquire from the tasks in turn, releasing each block as SUCCESS at once, until none comes."""
    order = []
    while True:
        progressed = False
        for task_id in task_ids:
            block = scheduler.acquire_block(task_id)
            if block is None:
                continue
            progressed = True
            rec = block_record(block)
            order.append(rec if len(task_ids) == 1 else [task_id, *rec])
            block.status = daisy.BlockStatus.SUCCESS
            scheduler.release_block(block)
        if not progressed:
            return order


def drain_in_rounds(scheduler, task_ids):
    """Acquire all that is ready (task by task, each until None), release all as SUCCESS; repeat."""
    rounds = []
    while True:
        held = []
        for task_id in task_ids:
            while True:
                block = scheduler.acquire_block(task_id)
                if block is None:
                    break
                held.append(block)
        if not held:
            return rounds
        if len(task_ids) == 1:
            rounds.append([int(b.block_id[1]) for b in held])
        else:
            rounds.append([[b.block_id[0], int(b.block_id[1])] for b in held])
        for block in held:
            block.status = daisy.BlockStatus.SUCCESS
            scheduler.release_block(block)


def state_counts(state):
    return {
        "total": state.total_block_count,
        "completed": state.completed_count,
        "skipped": state.skipped_count,
        "failed": state.failed_count,
        "orphaned": state.orphaned_count,
        "pending": state.pending_count,
        "ready": state.ready_count,
        "processing": state.processing_count,
    }


def record_task(name, total, read, write, conflict, fit):
    entry = {
        "name": name,
        "total_roi": [list(total[0]), list(total[1])],
        "read_roi": [list(read[0]), list(read[1])],
        "write_roi": [list(write[0]), list(write[1])],
        "read_write_conflict": conflict,
        "fit": fit,
    }
    try:
        task = make_task("t", total, read, write, conflict, fit)
    except Exception as exc:  # the error text is part of the reference
        entry["error"] = error_text(exc)
        return entry
    entry["block_grid_shape"] = ints(task.block_grid_shape)
    try:
        scheduler = daisy.Scheduler(task)
        entry["serial_order"] = drain_one_by_one(scheduler, ["t"])
        entry["final_counts"] = state_counts(scheduler.task_states["t"])
        entry["batch_rounds"] = drain_in_rounds(
            daisy.Scheduler(make_task("t", total, read, write, conflict, fit)), ["t"]
        )
    except Exception as exc:
        entry["scheduler_error"] = error_text(exc)
    try:
        graph = daisy.BlockwiseDependencyGraph(
            "t", roi(*read), roi(*write), conflict, fit, total_read_roi=roi(*total)
        )
        depgraph = {
            "num_blocks": graph.num_blocks,
            "num_levels": graph.num_levels,
            "num_roots": graph.num_roots(),
        }
        if graph.num_blocks <= MAX_DEPGRAPH_BLOCKS:
            depgraph["dependencies"] = [
                [int(block.block_id[1]), [int(up.block_id[1]) for up in ups]]
                for block, ups in graph.enumerate_all_dependencies()
            ]
        entry["depgraph"] = depgraph
    except Exception as exc:
        entry["depgraph_error"] = error_text(exc)
    return entry


# --------------------------------------------------------------------------------------------------
# (b) pipelines


def pipeline_cases():
    """(name, a spec, b spec); a spec is (total, read, write, conflict, fit)."""
    return [
        (
            "2d_a_noctx_b_ctx5",
            (((0, 0), (40, 40)), ((0, 0), (10, 10)), ((0, 0), (10, 10)), False, "valid"),
            (((0, 0), (40, 40)), ((-5, -5), (20, 20)), ((0, 0), (10, 10)), False, "valid"),
        ),
        (
            "2d_a_noctx_b_ctx5_conflict",
            (((0, 0), (40, 40)), ((0, 0), (10, 10)), ((0, 0), (10, 10)), False, "valid"),
            (((0, 0), (40, 40)), ((-5, -5), (20, 20)), ((0, 0), (10, 10)), True, "valid"),
        ),
        (
            "1d_both_ctx_conflict",
            (((0,), (100,)), ((-5,), (20,)), ((0,), (10,)), True, "valid"),
            (((0,), (100,)), ((-10,), (30,)), ((0,), (10,)), True, "overhang"),
        ),
    ]


def record_pipeline(name, a_spec, b_spec):
    entry = {"name": name}
    for label, spec in (("a", a_spec), ("b", b_spec)):
        total, read, write, conflict, fit = spec
        entry[label] = {
            "total_roi": [list(total[0]), list(total[1])],
            "read_roi": [list(read[0]), list(read[1])],
            "write_roi": [list(write[0]), list(write[1])],
            "read_write_conflict": conflict,
            "fit": fit,
        }

    def build():
        a = make_task("a", *a_spec)
        b = make_task("b", *b_spec)
        return a + b

    try:
        pipeline = build()
        entry["edges"] = [[up.task_id, down.task_id] for up, down in pipeline.edges]
        scheduler = daisy.Scheduler(pipeline)
        entry["alternating_order"] = drain_one_by_one(scheduler, ["a", "b"])
        entry["final_counts"] = {
            tid: state_counts(st) for tid, st in sorted(scheduler.task_states.items())
        }
        entry["batch_rounds"] = drain_in_rounds(daisy.Scheduler(build()), ["a", "b"])
    except Exception as exc:
        entry["error"] = error_text(exc)
    return entry


# --------------------------------------------------------------------------------------------------
# (c) tracking stores


def hash_layouts():
    return [
        ("2d_noctx_valid", ((0, 0), (40, 30)), ((0, 0), (10, 10)), ((0, 0), (10, 10)), "valid"),
        (
            "2d_noctx_overhang",
            ((0, 0), (40, 30)),
            ((0, 0), (10, 10)),
            ((0, 0), (10, 10)),
            "overhang",
        ),
        ("2d_noctx_shrink", ((0, 0), (40, 30)), ((0, 0), (10, 10)), ((0, 0), (10, 10)), "shrink"),
        ("1d_ctx10", ((0,), (100,)), ((-10,), (30,)), ((0,), (10,)), "valid"),
        (
            "2d_negative_offsets",
            ((-20, 5), (43, 37)),
            ((-5, -3), (20, 16)),
            ((0, 0), (10, 10)),
            "overhang",
        ),
        (
            "3d_ctx2",
            ((0, 0, 0), (20, 16, 12)),
            ((-2, -2, -2), (12, 12, 12)),
            ((0, 0, 0), (8, 8, 8)),
            "shrink",
        ),
    ]


def read_group_attrs(path):
    with open(Path(path) / "zarr.json") as f:
        return json.load(f)


def record_hashes(workdir):
    out = []
    for name, total, read, write, fit in hash_layouts():
        path = workdir / "hash" / name
        task = make_task(name, total, read, write, False, fit, tracking_path=str(path))
        entry = {
            "name": name,
            "total_roi": [list(total[0]), list(total[1])],
            "read_roi": [list(read[0]), list(read[1])],
            "write_roi": [list(write[0]), list(write[1])],
            "fit": fit,
        }
        try:
            with capture_stdout():
                daisy.run_blockwise(task, multiprocessing=False, progress=False, summary=False)
            group = read_group_attrs(path)
            entry["daisy_task_hash"] = group["attributes"]["daisy_task_hash"]
            entry["arrays"] = sorted(p.name for p in path.iterdir() if p.is_dir())
        except Exception as exc:
            entry["error"] = error_text(exc)
        out.append(entry)
    return out


FIXTURE_LAYOUT = {
    "task_id": "fixture",
    "total_roi": ((0, 0), (24, 34)),
    "read_roi": ((-2, -2), (14, 14)),
    "write_roi": ((0, 0), (10, 10)),
    "fit": "valid",
    "read_write_conflict": False,
    "failing_block_write_offset": (12, 22),
}


def make_fixture_store(workdir, fixture_dir):
    """Run a tracked 2D task serially, one block failing on its first attempt; copy the store."""
    layout = FIXTURE_LAYOUT
    store = workdir / "fixture_store"
    marker = workdir / "fixture_failed_once"
    failing = tuple(layout["failing_block_write_offset"])

    def process(block):
        if tuple(block.write_roi.offset) == failing and not marker.exists():
            marker.touch()
            block.status = daisy.BlockStatus.FAILED

    task = make_task(
        layout["task_id"],
        layout["total_roi"],
        layout["read_roi"],
        layout["write_roi"],
        layout["read_write_conflict"],
        layout["fit"],
        process_function=process,
        tracking_path=str(store),
        resource_tracking=True,
    )
    with capture_stdout():
        states = daisy.run_blockwise(
            task, multiprocessing=False, progress=False, return_states=True, summary=False
        )
    if fixture_dir.exists():
        shutil.rmtree(fixture_dir)
    shutil.copytree(store, fixture_dir)

    import zarr

    group = zarr.open_group(str(fixture_dir), mode="r")
    arrays = {}
    for name in sorted(p.name for p in fixture_dir.iterdir() if p.is_dir()):
        arr = group[name]
        arrays[name] = {"shape": ints(arr.shape), "dtype": str(arr.dtype)}
    files = sorted(str(p.relative_to(fixture_dir)) for p in fixture_dir.rglob("*") if p.is_file())
    return {
        "task_id": layout["task_id"],
        "total_roi": [list(x) for x in layout["total_roi"]],
        "read_roi": [list(x) for x in layout["read_roi"]],
        "write_roi": [list(x) for x in layout["write_roi"]],
        "fit": layout["fit"],
        "read_write_conflict": layout["read_write_conflict"],
        "resource_tracking": True,
        "failing_block_write_offset": list(failing),
        "block_grid_shape": ints(task.block_grid_shape),
        "daisy_task_hash": read_group_attrs(fixture_dir)["attributes"]["daisy_task_hash"],
        "files": files,
        "arrays": arrays,
        "done": group["done"][:].tolist(),
        "failures": group["failures"][:].tolist(),
        "final_counts": state_counts(states[layout["task_id"]]),
    }


# --------------------------------------------------------------------------------------------------
# (d) printed text


@contextlib.contextmanager
def capture_stdout(sink=None):
    """Capture file descriptor 1 (daisy prints the summary to the real stdout) into ``sink``."""
    sys.stdout.flush()
    sys.__stdout__.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 1)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.__stdout__.flush()
            os.dup2(saved, 1)
            os.close(saved)
            tmp.seek(0)
            if sink is not None:
                sink.append(tmp.read().decode("utf-8"))


def record_text(workdir):
    text = {}
    total, read, write = ((0, 0), (20, 30)), ((0, 0), (10, 10)), ((0, 0), (10, 10))

    scheduler = daisy.Scheduler(make_task("t", total, read, write, False, "valid"))
    text["task_state_repr_fresh"] = repr(scheduler.task_states["t"])
    block = scheduler.acquire_block("t")
    text["task_state_repr_one_processing"] = repr(scheduler.task_states["t"])
    block.status = daisy.BlockStatus.SUCCESS
    scheduler.release_block(block)
    text["task_state_repr_one_completed"] = repr(scheduler.task_states["t"])

    sink = []
    with capture_stdout(sink):
        states = daisy.run_blockwise(
            make_task("t", total, read, write, False, "valid"),
            multiprocessing=False,
            progress=False,
            return_states=True,
            summary=True,
        )
    text["summary_serial_success"] = sink[0]
    text["task_state_repr_after_success_run"] = repr(states["t"])

    def always_fail(block):
        if tuple(block.write_roi.offset) == (10, 10):
            block.status = daisy.BlockStatus.FAILED

    sink = []
    with capture_stdout(sink):
        try:
            result = daisy.run_blockwise(
                make_task(
                    "t",
                    total,
                    read,
                    write,
                    False,
                    "valid",
                    process_function=always_fail,
                    max_retries=0,
                ),
                multiprocessing=False,
                progress=False,
                summary=True,
            )
            text["serial_permanent_failure_returned"] = repr(result)
        except Exception as exc:
            text["serial_permanent_failure_raised"] = error_text(exc)
    text["summary_serial_permanent_failure"] = sink[0]

    # the same through return_states=True, for the counters and the repr
    with capture_stdout():
        states = daisy.run_blockwise(
            make_task(
                "t", total, read, write, False, "valid", process_function=always_fail, max_retries=0
            ),
            multiprocessing=False,
            progress=False,
            return_states=True,
            summary=True,
        )
    text["task_state_repr_after_failure_run"] = repr(states["t"])
    text["first_worker_error_after_failure_run"] = states["t"].first_worker_error

    # a second run over the same tracking store skips every block
    resumed = workdir / "resumed_store"
    for key in ("summary_serial_first_tracked_run", "summary_serial_resumed"):
        sink = []
        with capture_stdout(sink):
            states = daisy.run_blockwise(
                make_task("t", total, read, write, False, "valid", tracking_path=str(resumed)),
                multiprocessing=False,
                progress=False,
                return_states=True,
                summary=True,
            )
        text[key] = sink[0]
    text["task_state_repr_after_resumed_run"] = repr(states["t"])

    # a failure upstream orphans blocks downstream: the summary's ordering and symbols
    def fail_a(block):
        if tuple(block.write_roi.offset) == (0, 0):
            block.status = daisy.BlockStatus.FAILED

    a = make_task("a", total, read, write, False, "valid", process_function=fail_a, max_retries=1)
    b = make_task("b", total, ((-5, -5), (20, 20)), write, False, "valid")
    sink = []
    with capture_stdout(sink):
        try:
            daisy.run_blockwise(a + b, multiprocessing=False, progress=False, summary=True)
        except Exception as exc:
            text["pipeline_failure_raised"] = error_text(exc)
    text["summary_pipeline_failure"] = sink[0]
    return text


# --------------------------------------------------------------------------------------------------
# output


def dump(value, indent=0, width=110):
    """JSON with small values kept on one line, so the file stays short and readable."""
    flat = json.dumps(value, ensure_ascii=False)
    if len(flat) + indent <= width or not isinstance(value, (dict, list)) or not value:
        return flat
    pad = " " * (indent + 1)
    if isinstance(value, dict):
        items = [f"{pad}{json.dumps(k)}: {dump(v, indent + 1, width)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    items = [pad + dump(v, indent + 1, width) for v in value]
    return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--fixture", type=Path, default=DEFAULT_FIXTURE)
    args = parser.parse_args()
    out = args.out.resolve()
    fixture = args.fixture.resolve()

    version = getattr(daisy, "__version__", "unknown")
    if version != "2.0.0":
        print(f"warning: recording daisy {version}, not 2.0.0", file=sys.stderr)

    here = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="daisy_reference_") as tmp:
        workdir = Path(tmp)
        # worker logs land in ./daisy_logs; keep them out of the repository
        os.chdir(workdir)
        try:
            reference = {
                "generator": "tools/make_daisy_reference.py",
                "daisy_version": version,
                "block_format": [
                    "spatial_id",
                    "read_offset",
                    "read_shape",
                    "write_offset",
                    "write_shape",
                ],
                "tasks": [record_task(*case) for case in task_cases()],
                "pipelines": [record_pipeline(*case) for case in pipeline_cases()],
                "tracking": {
                    "hashes": record_hashes(workdir),
                    "fixture": make_fixture_store(workdir, fixture),
                },
                "text": record_text(workdir),
            }
        finally:
            os.chdir(here)

    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(dump(reference) + "\n", encoding="utf-8")
    print(f"wrote {out} ({out.stat().st_size} bytes) and {fixture}")


if __name__ == "__main__":
    main()
