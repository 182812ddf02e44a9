"""Local GPU assignment (issue 30, item 1): each local worker of a task with
``requires={"gpu": ...}`` sees its own device(s) through ``CUDA_VISIBLE_DEVICES``.

No GPU is needed: the devices are named (``LocalLauncher(gpus=...)``) or come from the
driver's own ``CUDA_VISIBLE_DEVICES``, and what is checked is what each real worker process
sees. Each test writes a driver script into ``tmp_path`` and runs it in a subprocess: every
block records its worker's pid and ``CUDA_VISIBLE_DEVICES`` in ``records/``; the slot logs'
headers and the task's report say which GPU each worker was given.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

_PREAMBLE = """
import json, os, sys, time
import bellis
from bellis import logging as blog

def record(block):
    sid = int(block.block_id[1])
    with open(f"records/{sid}_{os.getpid()}", "w") as f:
        f.write(os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"))
    if sid == 3 and not os.path.exists("crashed"):
        open("crashed", "w").close()
        os._exit(3)  # this worker dies in its block: its replacement takes its slot
    time.sleep(0.2)

def make_task(n, **kwargs):
    return bellis.Task(
        "g",
        bellis.Roi((0,), (n,)),
        bellis.Roi((0,), (1,)),
        bellis.Roi((0,), (1,)),
        process_function=record,
        read_write_conflict=False,
        max_retries=3,
        **kwargs,
    )

def dump_workers(task):
    report = task.report()
    out = {r.worker_id: {"slot": r.slot, "gpus": r.gpus} for r in report.workers.records}
    with open("workers.json", "w") as f:
        json.dump(out, f)

os.makedirs("records", exist_ok=True)
blog.set_log_basedir("logs")
"""

_HEADER = re.compile(
    r"^=== bellis worker (\d+) \(slot (\d+)(?:, GPU ([^)]*))?\) started \S+: (.*) ===$"
)


def _run(tmp_path: Path, body: str, env: dict[str, str] | None = None) -> str:
    """Run the driver script; it must succeed. Its stdout."""
    script = tmp_path / "driver.py"
    script.write_text(_PREAMBLE + body)
    full = {**os.environ, **(env or {})}
    src = str(Path(__file__).resolve().parents[2] / "src")
    full["PYTHONPATH"] = os.pathsep.join(p for p in (src, full.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=full,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _seen(tmp_path: Path) -> dict[int, str]:
    """``{pid: the CUDA_VISIBLE_DEVICES it had}``, from every block's record (a pid seen
    with two values fails here)."""
    seen: dict[int, str] = {}
    for f in (tmp_path / "records").iterdir():
        pid = int(f.name.split("_")[1])
        value = f.read_text()
        assert seen.setdefault(pid, value) == value, f"pid {pid}: {seen[pid]} then {value}"
    return seen


def _headers(tmp_path: Path) -> dict[int, list[tuple[int, str | None, str]]]:
    """``{slot: [(worker id, its GPU, why it started)]}`` from the slot logs' headers."""
    out: dict[int, list[tuple[int, str | None, str]]] = {}
    for f in sorted((tmp_path / "logs" / "g").glob("worker_*.err")):
        for line in f.read_text().splitlines():
            m = _HEADER.match(line)
            if m is not None:
                out.setdefault(int(m[2]), []).append((int(m[1]), m[3], m[4]))
    return out


def _workers(tmp_path: Path) -> dict[int, dict[str, object]]:
    raw = json.loads((tmp_path / "workers.json").read_text())
    return {int(k): v for k, v in raw.items()}


def test_four_workers_four_gpus_one_each(tmp_path: Path) -> None:
    out = _run(
        tmp_path,
        """
open("crashed", "w").close()  # no crash here
task = make_task(24, max_workers=4, requires={"gpu": 1})
assert bellis.run_blockwise([task], launcher=bellis.LocalLauncher(gpus=[0, 1, 2, 3]),
                            progress=False)
dump_workers(task)
""",
    )
    seen = _seen(tmp_path)
    assert all(v in {"0", "1", "2", "3"} for v in seen.values()), seen
    assert len(set(seen.values())) == len(seen), f"two workers share a GPU: {seen}"
    headers = _headers(tmp_path)
    assert sorted(headers) == [0, 1, 2, 3]
    gpus = [h[0][1] for h in headers.values()]
    assert sorted(gpus) == ["0", "1", "2", "3"], headers  # type: ignore[type-var]
    workers = _workers(tmp_path)
    assert sorted(w["gpus"][0] for w in workers.values()) == ["0", "1", "2", "3"]  # type: ignore[index]
    by_slot = {w["slot"]: w["gpus"] for w in workers.values()}
    assert by_slot == {s: [h[0][1]] for s, h in headers.items()}
    # the summary's workers table names each worker's GPU in its slot column
    cells = set(re.findall(r"\b(\d) \(GPU (\d)\)", out))
    assert cells == {(str(s), str(h[0][1])) for s, h in headers.items()}, out


