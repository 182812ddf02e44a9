"""``bellis serve``: the live page of a run, served from its tracking stores (issue 39).

A user's pipeline with failing blocks runs with two workers (``kit.failing_pipeline``);
``bellis serve`` then serves its finished store from a subprocess, and the tests read
the page's JSON and the page itself in headless Chromium against the store as
``bellis status --json`` reads it. Then: a store a running driver writes (the done count
grows between fetches and never passes the total), a daisy 2.0.0 store (counts, no
statistics), and the server's safety: the token, paths that are not its two resources,
loopback only, and a flood of requests.
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from kit import browser
from kit.failing_pipeline import KEY_BLOCKS, VALUE_BLOCKS, FailingRun, run_failing
from kit.live import (
    block_pre,
    driver_page,
    get,
    needs_chromium,
    resource,
    serve,
    state_of,
    status_json,
)

FIXTURE = Path(__file__).parent.parent / "compat" / "daisy_store_fixture"


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory: pytest.TempPathFactory) -> FailingRun:
    run = run_failing(tmp_path_factory.mktemp("live"), "distributed", tracked=True)
    assert "RESULT False" in run.output, run.output
    return run


def test_serve_shows_the_counts_of_the_store(failed_run: FailingRun) -> None:
    expected = status_json(failed_run.store)
    with serve(failed_run.store) as url:
        assert urlsplit(url).hostname == "127.0.0.1"
        state = state_of(url)
    assert state["finished"] is True
    (task,) = state["tasks"]
    assert task["name"] == "store"
    for key in ("blocks", "done", "failed", "untouched", "retried", "failed_attempts"):
        assert task[key] == expected[key], key
    assert task["failed"] == len(VALUE_BLOCKS) + len(KEY_BLOCKS) + 1  # and the timeout
    titles = {g["title"]: g["count"] for g in task["errors"]}
    assert titles["ValueError: bad voxel size"] == 3 * len(VALUE_BLOCKS)
    assert task["eta_seconds"] is None  # nothing runs
    assert task["map"]["shape"] == [1, *expected["grid"]]


@needs_chromium
def test_the_page_shows_the_store_in_chromium(failed_run: FailingRun) -> None:
    expected = status_json(failed_run.store)
    grid = expected["grid"]
    failed = VALUE_BLOCKS[0]
    failed_cell = failed[0] * grid[1] + failed[1]
    done_cell = 0  # block (0, 0) never fails
    with serve(failed_run.store) as url:
        dom_failed = browser.dump_dom(f"{url}#cell={failed_cell}")
        dom_done = browser.dump_dom(f"{url}#cell={done_cell}")
    row = re.search(r'<tr data-task="store">(.*?)</tr>', dom_failed, re.S)
    assert row, dom_failed[-3000:]
    cells = dict(re.findall(r'data-key="([a-z_]+)">([^<]*)<', row.group(1)))
    for key in ("blocks", "done", "failed", "retried", "failed_attempts"):
        assert cells[key] == str(expected[key]), (key, cells)
    assert 'data-finished="yes"' in dom_failed
    attrs, text = block_pre(dom_failed)
    assert attrs["data-state"] == "4"
    assert attrs["data-pixel"] == "#d62728"  # the canvas pixel: the report's red
    assert "state failed" in text
    assert "last error ValueError: bad voxel size" in text
    assert f"cell {failed[0]}, {failed[1]}" in text
    assert "ROI [10:20, 20:30)" in text
    assert "failed attempts 3" in text
    attrs, text = block_pre(dom_done)
    assert attrs["data-state"] == "2"
    assert attrs["data-pixel"] == "#2ca02c"
    assert "block id 0" in text and "state done" in text


def test_the_finished_page_links_the_report_and_the_trace(
    failed_run: FailingRun, tmp_path: Path
) -> None:
    # the ground truth: what `bellis report` writes of the same store
    trace_file = tmp_path / "trace.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bellis",
            "report",
            str(failed_run.store),
            "--trace",
            str(trace_file),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    expected = json.loads(trace_file.read_text())
    with serve(failed_run.store) as url:
        state = state_of(url)
        assert (state["report_url"], state["trace_url"]) == ("report.html", "trace.json")
        code, report = get(resource(url, "report.html"))
        code_trace, trace = get(resource(url, "trace.json"))
        no_token = [get(resource(url, p).split("?")[0])[0] for p in ("report.html", "trace.json")]
        wrong = [get(resource(url, p) + "x")[0] for p in ("report.html", "trace.json")]
        dom = None if needs_chromium.args[0] else browser.dump_dom(url)
    assert (code, code_trace, no_token, wrong) == (200, 200, [403, 403], [403, 403])
    assert b"<title>bellis run report</title>" in report
    assert str(failed_run.store).encode() in report
    served = json.loads(trace)
    assert served["otherData"] == expected["otherData"]
    assert len(served["traceEvents"]) == len(expected["traceEvents"])
    if dom is not None:  # the finished page links both, with its token
        token = urlsplit(url).query.split("=", 1)[1]
        assert re.search(r'<div id="links" data-finished="yes">', dom), dom[-3000:]
        assert f'id="report-link" href="report.html?token={token}"' in dom
        assert f'id="trace-link" href="trace.json?token={token}"' in dom


SLOW = """
import sys, time
from pathlib import Path
import bellis

