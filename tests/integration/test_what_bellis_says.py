"""Issue 35 item 5: what bellis says that isn't so. Each test drives bellis as a user does
(a script in a subprocess, or the CLI) and checks the text against ground truth it computes."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BELLIS = [sys.executable, "-m", "bellis"]


def _demo(workdir: Path, size: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*BELLIS, "demo", "--workdir", str(workdir), "--size", str(size), "--serial"],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_demo_at_a_new_size_builds_the_new_volume(tmp_path: Path) -> None:
    """`bellis demo --size N` over a demo folder of another size kept the old volume,
    "completed" blocks that wrote nothing and ended in a TaskAbandonedError traceback."""
    import zarr

    work = tmp_path / "demo"
    first = _demo(work, 40)
    assert first.returncode == 0, first.stderr
    second = _demo(work, 64)
    assert second.returncode == 0, second.stderr
    assert "Traceback" not in second.stderr + second.stdout
    assert "Resumed" not in second.stdout  # nothing of the old size was skipped
    root = zarr.open_group(str(work / "demo.zarr"), mode="r")
    raw = np.asarray(root["raw"][:], dtype=np.float32)
    assert raw.shape == (64, 64, 64)
    # smoothed: the 3x3x3 mean of raw, the edge repeated at the faces
    pad = np.pad(raw, 1, mode="edge")
    mean = sum(
        pad[1 + dz : 65 + dz, 1 + dy : 65 + dy, 1 + dx : 65 + dx]
        for dz in (-1, 0, 1)
        for dy in (-1, 0, 1)
        for dx in (-1, 0, 1)
    ) / np.float32(27.0)
    smoothed = np.asarray(root["smoothed"][:])
    assert smoothed.shape == (64, 64, 64)
    assert np.abs(smoothed - mean).max() < 1e-4
    labels = np.asarray(root["labels"][:])
    assert np.array_equal(labels > 0, smoothed > 0.25)
    counts = np.asarray(root["counts"][:])
    assert counts.shape == (2, 2, 2)
    for cell in np.ndindex(2, 2, 2):
        sl = tuple(slice(32 * c, 32 * c + 32) for c in cell)
        assert counts[cell] == len(np.unique(labels[sl][labels[sl] > 0]))
    assert "holds a 40x40x40 volume, not 64x64x64 (--size 64): building it again" in (second.stderr)
    assert "✔" in second.stdout and "failed" not in second.stderr.lower()


# ------------------------------------------------------------------------------------
# a run whose blocks fail in known ways: some for good, some once and then done

FAILING = """
import json, sys
from pathlib import Path
import bellis
from bellis import BlockStatus, Roi

MODE, STORE = sys.argv[1], sys.argv[2]
BAD = {(1, 2), (3, 5), (4, 0), (5, 7)}
FLAKY = {(0, 1), (2, 2), (2, 6), (3, 3), (5, 0)}
HERE = Path(__file__).parent
(HERE / "ids").mkdir(exist_ok=True)