def test_a_killed_workers_replacement_gets_its_gpu(tmp_path: Path) -> None:
    _run(
        tmp_path,
        """
task = make_task(12, max_workers=2, requires={"gpu": 1})
assert bellis.run_blockwise([task], launcher=bellis.LocalLauncher(gpus=[5, 6]),
                            progress=False)
dump_workers(task)
""",
    )
    assert (tmp_path / "crashed").exists()
    died = [int(f.name.split("_")[1]) for f in (tmp_path / "records").glob("3_*")]
    seen = _seen(tmp_path)
    assert set(seen.values()) <= {"5", "6"}
    headers = _headers(tmp_path)
    # one slot had two workers: the first died in its block, the second replaced it
    replaced = [s for s, hs in headers.items() if len(hs) == 2]
    assert len(replaced) == 1, headers
    (first, second) = headers[replaced[0]]
    assert second[2].startswith(f"replacing worker {first[0]}"), second
    assert first[1] == second[1] is not None, headers
    # and the processes agree: the dead one and a newer one saw that GPU, no other did
    dead_gpu = {seen[p] for p in died if seen[p] == first[1]}
    assert dead_gpu == {first[1]}
    with_it = [p for p, v in seen.items() if v == first[1]]
    assert len(with_it) == 2, seen
    others = [p for p, v in seen.items() if v != first[1]]
    assert len(others) == 1, seen
    workers = _workers(tmp_path)
    assert [w["gpus"] for w in workers.values()].count([first[1]]) == 2


def test_half_a_gpu_puts_two_workers_on_one(tmp_path: Path) -> None:
    _run(
        tmp_path,
        """
open("crashed", "w").close()
task = make_task(16, max_workers=2, requires={"gpu": 0.5})
assert bellis.run_blockwise([task], launcher=bellis.LocalLauncher(gpus=["GPU-7f00"]),
                            progress=False)
dump_workers(task)
""",
    )
    headers = _headers(tmp_path)
    assert sorted(headers) == [0, 1]
    assert [hs[0][1] for hs in headers.values()] == ["GPU-7f00", "GPU-7f00"]
    seen = _seen(tmp_path)
    assert set(seen.values()) == {"GPU-7f00"}


def test_more_workers_than_gpu_room_wait_their_turn(tmp_path: Path) -> None:
    # 4 workers wanted, 2 GPUs at a whole GPU each: never more than 2 alive, never shared
    _run(
        tmp_path,
        """
open("crashed", "w").close()
task = make_task(12, max_workers=4, requires={"gpu": 1})
assert bellis.run_blockwise([task], launcher=bellis.LocalLauncher(gpus=[0, 1]),
                            progress=False)
dump_workers(task)
""",
    )
    headers = _headers(tmp_path)
    assert sorted(headers) == [0, 1], headers
    assert sorted(hs[0][1] for hs in headers.values()) == ["0", "1"]  # type: ignore[type-var]


def test_the_drivers_cuda_visible_devices_is_split(tmp_path: Path) -> None:
    devices = "GPU-5e0c1a2b-aaaa,MIG-0f9d8c7b-bbbb"
    _run(
        tmp_path,
        """
open("crashed", "w").close()
task = make_task(12, max_workers=2, requires={"gpu": 1})
assert bellis.run_blockwise([task], progress=False)
dump_workers(task)
""",
        env={"CUDA_VISIBLE_DEVICES": devices},
    )
    seen = _seen(tmp_path)
    assert set(seen.values()) <= set(devices.split(","))
    assert len(set(seen.values())) == len(seen)
    headers = _headers(tmp_path)
    assert sorted(hs[0][1] for hs in headers.values()) == sorted(devices.split(","))  # type: ignore[type-var]


def test_a_task_without_gpu_needs_leaves_the_variable_alone(tmp_path: Path) -> None:
    _run(
        tmp_path,
        """
open("crashed", "w").close()
task = make_task(4, max_workers=2)
assert bellis.run_blockwise([task], launcher=bellis.LocalLauncher(gpus=[0, 1]),
                            progress=False)
""",
        env={"CUDA_VISIBLE_DEVICES": "3,4"},
    )
    assert set(_seen(tmp_path).values()) == {"3,4"}
    assert all(hs[0][1] is None for hs in _headers(tmp_path).values())