GATE = Path(sys.argv[2])

def process(block):
    while not GATE.exists():
        time.sleep(0.05)

task = bellis.Task(
    "slow",
    total_roi=bellis.Roi((0,), (200,)),
    read_roi=bellis.Roi((0,), (10,)),
    write_roi=bellis.Roi((0,), (10,)),
    process_function=process,
    num_workers=2,
    read_write_conflict=False,
    tracking_path=sys.argv[1],
)
print("RESULT", bellis.run_blockwise([task], progress=False, summary=False), flush=True)
"""


def test_serve_follows_a_store_a_running_driver_writes(tmp_path: Path) -> None:
    store, gate = tmp_path / "store", tmp_path / "gate"
    script = tmp_path / "slow.py"
    script.write_text(SLOW)
    run = subprocess.Popen(
        [sys.executable, str(script), str(store), str(gate)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 180
        while not (store / "done" / "zarr.json").exists():
            assert run.poll() is None, run.communicate()[0]
            assert time.monotonic() < deadline, "the run never made its store"
            time.sleep(0.2)
        with serve(store) as url:
            while True:  # the driver holds the store: the page says the run goes on
                first = state_of(url)["tasks"][0]
                if first.get("running"):
                    break
                assert time.monotonic() < deadline, first
                time.sleep(0.2)
            assert first["done"] == 0 and first["blocks"] == 20
            gate.write_text("go")
            seen = [first["done"]]
            while seen[-1] < 20:
                task = state_of(url)["tasks"][0]
                assert task["done"] <= task["blocks"] == 20
                seen.append(task["done"])
                assert time.monotonic() < deadline + 120, seen
                time.sleep(0.3)
            assert seen == sorted(seen) and seen[-1] > seen[0]
        out = run.communicate(timeout=120)[0]
        assert "RESULT True" in out, out
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()


def test_serve_a_daisy_store_shows_counts_without_statistics(tmp_path: Path) -> None:
    store = tmp_path / "daisy_store"
    shutil.copytree(FIXTURE, store)
    expected = status_json(store)
    with serve(store) as url:
        state = state_of(url)
        code, page = get(url)
    assert code == 200 and b"bellis: live" in page
    (task,) = state["tasks"]
    assert task["blocks"] is None and task["total_is_bound"] is True
    assert task["done"] == expected["done"] and task["cells"] == expected["cells"]
    assert task["failed"] == expected["failed"]
    assert task["errors"] == []
    assert state["run_known"] is False  # daisy's store has no lock file


def _non_loopback_address() -> str | None:
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for addr in out.stdout.split():
        if "." in addr and not addr.startswith("127."):
            return addr
    return None


def test_the_server_needs_its_token_and_serves_only_its_two_resources(tmp_path: Path) -> None:
    store = tmp_path / "daisy_store"
    shutil.copytree(FIXTURE, store)
    with serve(store) as url:
        parts = urlsplit(url)
        token = parts.query.split("=", 1)[1]
        base = f"http://{parts.netloc}"
        assert get(url)[0] == 200
        assert get(f"{base}/api/state.json?token={token}")[0] == 200
        for bad in ("", "?token=", "?token=wrong", f"?token={token}x", f"?token={token[:-1]}"):
            assert get(f"{base}/{bad}")[0] == 403, bad
            assert get(f"{base}/api/state.json{bad}")[0] == 403, bad
        traversals = [
            "/../../etc/passwd",
            "/%2e%2e/%2e%2e/etc/passwd",
            "/..%2f..%2fetc%2fpasswd",
            "//etc/passwd",
            "/api/../api/state.json",
            "/api/state.json/../../../etc/passwd",
            "/index.html",
            f"/{store}/zarr.json",
            "/api/",
            "/report.html/",
            "/../report.html",
            "/trace.json/../../etc/passwd",
        ]
        for path in traversals:
            conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=60)
            try:
                conn.request("GET", f"{path}?token={token}")
                resp = conn.getresponse()
                body = resp.read()
            finally:
                conn.close()
            assert resp.status == 404, (path, resp.status)
            assert b"root:" not in body and b"zarr_format" not in body
        # a flood of requests from a thread: every one answered, the server still up
        codes: list[int] = []

        def flood() -> None:
            for i in range(300):
                codes.append(get(f"{base}/api/state.json?token={token}" if i % 2 else url)[0])

        t = threading.Thread(target=flood)
        t.start()
        t.join(timeout=600)
        assert codes == [200] * 300
        assert state_of(url)["tasks"][0]["path"] == str(store)


def test_the_server_binds_loopback_only(tmp_path: Path) -> None:
    addr = _non_loopback_address()
    if addr is None:
        pytest.skip("this machine has no non-loopback IPv4 address (hostname -I)")
    store = tmp_path / "daisy_store"
    shutil.copytree(FIXTURE, store)
    with serve(store) as url:
        port = urlsplit(url).port
        assert port is not None
        with pytest.raises(OSError):
            socket.create_connection((addr, port), timeout=10).close()
        assert get(url)[0] == 200


VOLUME_3D = """
import bellis

