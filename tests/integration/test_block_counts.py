"""Issue 24, items 1 and 2: what ``bellis status``, ``--watch``, ``bellis report`` and the
trace say about a task whose read context gives its tracking grid cells no block maps to.

The tracking grid is anchored at the total ROI (seed 002), so a task with read context has
more cells than blocks. A user script runs one task per fit mode and context (none, less
than a block, more than a block) in one distributed run; every block writes down its own
``write_roi``. The tests then run the CLI as a user does and compare what it prints with
ground truth they compute themselves: the number of blocks from the ROIs and the fit mode,
and each block's write ROI as the block itself saw it.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kit import browser

BELLIS = [sys.executable, "-m", "bellis"]
FIXTURE = Path(__file__).parent.parent / "compat" / "daisy_store_fixture"

BLOCK = 8
EXTENT = 20  # the write region per axis: 2 whole blocks and a partial one
ORIGIN = (4, -3, 0)  # where the write region starts, per axis
FITS = ("valid", "overhang", "shrink")
CONTEXTS = (0, 3, 11)  # none, less than a block, more than a block
CASES = [(fit, c) for fit in FITS for c in CONTEXTS]
IDS = [f"{fit}-context{c}" for fit, c in CASES]

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import bellis
    from bellis import Roi

    BASE = sys.argv[1]
    CASES = json.loads(sys.argv[2])
    BLOCK, EXTENT, ORIGIN = GEOMETRY

    def record(name):
        log = os.path.join(BASE, "blocks.jsonl")

        def process(block):
            w = block.write_roi
            line = json.dumps({"task": name, "begin": [int(v) for v in w.begin],
                               "end": [int(v) for v in w.end]})
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.write(fd, (line + "\\n").encode())
            os.close(fd)

        return process

    tasks = []
    for fit, c in CASES:
        name = f"{fit}-context{c}"
        total = Roi(tuple(o - c for o in ORIGIN), (EXTENT + 2 * c,) * 3)
        tasks.append(bellis.Task(
            name, total_roi=total, read_roi=Roi((0, 0, 0), (BLOCK + 2 * c,) * 3),
            write_roi=Roi((c, c, c), (BLOCK,) * 3), process_function=record(name),
            read_write_conflict=False, fit=fit, max_workers=2, resource_tracking=True))
    bellis.set_tracking_basedir(os.path.join(BASE, "tracking"))
    print("ok" if bellis.run_blockwise(tasks, progress=False, summary=False) else "failed")
    """
).replace("GEOMETRY", repr((BLOCK, EXTENT, ORIGIN)))


def expected_blocks_per_axis(fit: str) -> int:
    """Blocks tile the write region (the total ROI less the context): ``valid`` drops the
    partial last block, ``overhang`` and ``shrink`` keep it."""
    return EXTENT // BLOCK if fit == "valid" else -(-EXTENT // BLOCK)


