"""Bad input that used to pass silently (issue 35 item 4), driven as a user drives it: a
script in a subprocess, or the ``bellis`` command.

A URL as ``tracking_path``, a negative ROI shape, a block larger than the volume, blocks
that leave part of the volume unwritten, ``bellis status --block`` outside the grid,
``bellis worker`` without a context, ``bellis status --json`` / ``--width 0`` and
``bellis verify`` with nothing to verify.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kit.user_script import run_script

MODES = ["serial", "distributed"]


def _bellis(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("BELLIS_CONTEXT", "DAISY_CONTEXT")}
    return subprocess.run(
        [sys.executable, "-m", "bellis", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**base, **(env or {})},
    )


# ----------------------------------------------------------------------------------------
# tracking_path as a URL

URL_SCRIPT = r"""
import sys

import bellis as daisy

how, url = sys.argv[1], sys.argv[2]
roi = daisy.Roi((0, 0), (20, 20))
if how == "task":
    task = daisy.Task("t", roi, roi, roi, lambda b: None, tracking_path=url)
else:
    daisy.set_tracking_basedir(url)
print("ACCEPTED")
"""


@pytest.mark.parametrize(
    ("how", "url", "scheme"),
    [
        ("task", "gs://bucket/prefix", "gs://"),
        ("task", "file:///data/tracking", "file://"),
        ("basedir", "gs://bucket/prefix", "gs://"),
    ],
)
def test_a_url_as_tracking_path_is_refused(tmp_path: Path, how: str, url: str, scheme: str) -> None:
    proc = run_script(tmp_path, URL_SCRIPT, how, url)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "ACCEPTED" not in proc.stdout
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("bellis.errors.ConfigurationError: "), proc.stderr
    assert f"URL scheme {scheme!r} is not supported (yet)" in last
    assert url in last
    assert sorted(p.name for p in tmp_path.iterdir()) == ["user_script.py"]  # no "gs:" folder


@pytest.mark.parametrize("how", ["task", "basedir"])
def test_an_s3_url_as_tracking_path_is_accepted(tmp_path: Path, how: str) -> None:
    """An s3:// store is a tracking store (docs/cloud.md): accepted, no "s3:" folder."""
    proc = run_script(tmp_path, URL_SCRIPT, how, "s3://bucket/prefix")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ACCEPTED" in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["user_script.py"]


# ----------------------------------------------------------------------------------------
# negative ROI shapes

NEGATIVE_SCRIPT = r"""
import sys

import bellis as daisy

which = sys.argv[1]
rois = {
    "total_roi": daisy.Roi((0, 0), (100, 100)),
    "read_roi": daisy.Roi((0, 0), (10, 10)),
    "write_roi": daisy.Roi((0, 0), (10, 10)),
}
bad = {"total_roi": (-100, 100), "read_roi": (10, -10), "write_roi": (10, -10)}
rois[which] = daisy.Roi((0, 0), bad[which])
try:
    daisy.Task("t", process_function=lambda b: None, tracking_path=False, **rois)
except ValueError as exc:
    print("ERROR", type(exc).__name__, getattr(exc, "parameter", None))
    print(exc)
else:
    print("ACCEPTED")
"""


@pytest.mark.parametrize(
    ("which", "axis", "shape"),
    [("total_roi", 0, "(-100, 100)"), ("read_roi", 1, "(10, -10)")],
)
def test_a_negative_roi_shape_is_refused_at_construction(
    tmp_path: Path, which: str, axis: int, shape: str
) -> None:
    proc = run_script(tmp_path, NEGATIVE_SCRIPT, which)
    assert proc.returncode == 0, proc.stderr
    head, message = proc.stdout.splitlines()[:2]
    assert head == f"ERROR ConfigurationError {which}"
    assert f"{which} has a negative shape on axis {axis}: Roi((0, 0), {shape})" in message
    assert "Roi(begin, end - begin)" in message


def test_a_negative_write_roi_shape_is_still_refused(tmp_path: Path) -> None:
    proc = run_script(tmp_path, NEGATIVE_SCRIPT, "write_roi")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "ERROR ConfigurationError write_roi"


# ----------------------------------------------------------------------------------------
# coverage: a block larger than the volume, blocks that leave part of it unwritten