def process(block):
    if tuple(int(v) for v in block.write_roi.offset) == (20, 10, 0):
        block.status = bellis.BlockStatus.FAILED

task = bellis.Task(
    "vol",
    total_roi=bellis.Roi((0, 0, 0), (40, 30, 20)),
    read_roi=bellis.Roi((0, 0, 0), (10, 10, 10)),
    write_roi=bellis.Roi((0, 0, 0), (10, 10, 10)),
    process_function=process,
    max_retries=0,
    read_write_conflict=False,
    tracking_path="vol",
)
print("RESULT", bellis.run_blockwise([task], multiprocessing=False, progress=False))
"""


@needs_chromium
def test_a_3d_map_shows_a_slice_and_the_max_projection(tmp_path: Path) -> None:
    from kit.user_script import run_script

    proc = run_script(tmp_path, VOLUME_3D)
    assert "RESULT False" in proc.stdout, proc.stdout + proc.stderr
    store = tmp_path / "vol"
    assert status_json(store)["grid"] == [4, 3, 2]
    # cell (2, 1, 0) failed; (0, 1, 0) is done, and the failure lies behind it on axis 0
    with serve(store) as url:
        dom_slice = browser.dump_dom(f"{url}#cell={2 * 6 + 1 * 2 + 0}")
        dom_done = browser.dump_dom(f"{url}#cell={0 * 6 + 1 * 2 + 0}")
        dom_proj = browser.dump_dom(f"{url}#proj=1&cell={0 * 6 + 1 * 2 + 0}")
    attrs, text = block_pre(dom_slice)
    assert (attrs["data-state"], attrs["data-pixel"]) == ("4", "#d62728"), text
    assert "cell 2, 1, 0" in text and "ROI [20:30, 10:20, 0:10)" in text
    assert "failed attempts 1" in text
    attrs, text = block_pre(dom_done)
    assert (attrs["data-state"], attrs["data-pixel"]) == ("2", "#2ca02c"), text
    attrs, text = block_pre(dom_proj)
    assert (attrs["data-state"], attrs["data-pixel"]) == ("4", "#d62728"), text
    assert "projection" in text


def test_serve_names_a_path_without_a_store(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bellis", "serve", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert f"{tmp_path / 'nope'}" in proc.stderr and "does not exist" in proc.stderr


DASHBOARD = """
import sys, time
from pathlib import Path
import bellis

GATE = Path(sys.argv[2])