def process(block):
    y, x = (int(v) // 10 for v in block.write_roi.offset)
    (HERE / "ids" / f"{y}_{x}").write_text(str(block.block_id[1]))
    if (y, x) in BAD:
        if MODE == "serial":
            block.status = BlockStatus.FAILED
            return
        raise ValueError(f"bad data at {y},{x}")  # LINE_BAD
    marker = HERE / f"flaky_{y}_{x}"
    if (y, x) in FLAKY and not marker.exists():
        marker.write_text("x")
        if MODE == "serial":
            block.status = BlockStatus.FAILED
            return
        raise RuntimeError("transient glitch")  # LINE_FLAKY

task = bellis.Task(
    "t",
    total_roi=Roi((0, 0), (60, 80)),
    read_roi=Roi((0, 0), (10, 10)),
    write_roi=Roi((0, 0), (10, 10)),
    process_function=process,
    max_retries=1,
    num_workers=2,
    max_worker_restarts=500,
    read_write_conflict=False,
    tracking_path=STORE,
    resource_tracking=True,
)
print("RESULT", bellis.run_blockwise([task], multiprocessing=MODE != "serial"))
"""

BAD = {(1, 2), (3, 5), (4, 0), (5, 7)}
FLAKY = {(0, 1), (2, 2), (2, 6), (3, 3), (5, 0)}


def _run_failing(tmp_path: Path, mode: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    script = tmp_path / "pipeline.py"
    script.write_text(FAILING)
    proc = subprocess.run(
        [sys.executable, str(script), mode, str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert "RESULT False" in proc.stdout, proc.stdout + proc.stderr
    return proc, script


def _ids(tmp_path: Path) -> dict[tuple[int, int], int]:
    out = {}
    for f in (tmp_path / "ids").iterdir():
        y, x = f.name.split("_")
        out[(int(y), int(x))] = int(f.read_text())
    return out


def _line_of(script: Path, marker: str) -> int:
    lines = script.read_text().splitlines()
    return next(i + 1 for i, line in enumerate(lines) if marker in line)


def _named(text: str) -> set[tuple[int, int, int]]:
    """The blocks a line names as ``17 (2, 3)``: (id, y, x)."""
    return {(int(a), int(b), int(c)) for a, b, c in re.findall(r"(\d+) \((\d+), (\d+)\)", text)}


def _section(out: str, head: str) -> list[str]:
    """The summary's lines from the one that starts with ``head`` to the next blank line
    that is followed by a line at the section's indent which is no error of it."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(head))
    return lines[start:]


@pytest.mark.parametrize("mode", ["distributed", "serial"])
def test_the_summary_lists_only_blocks_that_failed_for_good(tmp_path: Path, mode: str) -> None:
    """The summary listed, under "N blocks failed", the errors of blocks that later
    succeeded, grouped by exact message; now: failed blocks under their error (type and
    raising line, its messages listed), blocks done after a retry on a line of their own,
    each block named by id and coordinate."""
    proc, script = _run_failing(tmp_path, mode)
    out = proc.stdout
    ids = _ids(tmp_path)
    bad = {(ids[c], *c) for c in BAD}
    flaky = {(ids[c], *c) for c in FLAKY}
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if "failed in task 't'" in line)
    retried = next(i for i, line in enumerate(lines) if "done after a retry" in line)
    assert retried > head
    failed_part = "\n".join(lines[head:retried])
    retried_part = "\n".join(lines[retried : retried + 2])
    assert lines[head].strip() == "4 blocks failed in task 't' with 1 distinct error:", out
    # the failed blocks, each by id and coordinate, and no block that was done after all
    assert _named(failed_part) == bad, failed_part
    assert lines[retried].strip() == "5 blocks done after a retry in task 't':", out
    assert _named(retried_part) == flaky, retried_part
    assert "(5 failed attempts;" in lines[retried + 1]
    if mode == "distributed":
        assert "ValueError (4 distinct messages)" in failed_part
        assert "(8 failed attempts)" in failed_part  # 2 attempts of each of the 4 blocks
        got = re.findall(r"'bad data at (\d+),(\d+)' \(2\)", failed_part)
        assert len(got) == 3 and {(int(y), int(x)) for y, x in got} <= BAD
        assert "and 1 more" in failed_part
        assert f"line {_line_of(script, 'LINE_BAD')}, in process" in failed_part
        flaky_line = _line_of(script, "LINE_FLAKY")
        assert (
            f"RuntimeError: transient glitch at {script}:{flaky_line} in process"
            in (lines[retried + 1])
        )
        assert "RuntimeError" not in failed_part
    else:
        assert "block status set to FAILED" in failed_part
        assert "(8 failed attempts)" in failed_part


