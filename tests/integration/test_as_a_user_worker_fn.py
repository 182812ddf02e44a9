"""Worker functions as users write them, run the three ways a user runs them.

Each pattern is a 0-argument worker function with its own ``bellis.Client()`` (in a module
written to ``tmp_path``); each test runs a driver script in a subprocess that uses the
public API only, in one of these ways:

* ``local``: ``run_blockwise`` with the worker function as the process function;
* ``cli``: ``Server(external_workers=True)`` fed by ``bellis worker --function ...``;
* ``script``: the same server fed by a hand-written worker script (nothing of bellis runs
  after the function: only the interpreter's exit can send its finished blocks home);
* ``dask``: ``run_blockwise`` with ``bellis.DaskLauncher`` on a ``distributed.LocalCluster``.

Every block appends its id to a file when it finishes; each must be there exactly once, the
tracking store (``bellis status``) must mark every block done, and nothing may be reported
lost or orphaned. ``max_worker_restarts=1`` is small enough that charging the clean exits of
workers that did their share would abandon the task. (``Client.release_block`` does not
exist, in bellis or in daisy 2.0.0's ``Client``, so there is no pattern for it.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BLOCKS = 6

USER_MODULE = r'''
import os
import sys

import bellis

OUT = os.environ["WFN_OUT"]


def record(block):
    fd = os.open(os.path.join(OUT, "done.txt"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, f"{block.block_id[1]} {os.getpid()}\n".encode())
    finally:
        os.close(fd)


def first_time(name):
    """True for the first caller in the run (an exclusive marker file)."""
    try:
        fd = os.open(os.path.join(OUT, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def one_block():
    client = bellis.Client()
    with client.acquire_block() as block:
        if block is not None:
            record(block)


def three_blocks():
    client = bellis.Client()
    for _ in range(3):
        with client.acquire_block() as block:
            if block is None:
                return
            record(block)


def loop_until_none():
    client = bellis.Client()
    while True:
        with client.acquire_block() as block:
            if block is None:
                break
            record(block)


def return_without_acquiring():
    client = bellis.Client()
    if first_time("returned"):
        return  # the first worker leaves at once; the others loop
    while True:
        with client.acquire_block() as block:
            if block is None:
                break
            record(block)


def raise_after_blocks():
    client = bellis.Client()
    while True:
        with client.acquire_block() as block:
            if block is None:
                return
            record(block)
        if block.block_id[1] == 2 and first_time("raised"):
            raise RuntimeError("the user's code failed after its blocks")


def loop_in_a_thread():
    # returns at once; Python waits for the thread, which still uses the client
    import threading

    client = bellis.Client()

    def loop():
        while True:
            with client.acquire_block() as block:
                if block is None:
                    break
                record(block)

    threading.Thread(target=loop).start()


def fork_a_child_that_exits():
    client = bellis.Client()
    while True:
        with client.acquire_block() as block:
            if block is None:
                break
            record(block)
        pid = os.fork()
        if pid == 0:
            sys.exit(0)  # a child that ends normally runs the exit hooks
        os.waitpid(pid, 0)


def raise_in_block():
    client = bellis.Client()
    while True:
        with client.acquire_block() as block:
            if block is None:
                return
            if block.block_id[1] == 3 and first_time("raised"):
                raise RuntimeError("the user's block failed")
            record(block)
'''

WORKER_SCRIPT = r"""
import sys

import user_worker

getattr(user_worker, sys.argv[1])()
"""

DRIVER = r"""
import json
import os
import subprocess
import sys
import threading
import time

import bellis
import user_worker

mode, pattern, track = sys.argv[1:4]
task = bellis.Task(
    "t",
    total_roi=bellis.Roi((0,), (int(os.environ["WFN_BLOCKS"]),)),
    read_roi=bellis.Roi((0,), (1,)),
    write_roi=bellis.Roi((0,), (1,)),
    process_function=None if mode in ("cli", "script") else getattr(user_worker, pattern),
    max_workers=2,
    max_worker_restarts=1,
    tracking_path=track,
)
codes = []
if mode == "local":
    states = bellis.run_blockwise([task], return_states=True, progress=False, summary=False)
