"""A real terminal for the tests that need one: a tmux pane on a private tmux server.

A command runs in ``folder/run.sh`` (:func:`terminal_script`), which takes the test's
``PYTHONPATH``, ``PATH`` and ``HOME``, writes the command's exit status to ``folder/rc.txt``
and keeps the pane open until the test has captured it. :class:`Terminal` is the pane (a
context manager that kills its server on the way out); :func:`run_in_terminal` runs a
command to its end and returns its exit status and what the pane shows.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from types import TracebackType

import pytest

TMUX = shutil.which("tmux")

needs_tmux = pytest.mark.skipif(
    TMUX is None, reason="tmux is not installed (apt-get install -y tmux): no terminal to test with"
)


def terminal_script(folder: Path, command: str, *, setup: str = "") -> Path:
    """``folder/run.sh``: the test's environment, ``setup`` (shell lines), then ``command``
    run in ``folder``; its exit status goes to ``folder/rc.txt``, then the shell sleeps so
    that the pane stays open until it is captured."""
    env = "".join(
        f"export {name}={shlex.quote(os.environ[name])}\n"
        for name in ("PYTHONPATH", "PATH", "HOME")
        if name in os.environ
    )
    script = folder / "run.sh"
    script.write_text(
        f"{env}{setup}cd {shlex.quote(str(folder))}\n{command}\necho $? > rc.txt\nsleep 600\n"
    )
    return script


def exit_status(folder: Path, timeout: float = 300) -> str:
    """The exit status that ``folder/run.sh`` wrote, waiting up to ``timeout`` seconds."""
    rc = folder / "rc.txt"
    deadline = time.monotonic() + timeout
    while not rc.exists() or not rc.read_text().strip():
        assert time.monotonic() < deadline, f"the command did not finish under tmux: {rc}"
        time.sleep(0.2)
    return rc.read_text().strip()


class Terminal:
    """A ``width`` x ``height`` pane running ``command`` (a shell line) on a tmux server of
    its own (its own socket), killed when the ``with`` block ends."""

    def __init__(self, command: str, width: int = 200, height: int = 50) -> None:
        if TMUX is None:
            pytest.skip("tmux is not installed (apt-get install -y tmux): no terminal to test with")
        self._base = [TMUX, "-L", f"bellis-test-{uuid.uuid4().hex[:12]}", "-f", "/dev/null"]
        self._command = command
        self._size = (str(width), str(height))

    def __enter__(self) -> Terminal:
        width, height = self._size
        subprocess.run(
            [*self._base, "new-session", "-d", "-x", width, "-y", height, self._command],
            check=True,
            timeout=60,
        )
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        subprocess.run([*self._base, "kill-server"], capture_output=True, timeout=60, check=False)

    def capture(self, history: int = 0) -> str:
        """The pane's text: the screen, and with ``history`` that many lines above it, with
        wrapped lines joined."""
        extra = ["-J", "-S", f"-{history}"] if history else []
        return subprocess.run(
            [*self._base, "capture-pane", "-p", *extra],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout


def run_in_terminal(folder: Path, command: str, *, setup: str = "") -> tuple[str, str]:
    """Runs ``command`` in a 200 x 50 terminal (see :func:`terminal_script`) to its end;
    returns its exit status and the pane's last 200 lines."""
    script = terminal_script(folder, command, setup=setup)
    with Terminal(f"sh {shlex.quote(str(script))}") as term:
        status = exit_status(folder)
        return status, term.capture(history=200)