COVERAGE_SCRIPT = r"""
import json
import sys
import warnings

import bellis as daisy
from bellis.errors import CoverageWarning

mode, total, fit = sys.argv[1], int(sys.argv[2]), sys.argv[3]


def process(block):
    pass


task = daisy.Task(
    "t",
    total_roi=daisy.Roi((0, 0), (total, total)),
    read_roi=daisy.Roi((0, 0), (18, 18)),
    write_roi=daisy.Roi((4, 4), (10, 10)),
    process_function=process,
    fit=fit,
    max_workers=2,
    tracking_path="tracking/t",
)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    ok = daisy.run_blockwise([task], multiprocessing=mode == "distributed")
ours = [w for w in caught if issubclass(w.category, CoverageWarning)]
print(json.dumps({
    "ok": ok,
    "blocks": task.block_grid_shape,
    "warnings": [str(w.message) for w in ours],
    "uncovered": [list(map(list, filter(None, w.message.uncovered))) for w in ours],
    "file": [w.filename for w in ours],
}))
"""


def _coverage(tmp_path: Path, mode: str, total: int, fit: str = "valid") -> dict[str, object]:
    proc = run_script(tmp_path, COVERAGE_SCRIPT, mode, str(total), fit)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result: dict[str, object] = json.loads(proc.stdout.splitlines()[-1])
    return result


@pytest.mark.parametrize("mode", MODES)
def test_blocks_that_leave_the_volume_unwritten_warn_once(tmp_path: Path, mode: str) -> None:
    # total 64 less a context of 4 each side leaves [4, 60) to write; 5 blocks of 10 write
    # [4, 54), and fit="valid" drops the partial block over [54, 60)
    got = _coverage(tmp_path, mode, 64)
    assert got["ok"] is True and got["blocks"] == [5, 5]
    assert len(got["warnings"]) == 1, got  # type: ignore[arg-type]
    text = got["warnings"][0]  # type: ignore[index]
    assert 'task "t": its blocks write [4, 54) x [4, 54)' in text
    assert "total_write_roi [4, 60) x [4, 60)" in text
    assert "[54, 60) on axis 0 and [54, 60) on axis 1" in text
    assert "Grow total_roi to shape (68, 68)" in text
    assert 'fit="shrink"' in text and 'fit="overhang"' in text
    assert got["uncovered"] == [[[54, 60], [54, 60]]]
    assert got["file"] == [str(tmp_path / "user_script.py")]  # points at the user's call


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("total", "fit"), [(68, "valid"), (64, "shrink"), (64, "overhang")])
def test_blocks_that_write_the_whole_volume_do_not_warn(
    tmp_path: Path, mode: str, total: int, fit: str
) -> None:
    got = _coverage(tmp_path, mode, total, fit)
    assert got["ok"] is True and got["warnings"] == [], got


@pytest.mark.parametrize("mode", MODES)
def test_a_block_larger_than_the_volume_warns(tmp_path: Path, mode: str) -> None:
    got = _coverage(tmp_path, mode, 12)  # 12 less the context 8 leaves 4: no block of 10
    assert got["ok"] is True and got["blocks"] == [0, 0]
    assert len(got["warnings"]) == 1, got  # type: ignore[arg-type]
    text = got["warnings"][0]  # type: ignore[index]
    assert 'task "t" has no block: total_roi [0, 12) x [0, 12)' in text
    assert "write_roi of shape (10, 10)" in text and "The run does nothing" in text
    assert "Grow total_roi to shape (18, 18)" in text


# ----------------------------------------------------------------------------------------
# bellis status