elif mode == "dask":
    from distributed import Client, LocalCluster

    with LocalCluster(
        n_workers=1,
        processes=False,
        threads_per_worker=2,
        dashboard_address=":0",
        silence_logs=40,
    ) as cluster, Client(cluster) as dask_client:
        states = bellis.run_blockwise(
            [task],
            launcher=bellis.DaskLauncher(dask_client),
            return_states=True,
            progress=False,
            summary=False,
        )
else:
    here = os.path.dirname(os.path.abspath(__file__))
    procs = []
    stop = threading.Event()

    def feed(server):
        # keep two external workers running, as a user's job script would
        ctx = server.worker_context("t")
        env = dict(os.environ, BELLIS_CONTEXT=ctx, PYTHONPATH=os.pathsep.join(
            [here, os.environ.get("PYTHONPATH", "")]))
        if mode == "cli":
            cmd = [os.path.join(os.path.dirname(sys.executable), "bellis"), "worker",
                   "--function", f"user_worker:{pattern}", "--context", ctx]
        else:
            cmd = [sys.executable, os.path.join(here, "worker_script.py"), pattern]
        while not stop.is_set():
            if sum(p.poll() is None for p in procs) < 2:
                procs.append(subprocess.Popen(cmd, env=env, cwd=here))
            time.sleep(0.05)

    feeder = []

    def on_listen(server):
        t = threading.Thread(target=feed, args=(server,), daemon=True)
        t.start()
        feeder.append(t)

    server = bellis.Server(external_workers=True, on_listen=on_listen)
    states = server.run_blockwise([task], progress=False, summary=False)
    stop.set()
    for t in feeder:
        t.join()
    codes = [p.wait(timeout=120) for p in procs]
s = states["t"]
print("RESULT " + json.dumps({
    "completed": s.completed_count,
    "failed": s.failed_count,
    "orphaned": s.orphaned_count,
    "abandoned": s.abandoned,
    "restarts": s.worker_restart_count,
    "starts": s.worker_start_count,
    "failures": s.worker_failure_count,
    "failed_attempts": s.failed_attempt_count,
    "codes": codes,
}))
"""

MODES = [
    "local",
    "cli",
    "script",
    pytest.param("dask", marks=pytest.mark.dask),
]


def _run(tmp_path: Path, mode: str, pattern: str) -> tuple[dict[str, object], str]:
    if mode == "dask":
        pytest.importorskip("distributed", reason="dask.distributed is not installed")
    (tmp_path / "user_worker.py").write_text(USER_MODULE)
    (tmp_path / "worker_script.py").write_text(WORKER_SCRIPT)
    (tmp_path / "driver.py").write_text(DRIVER)
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, WFN_OUT=str(out), WFN_BLOCKS=str(BLOCKS))
    track = tmp_path / "track"
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "driver.py"), mode, pattern, str(track)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    head, tail = text.split("RESULT ", 1)
    result_line, _, rest = tail.partition("\n")
    result = json.loads(result_line)
    said = (head + rest).lower()  # what bellis and the workers printed
    # every block finished exactly once: none lost (and so none done twice)
    lines = (out / "done.txt").read_text().split()
    done = sorted(int(x) for x in lines[0::2])
    assert done == list(range(BLOCKS)), text
    # the tracking store marks every block done
    status = subprocess.run(
        [str(Path(sys.executable).parent / "bellis"), "status", str(track)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 0, status.stderr
    counts = dict(
        line.split()[:2]
        for line in status.stdout.splitlines()
        if line.strip()[:4] in ("done", "fail")
    )
    assert counts == {"done": str(BLOCKS), "failed": "0"}, status.stdout
    assert result["completed"] == BLOCKS and not result["abandoned"], text
    assert (result["failed"], result["orphaned"]) == (0, 0), text
    assert "lost" not in said and "orphan" not in said, text
    return result, text


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "pattern", ["one_block", "three_blocks", "loop_until_none", "loop_in_a_thread"]
)
def test_a_worker_function_that_returns_keeps_its_blocks(
    tmp_path: Path, mode: str, pattern: str
) -> None:
    result, text = _run(tmp_path, mode, pattern)
    assert result["failures"] == 0, text
    # a clean exit after doing work is replaced for free
    assert result["restarts"] == 0, text
    assert set(result["codes"]) <= {0}, text  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", MODES)
def test_a_worker_function_that_returns_without_acquiring(tmp_path: Path, mode: str) -> None:
    result, text = _run(tmp_path, mode, "return_without_acquiring")
    assert result["failures"] == 0, text
    # a worker that connects and leaves without a block does spend budget (else a function
    # that always returns at once would be restarted forever): one start at most here
    assert result["restarts"] <= (1 if mode in ("local", "dask") else 0), text
    assert set(result["codes"]) <= {0}, text  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", MODES)
def test_a_worker_function_that_raises_after_its_blocks_keeps_them(
    tmp_path: Path, mode: str
) -> None:
    # the function raises right after block 2 finished: block 2 (and the blocks before it)
    # are done once, not failed and not run again
    result, text = _run(tmp_path, mode, "raise_after_blocks")
    assert result["failed_attempts"] == 0, text
    # (the exit is a worker failure if the run still had blocks left then)
    assert result["failures"] <= 1 and result["restarts"] <= 1, text
    if mode in ("cli", "script"):
        assert "the user's code failed after its blocks" in text
        assert sorted(result["codes"]).count(1) == 1, text  # type: ignore[arg-type]
        assert set(result["codes"]) <= {0, 1}, text  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", MODES)
def test_a_worker_function_whose_block_raises_fails_that_block_only(
    tmp_path: Path, mode: str
) -> None:
    result, text = _run(tmp_path, mode, "raise_in_block")
    # block 3 failed once and succeeded on its retry; the others ran once each
    assert result["failed_attempts"] == 1, text
    # (its worker's exit is a failure if the run still had blocks left then)
    assert result["failures"] <= 1 and result["restarts"] <= 1, text
    if mode in ("cli", "script"):
        assert "the user's block failed" in text
        assert sorted(result["codes"]).count(1) == 1, text  # type: ignore[arg-type]
        assert set(result["codes"]) <= {0, 1}, text  # type: ignore[arg-type]


ABANDON_DRIVER = r"""
import os