def expected_cells_per_axis(c: int) -> int:
    """The tracking grid covers the total ROI, context included (seed 002)."""
    return -(-(EXTENT + 2 * c) // BLOCK)


def cell_of(begin: list[int], c: int) -> tuple[int, ...]:
    """Seed 002: a block's cell is ``(write_roi.offset - total_roi.offset) // write_shape``."""
    return tuple((b - (o - c)) // BLOCK for b, o in zip(begin, ORIGIN, strict=True))


def fmt(begin: list[int], end: list[int]) -> str:
    return "[" + ", ".join(f"{b}:{e}" for b, e in zip(begin, end, strict=True)) + ")"


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*BELLIS, *args], capture_output=True, text=True, timeout=300, cwd=cwd)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One distributed run of the nine tasks, their report and their trace."""
    base = tmp_path_factory.mktemp("blocks")
    script = base / "pipeline.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script), str(base), json.dumps(CASES)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr
    blocks: dict[str, dict[tuple[int, ...], str]] = {name: {} for name in IDS}
    for line in (base / "blocks.jsonl").read_text().splitlines():
        b = json.loads(line)
        _fit, c = b["task"].split("-context")
        blocks[b["task"]][cell_of(b["begin"], int(c))] = fmt(b["begin"], b["end"])
    page, trace = base / "report.html", base / "trace.json"
    rep = cli("report", str(base / "tracking"), "-o", str(page), "--trace", str(trace))
    assert rep.returncode == 0, rep.stdout + rep.stderr
    text = page.read_text(encoding="utf-8")
    m = re.search(r'<script id="bellis-data" type="application/json">(.*?)</script>', text, re.S)
    assert m is not None
    payload = json.loads(m.group(1).replace("<\\/", "</"))
    return {
        "base": base,
        "blocks": blocks,
        "page": page,
        "html": text,
        "payload": payload,
        "trace": json.loads(trace.read_text()),
    }


def _rows(html: str, after: str) -> list[list[str]]:
    """The rows of the first table after ``after`` in the page, as cell texts."""
    table = html[html.index(after) :]
    table = table[: table.index("</table>")]
    return [
        [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", tr)]
        for tr in re.findall(r"<tr>(.*?)</tr>", table, re.S)
    ]


@pytest.mark.parametrize(("fit", "c"), CASES, ids=IDS)
def test_status_counts_blocks_not_cells(run: dict[str, Any], fit: str, c: int) -> None:
    name = f"{fit}-context{c}"
    n = expected_blocks_per_axis(fit)
    cells = expected_cells_per_axis(c)
    assert len(run["blocks"][name]) == n**3  # every block ran, once
    proc = cli("status", str(run["base"] / "tracking" / name))
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()]
    assert ["grid", *f"{cells} x {cells} x {cells} = {cells**3} cells".split()] in rows
    assert ["done", str(n**3)] in rows, proc.stdout
    assert ["untouched", "0"] in rows, proc.stdout
    blocks_line = next(r for r in rows if r[:1] == ["blocks"])
    assert blocks_line[1:6] == [str(n), "x", str(n), "x", str(n)], proc.stdout
    assert blocks_line[7] == str(n**3), proc.stdout
    # the map: the middle slice of the blocks, every block done, every other cell "-"
    grid_rows = [r for r in proc.stdout.splitlines() if re.fullmatch(r"    [#.x+-]+", r)]
    assert len(grid_rows) == cells, proc.stdout
    drawn = "".join(grid_rows).replace(" ", "")
    assert drawn.count("#") == n * n and drawn.count("-") == cells * cells - n * n, proc.stdout
    assert "." not in drawn


@pytest.mark.parametrize(("fit", "c"), CASES, ids=IDS)
def test_watch_ends_at_every_block_done(run: dict[str, Any], fit: str, c: int) -> None:
    name = f"{fit}-context{c}"
    n = expected_blocks_per_axis(fit) ** 3
    proc = cli("status", str(run["base"] / "tracking" / name), "--watch", "0.2")
    assert proc.returncode == 0, proc.stderr
    progress = [line for line in proc.stdout.splitlines() if " done (" in line]
    assert progress and f": {n} of {n} blocks done (100.0%)" in progress[-1], proc.stdout
    assert "ETA" not in progress[-1]


@pytest.mark.parametrize(("fit", "c"), CASES, ids=IDS)
def test_report_counts_blocks_and_shows_their_write_rois(
    run: dict[str, Any], fit: str, c: int
) -> None:
    name = f"{fit}-context{c}"
    n = expected_blocks_per_axis(fit)
    cells = expected_cells_per_axis(c)
    truth: dict[tuple[int, ...], str] = run["blocks"][name]
    # the slowest blocks table: each row's world ROI is that block's write ROI
    table = _rows(run["html"], f"<h3>{name}: the 20 slowest blocks</h3>")
    assert table[0][:2] == ["grid coordinate", "world ROI"]
    assert len(table) == 1 + min(20, n**3)
    for r in table[1:]:
        coord = tuple(int(v) for v in r[0].strip("()").split(","))
        assert r[1] == truth[coord], (coord, r[1], truth[coord])
    # the summary table: blocks, done, untouched
    summary = _rows(run["html"], "<table>")
    head = summary[0]
    row = next(r for r in summary[1:] if r[0] == name)
    got = dict(zip(head, row, strict=True))
    assert got["blocks"] == str(n**3) and got["done"] == str(n**3), got
    assert got["untouched"] == "0", got
    # the volume map: "no block" exactly where no block maps, and its hovers' ROIs
    vol = next(v for v in run["payload"]["volumes"] if v["task"] == name)
    assert vol["shape"] == [cells] * 3 and vol["factor"] == 1
    state = np.frombuffer(base64.b64decode(vol["metrics"]["state"]["bdata"]), dtype="<f4")
    state = state.reshape(cells, cells, cells)
    for cell in np.ndindex(cells, cells, cells):
        assert state[cell] == (1.0 if cell in truth else -1.0), cell
    for coord, roi in truth.items():
        iv = [vol["rois"][a][g] for a, g in enumerate(coord)]
        assert fmt([b for b, _ in iv], [e for _, e in iv]) == roi


@pytest.mark.parametrize(("fit", "c"), CASES, ids=IDS)
def test_trace_write_rois_are_the_blocks(run: dict[str, Any], fit: str, c: int) -> None:
    name = f"{fit}-context{c}"
    truth: dict[tuple[int, ...], str] = run["blocks"][name]
    events = [
        e for e in run["trace"]["traceEvents"] if e.get("cat") == "block" and e["name"] == name
    ]
    assert len(events) == len(truth)
    for e in events:
        coord = tuple(e["args"]["grid_coordinate"])
        roi = e["args"]["write_roi"]
        end = [o + s for o, s in zip(roi["offset"], roi["shape"], strict=True)]
        assert fmt(roi["offset"], end) == truth[coord]


needs_chromium = pytest.mark.skipif(browser.chromium() is None, reason="no chromium")


@needs_chromium
def test_page_hovers_name_no_block_and_the_write_roi(run: dict[str, Any]) -> None:
    """In Chromium: a hover over a context cell says "no block"; over a block, its ROI."""
    name, c = "overhang-context11", 11
    truth: dict[tuple[int, ...], str] = run["blocks"][name]
    first = min(truth)  # the block nearest the origin: cell (1, 1, 1) here
    probe = """
    var vols = window.bellisReport.volumes, key = null;
    Object.keys(vols).forEach(function (k) { if (vols[k].task === 'TASK') { key = k; } });
    var gd = document.getElementById('plot-' + key), out = {};
    async function hover(z, y, x) {
      await vols[key].show('state', 0, z);
      Plotly.Fx.hover(gd, {xval: x, yval: y}, 'xy');
      await new Promise(function (r) { setTimeout(r, 200); });
      var layer = gd.querySelector('.hoverlayer');
      return layer ? layer.textContent : null;
    }
    out.block = await hover(@Z@, @Y@, @X@);
    out.context = await hover(@Z@, 0, 0);
    return out;
    """
    z, y, x = first
    for key, value in (("TASK", name), ("@Z@", z), ("@Y@", y), ("@X@", x)):
        probe = probe.replace(key, str(value))
    found = browser.load(run["page"], probe)
    assert found["errors"] == [] and found["rendered"] == "yes", found
    hovers = found["result"]
    assert f"block {first}" in hovers["block"], hovers
    assert f"ROI {truth[first]}" in hovers["block"], hovers
    assert "state done" in hovers["block"], hovers
    assert "no block" in hovers["context"] and "untouched" not in hovers["context"], hovers
    assert c > BLOCK  # cell (z, 0, 0) is all context


def test_demo_status_and_report_say_every_block_is_done(tmp_path: Path) -> None:
    """The demo's ``smooth`` reads one voxel of context: 8 blocks in a 3 x 3 x 3 grid at
    ``--size 64``; its first block writes [0:32) on every axis."""
    work = tmp_path / "demo"
    proc = cli("demo", "--workdir", str(work), "--size", "64", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for task in ("smooth", "label"):
        st = cli("status", str(work / "tracking" / task))
        rows = [line.split() for line in st.stdout.splitlines()]
        assert ["done", "8"] in rows and ["untouched", "0"] in rows, st.stdout
    summary = _rows((work / "report.html").read_text(encoding="utf-8"), "<table>")
    got = {r[0]: dict(zip(summary[0], r, strict=True)) for r in summary[1:]}
    for task in ("smooth", "label"):
        assert (got[task]["blocks"], got[task]["done"], got[task]["untouched"]) == ("8", "8", "0")
    html = (work / "report.html").read_text(encoding="utf-8")
    table = _rows(html, "<h3>smooth: the 20 slowest blocks</h3>")[1:]
    rois = {r[0]: r[1] for r in table}
    assert len(rois) == 8 and rois["(0, 0, 0)"] == "[0:32, 0:32, 0:32)", rois
    for coord, roi in rois.items():
        begin = [32 * int(v) for v in coord.strip("()").split(",")]
        assert roi == fmt(begin, [b + 32 for b in begin]), (coord, roi)


def test_a_daisy_store_says_its_block_count_is_unknown(tmp_path: Path) -> None:
    """daisy 2.0.0 records only the layout hash: the 6 cells not done may be blocks not run
    or cells of no block. Once bellis resumes the store for its task it records the layout,
    and the 2 x 3 blocks of the 3 x 4 grid are all done."""
    store = tmp_path / "fx"
    shutil.copytree(FIXTURE, store)
    st = cli("status", str(store))
    assert st.returncode == 0, st.stderr
    rows = [line.split() for line in st.stdout.splitlines()]
    assert ["done", "6"] in rows and ["untouched", "6"] not in rows, st.stdout
    assert any(r[:2] == ["blocks", "unknown:"] for r in rows), st.stdout
    assert any(r[:4] == ["untouched", "at", "most", "6"] for r in rows), st.stdout
    # --watch (a daisy store has no lock file: it runs until interrupted)
    watch = subprocess.Popen(
        [*BELLIS, "status", str(store), "--watch", "0.2"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert watch.stdout is not None
        first = watch.stdout.readline()
        watch.send_signal(signal.SIGINT)
        watch.communicate(timeout=60)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.communicate()
    assert watch.returncode == 130
    assert ": 6 of 12 cells done (50.0%, blocks unknown)" in first, first
    rep = cli("report", str(store), "-o", str(tmp_path / "r.html"))
    assert rep.returncode == 0, rep.stderr
    html = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert "which cells are blocks, how many blocks there are and their ROIs are not known" in html
    got = dict(zip(*_rows(html, "<table>")[:2], strict=True))
    assert got["blocks"] == "unknown (12 cells)" and got["untouched"] == "at most 6", got
    # bellis resumes it for the task it was written for, and records the layout
    script = tmp_path / "resume.py"
    script.write_text(
        "import sys, bellis\nfrom bellis import Roi\n"
        "t = bellis.Task('fx', total_roi=Roi((0, 0), (24, 34)), read_roi=Roi((-2, -2), (14, 14)),\n"
        "                write_roi=Roi((0, 0), (10, 10)), process_function=lambda b: None,\n"
        "                fit='valid', tracking_path=sys.argv[1])\n"
        "print(bellis.run_blockwise([t], progress=False, summary=False))\n"
    )
    proc = subprocess.run(
        [sys.executable, str(script), str(store)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "True", proc.stdout + proc.stderr
    rows = [line.split() for line in cli("status", str(store)).stdout.splitlines()]
    # blocks tile the write region 20 x 30 with 10 x 10: 2 x 3 of them
    assert next(r for r in rows if r[:1] == ["blocks"])[1:6] == ["2", "x", "3", "=", "6"], rows
    assert ["untouched", "0"] in rows