def test_serial_mode_runs_a_gpu_task_as_it_is(tmp_path: Path) -> None:
    _run(
        tmp_path,
        """
open("crashed", "w").close()
task = make_task(3, requires={"gpu": 0.5})
assert bellis.run_blockwise([task], multiprocessing=False, progress=False)
""",
        env={"CUDA_VISIBLE_DEVICES": "2"},
    )
    assert set(_seen(tmp_path).values()) == {"2"}
    assert len(_seen(tmp_path)) == 1


_OVER = """
try:
    bellis.run_blockwise([task], progress=False{extra})
except bellis.errors.ConfigurationError as exc:
    print("REFUSED", exc.parameter, "|", exc)
else:
    print("RAN")
"""


def test_over_asking_is_a_clear_error(tmp_path: Path) -> None:
    out = _run(
        tmp_path,
        "task = make_task(4, max_workers=2, requires={'gpu': 2})\n"
        + _OVER.format(extra=", launcher=bellis.LocalLauncher(gpus=[0])"),
    )
    assert out.startswith("REFUSED requires |"), out
    assert "requires {'gpu': 2} per worker" in out and "has 1 GPU(s)" in out
    assert "LocalLauncher(gpus=['0'])" in out
    assert not any((tmp_path / "records").iterdir())


def test_asking_for_more_gpus_than_the_machine_shows(tmp_path: Path) -> None:
    out = _run(
        tmp_path,
        "task = make_task(4, max_workers=2, requires={'gpu': 1})\n" + _OVER.format(extra=""),
        env={"CUDA_VISIBLE_DEVICES": ""},
    )
    assert out.startswith("REFUSED requires |"), out
    assert "requires {'gpu': 1} per worker" in out and "has 0 GPU(s)" in out


def test_a_counted_gpu_budget_without_devices_runs_as_daisy_did(tmp_path: Path) -> None:
    """No GPU to assign (none named, none visible, no NVML device) but the user counts
    GPUs with ``resources``: 'gpu' is an abstract resource, as in daisy, with one WARNING;
    the run completes and each worker keeps the driver's CUDA_VISIBLE_DEVICES."""
    out = _run(
        tmp_path,
        """
import logging
open("crashed", "w").close()
seen = []
class Keep(logging.Handler):
    def emit(self, record):
        seen.append(record.getMessage())
logging.getLogger("bellis").addHandler(Keep(logging.WARNING))
task = make_task(6, max_workers=4, requires={"gpu": 1})
assert bellis.run_blockwise([task], resources={"gpu": 2}, progress=False)
print("WARNINGS", json.dumps([m for m in seen if "abstract resource" in m]))
""",
        env={"CUDA_VISIBLE_DEVICES": ""},
    )
    warnings = json.loads(out.split("WARNINGS", 1)[1].strip().splitlines()[0])
    assert len(warnings) == 1, out
    assert 'resources={"gpu": 2}' in warnings[0] and "LocalLauncher(gpus=" in warnings[0]
    records = list((tmp_path / "records").iterdir())
    assert sorted(int(f.name.split("_")[0]) for f in records) == list(range(6))
    assert set(_seen(tmp_path).values()) == {""}
    assert all(h[1] is None for hs in _headers(tmp_path).values() for h in hs)


def test_a_gpu_budget_above_the_devices_is_a_clear_error(tmp_path: Path) -> None:
    out = _run(
        tmp_path,
        "task = make_task(4, max_workers=2, requires={'gpu': 1})\n"
        + _OVER.format(extra=", resources={'gpu': 3}, launcher=bellis.LocalLauncher(gpus=[0, 1])"),
    )
    assert out.startswith("REFUSED resources |"), out
    assert "asks for 3 GPUs" in out and "has 2" in out


def test_a_worker_killed_for_a_block_timeout_gives_its_gpu_to_the_next(tmp_path: Path) -> None:
    # the run retires a worker whose block timed out and starts the next before the killed
    # process is seen to end: the one GPU must be free for it by then
    _run(
        tmp_path,
        """
def hang_once(block):
    record(block)
    if int(block.block_id[1]) == 1 and not os.path.exists("hung"):
        open("hung", "w").close()
        time.sleep(120)

open("crashed", "w").close()
task = make_task(4, max_workers=1, requires={"gpu": 1}, timeout=3)
task.process_function = hang_once
assert bellis.run_blockwise([task], launcher=bellis.LocalLauncher(gpus=["GPU-only"]),
                            progress=False)
dump_workers(task)
""",
    )
    assert (tmp_path / "hung").exists()
    seen = _seen(tmp_path)
    assert len(seen) >= 2 and set(seen.values()) == {"GPU-only"}, seen
    workers = _workers(tmp_path)
    assert len(workers) >= 2 and all(w["gpus"] == ["GPU-only"] for w in workers.values())