import bellis


def crash(block):
    os._exit(3)  # the worker dies with the block: it is lost, every time


def ok(block):
    pass


roi = bellis.Roi((0,), (4,))
one = bellis.Roi((0,), (1,))
a = bellis.Task("a", total_roi=roi, read_roi=one, write_roi=one, process_function=crash,
                max_workers=1, max_worker_restarts=1, max_retries=5)
b = bellis.Task("b", total_roi=roi, read_roi=one, write_roi=one, process_function=ok,
                upstream_tasks=[a], max_workers=1)
try:
    bellis.run_blockwise([a, b], progress=False, summary=False)
except bellis.TaskAbandonedError as exc:
    print("MESSAGE " + str(exc).replace("\n", " | "))
"""


def test_the_abandonment_message_calls_lost_blocks_lost(tmp_path: Path) -> None:
    """A task that runs out of workers lost its blocks; only its downstream task's blocks
    are orphaned (``orphaned_count`` counts both, as in daisy)."""
    (tmp_path / "driver.py").write_text(ABANDON_DRIVER)
    proc = subprocess.run(
        [sys.executable, "-W", "ignore::DeprecationWarning", str(tmp_path / "driver.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    message = text.split("MESSAGE ", 1)[1].splitlines()[0]
    a_part, b_part = message.split(" | ")[:2]
    assert a_part.startswith("task 'a' was abandoned (worker restart cap exhausted)"), message
    assert "4 of 4 blocks were lost" in a_part and "orphan" not in a_part, message
    assert b_part == (
        "task 'b' was abandoned (upstream task abandoned): 4 of 4 blocks were orphaned."
    )
    assert "task 'a' abandoned: worker restart cap reached; its 4 remaining blocks are lost" in text


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_of_a_worker_function_leaves_its_blocks_alone(tmp_path: Path) -> None:
    # the child inherits the worker's client: ending normally, it must neither report the
    # parent's finished blocks nor close the parent's session
    result, text = _run(tmp_path, "local", "fork_a_child_that_exits")
    assert (result["failures"], result["restarts"], result["failed_attempts"]) == (0, 0, 0), text
    # the two workers kept their sessions to the end (a child that closed one would have
    # ended it after a block, and a third worker would have been started)
    assert result["starts"] == 2, text


STRAGGLER = """
import socket
import threading