STORE_SCRIPT = r"""
import bellis as daisy

roi = daisy.Roi((0, 0), (40, 30))
block = daisy.Roi((0, 0), (10, 10))
task = daisy.Task("t", roi, block, block, lambda b: None, tracking_path="store")
assert daisy.run_blockwise([task], multiprocessing=False)
"""


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A 2-D store of 4 x 3 blocks, all done."""
    proc = run_script(tmp_path, STORE_SCRIPT)
    assert proc.returncode == 0, proc.stderr
    return tmp_path / "store"


@pytest.mark.parametrize(
    ("block", "says"),
    [
        ("6", "block id 6 (grid coordinate (0, 3)) is outside the grid"),
        ("1,2,3", "3 coordinates for a 2-D store"),
        ("6,", "1 coordinate for a 2-D store"),
        ("20,20", "grid coordinate (20, 20) is outside the grid"),
        ("-1,0", "grid coordinate (-1, 0) is outside the grid"),
    ],
)
def test_status_block_outside_the_grid_is_an_error(store: Path, block: str, says: str) -> None:
    for extra in ([], ["--json"]):
        proc = _bellis(store.parent, "status", str(store), f"--block={block}", *extra)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert says in proc.stderr
        assert "a 2-D grid of 4 x 3 cells" in proc.stderr
        assert "Traceback" not in proc.stderr and proc.stdout == ""


@pytest.mark.parametrize("block", ["5", "2,0", "(2, 0)"])
def test_status_block_by_id_or_coordinate_says_done(store: Path, block: str) -> None:
    proc = _bellis(store.parent, "status", str(store), "--block", block)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == f"block (2, 0) (id 5) in {store}: done"
    data = json.loads(
        _bellis(store.parent, "status", str(store), "--block", block, "--json").stdout
    )
    assert (data["block"], data["id"], data["done"], data["attempts"]) == ([2, 0], 5, True, [])


def test_status_json_prints_the_counts(store: Path) -> None:
    proc = _bellis(store.parent, "status", str(store), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["path"] == str(store)
    assert (data["grid"], data["block_grid"], data["blocks"]) == ([4, 3], [4, 3], 12)
    assert (data["done"], data["failed"], data["untouched"], data["failed_attempts"]) == (
        12,
        0,
        0,
        0,
    )
    assert data["layout"]["fit"] == "valid" and data["runs"] == 1
    # a basedir: a list with one record per store
    listed = json.loads(_bellis(store.parent, "status", str(store.parent), "--json").stdout)
    assert [d["path"] for d in listed] == [str(store)]


def test_status_width_must_be_positive(store: Path) -> None:
    proc = _bellis(store.parent, "status", str(store), "--width", "0")
    assert proc.returncode == 2
    assert "--width" in proc.stderr and "at least 1" in proc.stderr


# ----------------------------------------------------------------------------------------
# bellis worker without a (good) context


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        ([], {}, "no worker context: neither --context nor $BELLIS_CONTEXT nor $DAISY_CONTEXT"),
        (["--context", "garbage"], {}, "--context is not a context"),
        (["--context", "hostname=h:port=1"], {}, "--context has no 'task_id', 'secret'"),
        (
            [],
            {"DAISY_CONTEXT": "hostname=h:port=99999:task_id=t:secret=00"},
            "$DAISY_CONTEXT: port '99999' is not a TCP port",
        ),
    ],
)
def test_worker_without_a_good_context_is_a_clean_error(
    tmp_path: Path, args: list[str], env: dict[str, str], says: str
) -> None:
    proc = _bellis(tmp_path, "worker", "--function", "os:getcwd", *args, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("bellis worker: ")
    assert says in proc.stderr
    assert "--context" in proc.stderr and "$BELLIS_CONTEXT" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_worker_with_a_function_that_is_not_there_is_a_clean_error(tmp_path: Path) -> None:
    context = "hostname=127.0.0.1:port=9:task_id=t:secret=00"
    proc = _bellis(tmp_path, "worker", "--function", "no_such_module:f", "--context", context)
    assert proc.returncode == 2
    assert "no module named 'no_such_module'" in proc.stderr and "Traceback" not in proc.stderr


# ----------------------------------------------------------------------------------------
# bellis verify with nothing to verify


def test_verify_with_nothing_to_verify_is_not_a_success(store: Path) -> None:
    basedir = store.parent
    proc = _bellis(basedir, "verify", str(basedir))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "nothing to verify" in proc.stderr
    assert "verify_outputs=True" in proc.stderr


# ----------------------------------------------------------------------------------------
# a launcher that is not a WorkerLauncher

NOT_A_LAUNCHER_SCRIPT = r"""
import sys

import bellis as daisy

where = sys.argv[1]


def process(block):
    pass


task = daisy.Task(
    "t",
    daisy.Roi((0,), (40,)),
    daisy.Roi((0,), (10,)),
    daisy.Roi((0,), (10,)),
    process_function=process,
    tracking_path=False,
    launcher="slurm" if where == "task" else None,
)
try:
    daisy.run_blockwise(
        [task], launcher="slurm" if where == "run" else None, progress=False, summary=False
    )
except daisy.errors.BellisError as exc:
    print("ERROR", type(exc).__name__, getattr(exc, "parameter", None))
    print(exc)
else:
    print("ACCEPTED")
"""


@pytest.mark.parametrize(
    ("where", "named"), [("run", "launcher is str"), ("task", "Task('t', launcher=...) is str")]
)
def test_a_launcher_that_is_not_a_worker_launcher_is_refused_before_the_run(
    tmp_path: Path, where: str, named: str
) -> None:
    proc = run_script(tmp_path, NOT_A_LAUNCHER_SCRIPT, where)
    assert proc.returncode == 0, proc.stderr
    head, message = proc.stdout.splitlines()[:2]
    assert head == "ERROR ConfigurationError launcher"
    assert f"{named}, not a launcher" in message
    assert "bellis.WorkerLauncher" in message