def process(block):
    while not GATE.exists():
        time.sleep(0.05)

task = bellis.Task(
    "dash",
    total_roi=bellis.Roi((0, 0), (40, 50)),
    read_roi=bellis.Roi((0, 0), (10, 10)),
    write_roi=bellis.Roi((0, 0), (10, 10)),
    process_function=process,
    num_workers=2,
    read_write_conflict=False,
    tracking_path="dash",
)
ok = bellis.run_blockwise(
    [task], multiprocessing=sys.argv[1] == "distributed", dashboard=True, progress=False
)
print("RESULT", ok, flush=True)
"""


@pytest.mark.parametrize("mode", ["distributed", "serial"])
def test_run_blockwise_serves_the_page_while_it_runs(tmp_path: Path, mode: str) -> None:
    gate = tmp_path / "gate"
    script = tmp_path / "dash.py"
    script.write_text(DASHBOARD)
    with driver_page(script, mode, str(gate), cwd=tmp_path) as (run, url):
        assert urlsplit(url).hostname == "127.0.0.1"
        assert get(url.replace("token=", "token=x"))[0] == 403
        task = state_of(url)["tasks"][0]
        assert task["name"] == "dash" and task["blocks"] == 20
        assert task["running"] is True and task["done"] == 0
        code, page = get(url)
        assert code == 200 and b"bellis: live" in page
        gate.write_text("go")
        out = run.communicate(timeout=300)[0]
        assert "RESULT True" in out, out
        port = urlsplit(url).port
        assert port is not None
        with pytest.raises(OSError):  # the page ends with the run
            socket.create_connection(("127.0.0.1", port), timeout=10).close()


def test_dashboard_without_a_store_is_a_configuration_error(tmp_path: Path) -> None:
    from kit.user_script import run_script

    text = (
        "import bellis\n"
        "task = bellis.Task('t', total_roi=bellis.Roi((0,), (10,)),"
        " read_roi=bellis.Roi((0,), (5,)), write_roi=bellis.Roi((0,), (5,)),"
        " process_function=lambda b: None, read_write_conflict=False)\n"
        "for value in ('yes', 70000):\n"
        "    try:\n"
        "        bellis.run_blockwise([task], multiprocessing=False, dashboard=value)\n"
        "    except bellis.errors.ConfigurationError as exc:\n"
        "        print('ERROR', exc)\n"
        "try:\n"
        "    bellis.run_blockwise([task], multiprocessing=False, block_tracking=False,"
        " dashboard=True)\n"
        "except bellis.errors.ConfigurationError as exc:\n"
        "    print('ERROR', exc)\n"
    )
    proc = run_script(tmp_path, text)
    errors = [line for line in proc.stdout.splitlines() if line.startswith("ERROR")]
    assert len(errors) == 3, proc.stdout + proc.stderr
    assert "dashboard='yes'" in errors[0] and "dashboard=70000" in errors[1]
    assert "no task of this run has one" in errors[2]


BIG = """
import bellis

task = bellis.Task(
    "big",
    total_roi=bellis.Roi((0, 0), (600, 500)),
    read_roi=bellis.Roi((0, 0), (1, 1)),
    write_roi=bellis.Roi((0, 0), (1, 1)),
    process_function=lambda block: None,
    read_write_conflict=False,
    tracking_path="big",
)
print("RESULT", bellis.run_blockwise([task], multiprocessing=False, progress=False))
"""


@needs_chromium
def test_a_grid_of_more_cells_than_the_map_holds_is_drawn_in_tiles(tmp_path: Path) -> None:
    from kit.user_script import run_script

    proc = run_script(tmp_path, BIG)
    assert "RESULT True" in proc.stdout, proc.stdout + proc.stderr
    store = tmp_path / "big"
    with serve(store) as url:
        state = state_of(url)
        dom = browser.dump_dom(f"{url}#cell=0")
    m = state["tasks"][0]["map"]
    assert m["grid"] == [1, 600, 500] and m["tile"] == [1, 2, 1]
    assert m["shape"] == [1, 300, 500] and len(m["codes"]) < 300_000
    attrs, text = block_pre(dom)
    assert (attrs["data-state"], attrs["data-pixel"]) == ("2", "#2ca02c"), text
    assert "tile of 1 x 2 x 1 cells" in text