import bellis

# a run that ends while this worker's connection waits to be accepted: its listener closes
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(8)
port = listener.getsockname()[1]
threading.Timer(0.5, listener.close).start()
context = bellis.Context(
    hostname="127.0.0.1", port=port, task_id="t", worker_id=-1, secret="00" * 32
)
client = bellis.Client(context)
with client.acquire_block() as block:
    print("BLOCK", block, "CONNECTED", client.connected)
"""


def test_a_worker_that_connects_as_the_run_ends_exits_cleanly(tmp_path: Path) -> None:
    (tmp_path / "straggler.py").write_text(STRAGGLER)
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "straggler.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "BLOCK None CONNECTED False" in proc.stdout
    assert "assuming the run has ended" in proc.stderr
    assert "Traceback" not in proc.stderr


LATE_HELLO_DRIVER = r"""
import os
import subprocess
import sys
import time

import bellis

here = os.path.dirname(os.path.abspath(__file__))
procs = {}


def on_listen(server):
    env = dict(os.environ, BELLIS_CONTEXT=server.worker_context("t"), PYTHONPATH=os.pathsep.join(
        [here, os.environ.get("PYTHONPATH", "")]))
    for name in ("worker", "straggler"):
        procs[name] = subprocess.Popen([sys.executable, os.path.join(here, name + ".py")],
                                       env=env, cwd=here)


task = bellis.Task("t", total_roi=bellis.Roi((0,), (1,)), read_roi=bellis.Roi((0,), (1,)),
                   write_roi=bellis.Roi((0,), (1,)), process_function=None, max_workers=1)
server = bellis.Server(external_workers=True, on_listen=on_listen)
states = server.run_blockwise([task], progress=False, summary=False)
open(os.path.join(here, "ended"), "w").close()  # the run is over: the straggler says HELLO
codes = {name: p.wait(timeout=120) for name, p in procs.items()}
print("COMPLETED", states["t"].completed_count, "CODES", codes["worker"], codes["straggler"])
"""

LATE_HELLO_WORKER = r"""
import os
import time

import bellis

client = bellis.Client()
while True:
    with client.acquire_block() as block:
        if block is None:
            break
        # the run's only block ends once the straggler holds its challenge
        while not os.path.exists("challenged"):
            time.sleep(0.01)
"""

# a worker held up (as on a loaded node) between the server's challenge and its HELLO, until
# the run has ended and the server has closed its connection: the HELLO gets an end of
# stream or a reset back, and the worker must take the "run has ended" path (exit 0)
LATE_HELLO_STRAGGLER = r"""
import os
import socket
import time

import bellis

sendall = socket.socket.sendall


def late_sendall(self, data, *args):
    if not os.path.exists("challenged"):
        open("challenged", "w").close()
        while not os.path.exists("ended"):
            time.sleep(0.01)
        time.sleep(0.5)
    return sendall(self, data, *args)


socket.socket.sendall = late_sendall
client = bellis.Client()
with client.acquire_block() as block:
    print("BLOCK", block, "CONNECTED", client.connected)
"""


def test_a_worker_whose_hello_arrives_after_the_run_ended_exits_cleanly(tmp_path: Path) -> None:
    (tmp_path / "driver.py").write_text(LATE_HELLO_DRIVER)
    (tmp_path / "worker.py").write_text(LATE_HELLO_WORKER)
    (tmp_path / "straggler.py").write_text(LATE_HELLO_STRAGGLER)
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "driver.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    assert "COMPLETED 1 CODES 0 0" in proc.stdout, text
    assert "BLOCK None CONNECTED False" in proc.stdout, text
    assert "during the handshake" in proc.stderr and "assuming the run has ended" in text, text
    assert "Traceback" not in proc.stderr, text