def test_status_failed_and_the_report_group_by_raising_line(tmp_path: Path) -> None:
    """`bellis status --failed` and the report's Failures section made one group per
    message ("5 distinct errors" for one raise with an f-string); now one per type and
    raising line, with the messages listed and each block by coordinate and id."""
    _run_failing(tmp_path, "distributed")
    ids = _ids(tmp_path)
    store = tmp_path / "store"
    proc = subprocess.run(
        [*BELLIS, "status", str(store), "--failed"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "2 distinct errors, 13 failed attempts" in text, text  # 4 x 2 + 5 x 1
    assert "ValueError (4 distinct messages)" in text
    assert "RuntimeError: transient glitch" in text
    named = {(int(y), int(x), int(i)) for y, x, i in re.findall(r"\((\d+), (\d+)\) id (\d+)", text)}
    assert named == {(*c, ids[c]) for c in BAD | FLAKY}
    assert re.search(r"messages: 'bad data at \d,\d' \(2\), .* and 1 more", text)
    js = json.loads(
        subprocess.run(
            [*BELLIS, "status", str(store), "--failed", "--json"],
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
    )
    value = next(e for e in js["errors"] if e["type"] == "ValueError")
    assert sorted(m["message"] for m in value["messages"]) == sorted(
        f"bad data at {y},{x}" for y, x in BAD
    )
    assert all(m["count"] == 2 for m in value["messages"]) and value["count"] == 8
    page = tmp_path / "report.html"
    rep = subprocess.run(
        [*BELLIS, "report", str(store), "-o", str(page)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert rep.returncode == 0, rep.stdout + rep.stderr
    html = page.read_text(encoding="utf-8")
    section = html[html.index('<section id="failures">') :]
    section = section[: section.index("</section>")]
    rows = re.findall(
        r'<tr class="error-row" data-task="t" data-count="(\d+)">(.*?)</tr>', section, re.S
    )
    titles = {re.search(r"<b>(.*?)</b>", row).group(1): int(n) for n, row in rows}  # type: ignore[union-attr]
    assert titles == {"ValueError (4 distinct messages)": 8, "RuntimeError: transient glitch": 5}
    assert "2 distinct errors, 13 failed attempts" in section
    links = {
        (int(i), int(y), int(x)) for i, y, x in re.findall(r">(\d+) \((\d+), (\d+)\)</a>", section)
    }
    assert links == {(ids[c], *c) for c in BAD | FLAKY}


def test_the_report_gives_red_and_orange_one_meaning(tmp_path: Path) -> None:
    """The worker timeline drew blocks done after failed attempts in red, the colour the
    volume map gives to failed blocks: now the timeline's colours for "done after failed
    attempts" and for a failed block's attempts are the volume map's for the same states."""
    _run_failing(tmp_path, "distributed")
    page = tmp_path / "report.html"
    rep = subprocess.run(
        [*BELLIS, "report", str(tmp_path / "store"), "-o", str(page)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert rep.returncode == 0, rep.stdout + rep.stderr
    html = page.read_text(encoding="utf-8")
    m = re.search(r"var STATE_SCALE = (\[.*?\]\]);", html, re.S)
    assert m is not None
    scale = json.loads(m.group(1))
    names = json.loads(re.search(r"var STATES = (\[.*?\]);", html).group(1))  # type: ignore[union-attr]

    def state_colour(name: str) -> str:
        code = names.index(name) - 1  # codes -1 (no block) .. 3, on zmin -1.5 .. zmax 3.5
        at = (code + 1.5) / 5
        return next(c for (a, c), (b, _) in itertools.pairwise(scale) if a <= at <= b and a != b)

    m = re.search(r'<script id="bellis-data" type="application/json">(.*?)</script>', html, re.S)
    assert m is not None
    data = json.loads(m.group(1).replace("<\\/", "</"))
    traces = data["figures"]["timeline"]["data"]
    colours = {t["name"]: t["line"]["color"] for t in traces if "line" in t}
    assert colours["t: done after failed attempts"] == state_colour("done after failed attempts")
    assert colours["t: failed attempt"] == state_colour("failed")
    assert state_colour("failed") != state_colour("done after failed attempts")


# ------------------------------------------------------------------------------------
# sizes: binary units named so; one memory recommendation for plan and report

MEMORY = """
import json, sys
import numpy as np
import bellis
from bellis import Roi

def process(block):
    # blocks of different sizes: 8 to 72 MiB, touched so that they count in the RSS
    y, x = (int(v) // 10 for v in block.write_roi.offset)
    a = np.ones(((y * 5 + x) % 9 + 1) * (8 << 20) // 8)
    a.sum()

def task():
    return bellis.Task(
        "t",
        total_roi=Roi((0, 0), (50, 50)),
        read_roi=Roi((0, 0), (10, 10)),
        write_roi=Roi((0, 0), (10, 10)),
        process_function=process,
        num_workers=2,
        read_write_conflict=False,
        tracking_path=sys.argv[2],
        resource_tracking=True,
    )

if sys.argv[1] == "plan":
    plan = bellis.plan(task(), sample=20, seed=1)
    print("PLAN", json.dumps(plan.to_json()))
else:
    print("RESULT", bellis.run_blockwise([task()]))
"""


def test_the_panel_names_binary_sizes_in_binary_units(tmp_path: Path) -> None:
    """The Resource Utilization panel printed MiB labelled "MB"."""
    script = tmp_path / "mem.py"
    script.write_text(MEMORY)
    proc = subprocess.run(
        [sys.executable, str(script), "run", str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert "RESULT True" in proc.stdout, proc.stdout + proc.stderr
    panel = proc.stdout[proc.stdout.index("Resource Utilization") :]
    m = re.search(r"peak RSS\s+([\d.]+) (\w+) ± ([\d.]+) (\w+)", panel)
    assert m is not None, panel
    # the ground truth: the mean peak RSS of the store's blocks, in MiB
    import zarr

    rss = np.asarray(zarr.open_group(str(tmp_path / "store"), mode="r")["peak_rss_bytes"][:])
    mean = float(rss[rss > 0].mean())
    assert m.group(2) == "MiB", panel
    assert float(m.group(1)) == pytest.approx(mean / 2**20, abs=0.051)
    assert not re.search(r"\d (KB|MB|GB|TB)\b", proc.stdout), panel


def test_plan_and_report_recommend_one_memory_request(tmp_path: Path) -> None:
    """`bellis.plan(sample=N)` and the report of the same store recommended 128 MiB and
    256 MiB: one rule now, from the same blocks' peak RSS."""
    script = tmp_path / "mem.py"
    script.write_text(MEMORY)
    store = tmp_path / "store"
    proc = subprocess.run(
        [sys.executable, str(script), "plan", str(store)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("PLAN ")), None)
    assert line is not None, proc.stdout + proc.stderr
    plan = json.loads(line[5:])
    (outlook,) = plan["tasks"]
    request = outlook["forecast"]["peak_rss"]["request"]
    page = tmp_path / "report.html"
    rep = subprocess.run(
        [*BELLIS, "report", str(store), "-o", str(page)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert rep.returncode == 0, rep.stdout + rep.stderr
    html = page.read_text(encoding="utf-8")
    m = re.search(r"a memory request of ([\d.]+) (MiB|GiB) covers every block", html)
    assert m is not None
    scale = 2**20 if m.group(2) == "MiB" else 2**30
    assert float(m.group(1)) == pytest.approx(request / scale, abs=0.051)
    # the rule itself, from the store's own peak RSS: the largest, plus 25%, in 64 MiB steps
    import zarr

    rss = np.asarray(zarr.open_group(str(store), mode="r")["peak_rss_bytes"][:])
    step = 64 * 2**20
    assert request == -(-int(rss.max() * 1.25) // step) * step
