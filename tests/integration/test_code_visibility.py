"""Which code made each block, visible everywhere (issue 26, item 5): ``bellis status``,
the HTML report's volume ("code version" figure) and run history, ``task.report()``.

A script runs in a subprocess under version 1 of its code, some done markers are cleared,
the code is edited and the script rerun (the default policy keeps the other blocks); the
expected counts are computed here from the store's own arrays, read with zarr."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from kit import browser
from kit.user_script import run_script

BELLIS = [sys.executable, "-m", "bellis"]

SCRIPT = """
import os
import sys

import bellis as daisy
from funlib.geometry import Roi

FACTOR = 1


def work(block):
    return FACTOR * 2


daisy.set_tracking_basedir("tracking")
t = daisy.Task("grid", Roi((0, 0), (60, 80)), Roi((0, 0), (10, 10)), Roi((0, 0), (10, 10)),
               work, read_write_conflict=False, max_workers=2)
ok = daisy.run_blockwise([t], multiprocessing=os.environ["MODE"] == "dist", progress=False)
sys.exit(0 if ok else 3)
"""


def _run(tmp_path: Path, text: str, mode: str) -> subprocess.CompletedProcess[str]:
    proc = run_script(tmp_path, text, name="grid.py", env={"MODE": mode})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _expected(store: Path) -> dict[str | None, int]:
    """Done blocks per fingerprint hash (None: unknown), from the arrays and the table."""
    g = zarr.open_group(str(store), mode="r")
    done = np.asarray(g["done"][:]) != 0
    codes = np.asarray(g["code_version"][:])
    table = json.loads((store / "code_versions.json").read_text())["versions"]
    by_index = {e["index"]: e["hash"] for e in table}
    out: dict[str | None, int] = {}
    for code in codes[done].tolist():
        key = by_index.get(code)
        out[key] = out.get(key, 0) + 1
    return out


def _three_versions(tmp_path: Path, mode: str) -> Path:
    """48 blocks by version 1; 5 cleared and redone by version 2; 2 made 'unknown'."""
    _run(tmp_path, SCRIPT, mode)
    store = tmp_path / "tracking" / "grid"
    g = zarr.open_group(str(store), mode="r+")
    done = g["done"]
    for cell in ((0, 0), (1, 3), (2, 2), (5, 7), (4, 1)):
        done[cell] = 0
    _run(tmp_path, SCRIPT.replace("FACTOR = 1", "FACTOR = 3"), mode)
    codes = g["code_version"]
    codes[3, 3] = 0  # as daisy 2.0.0 or an older bellis leave a block: unknown
    codes[3, 4] = 0
    return store


@pytest.mark.parametrize("mode", ["serial", "dist"])
def test_status_prints_done_blocks_per_code_version(tmp_path: Path, mode: str) -> None:
    store = _three_versions(tmp_path, mode)
    want = _expected(store)
    assert sorted(want.values()) == [2, 5, 41]
    table = json.loads((store / "code_versions.json").read_text())["versions"]
    first, second = table[0]["hash"], table[1]["hash"]
    proc = subprocess.run(
        [*BELLIS, "status", str(store)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    lines = [line.strip() for line in proc.stdout.splitlines()]
    code = [line for line in lines if line.startswith(("code", "version", "unknown version"))]
    assert code[0].startswith("code        version 1: ")
    found = {m.group(2): int(m.group(1)) for m in (_version_line(c) for c in code) if m}
    assert found == {first[:12]: want[first], second[:12]: want[second]}
    assert f"unknown version: {want[None]} blocks" in proc.stdout


def _version_line(line: str) -> re.Match[str] | None:
    return re.search(r"version \d+: (\d+) blocks \(([0-9a-f]{12}),", line)


def test_status_of_a_store_without_code_versions_says_unknown(tmp_path: Path) -> None:
    _run(tmp_path, SCRIPT, "serial")
    store = tmp_path / "tracking" / "grid"
    subprocess.run(["rm", "-rf", str(store / "code_version")], check=True)
    proc = subprocess.run(
        [*BELLIS, "status", str(store)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert "code        unknown version: 48 blocks" in proc.stdout


def test_task_report_exposes_the_run_fingerprint_and_blocks_per_version(tmp_path: Path) -> None:
    store = _three_versions(tmp_path, "serial")
    want = _expected(store)
    lines = [json.loads(x) for x in (store / "runs.jsonl").read_text().splitlines()]
    table = json.loads((store / "code_versions.json").read_text())["versions"]
    # runs.jsonl: each run's fingerprint and its entry in the table
    assert [line["code"] for line in lines] == [
        {"hash": table[0]["hash"], "index": 1},
        {"hash": table[1]["hash"], "index": 2},
    ]
    script = (
        SCRIPT.replace("FACTOR = 1", "FACTOR = 3").split("ok = daisy")[0]
        + "import json\n"
        + "r = t.report()\n"
        + "print(json.dumps({'fp': r.code_fingerprint, 'index': r.code_index, "
        + "'versions': r.code_versions()}))\n"
    )
    proc = run_script(tmp_path, script, name="ask.py", env={"MODE": "serial"})
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["fp"] == table[1]["hash"] and got["index"] == 2
    rows = got["versions"]
    assert [(r["version"], r["hash"], r["blocks"]) for r in rows] == [
        (1, table[0]["hash"], want[table[0]["hash"]]),
        (2, table[1]["hash"], want[table[1]["hash"]]),
        (None, None, want[None]),
    ]
    assert rows[0]["functions"] == ["work"] and rows[0]["indices"] == [1]


def _report(tmp_path: Path) -> Path:
    page = tmp_path / "out" / "run.html"
    proc = subprocess.run(
        [*BELLIS, "report", str(tmp_path / "tracking"), "-o", str(page)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return page


def _payload(page: Path) -> dict[str, Any]:
    text = page.read_text(encoding="utf-8")
    m = re.search(r'<script id="bellis-data" type="application/json">(.*?)</script>', text, re.S)
    assert m is not None
    data: dict[str, Any] = json.loads(m.group(1).replace("<\\/", "</"))
    return data


def test_report_has_a_code_version_figure_and_the_fingerprint_per_run(tmp_path: Path) -> None:
    store = _three_versions(tmp_path, "serial")
    table = json.loads((store / "code_versions.json").read_text())["versions"]
    page = _report(tmp_path)
    (volume,) = _payload(page)["volumes"]
    assert volume["labels"]["code_version"][0].startswith("code version")
    values = np.frombuffer(base64.b64decode(volume["metrics"]["code_version"]["bdata"]), "<f4")
    grid = values.reshape(volume["shape"])
    g = zarr.open_group(str(store), mode="r")
    done = np.asarray(g["done"][:]) != 0
    codes = np.asarray(g["code_version"][:])
    want = np.where(done, np.select([codes == 1, codes == 2], [1.0, 2.0], 0.0), np.nan)
    assert np.array_equal(grid, want, equal_nan=True)
    assert grid[0, 0] == 2 and grid[3, 3] == 0 and grid[0, 1] == 1
    text = page.read_text(encoding="utf-8")
    history = text[text.index('id="history"') :]
    assert f"{table[0]['hash'][:12]} (#1)" in history
    assert f"{table[1]['hash'][:12]} (#2)" in history
    assert "done blocks per code version: version 1" in text
    if browser.chromium() is None:
        return
    probe = """
    var vols = window.bellisReport.volumes, key = Object.keys(vols)[0];
    var gd = document.getElementById('plot-' + key);
    await vols[key].show('code_version', 0, 0);
    var z = gd.data[0].z;
    Plotly.Fx.hover(gd, {xval: 0, yval: 0}, 'xy');
    await new Promise(function (r) { setTimeout(r, 200); });
    var layer = gd.querySelector('.hoverlayer');
    return {z00: z[0][0], z01: z[0][1], z33: z[3][3],
            options: Array.prototype.map.call(
              document.querySelectorAll('#volume-0-controls option'),
              function (o) { return o.value; }),
            hover: layer ? layer.textContent : null};
    """
    found = browser.load(page, probe)
    assert found["errors"] == [], found["errors"]
    result = found["result"]
    assert "code_version" in result["options"]
    assert (result["z00"], result["z01"], result["z33"]) == (2, 1, 0)
    assert "code version (0: unknown) 2" in (result["hover"] or ""), result["hover"]
