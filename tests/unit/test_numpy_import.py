"""How bellis imports numpy: with OpenBLAS's idle spin bounded, in this process only."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

PROBE = r"""
import json, os, sys, time

seen = {}


class Recorder:
    # a meta-path finder that notes the environment at the moment numpy is imported
    def find_spec(self, name, path=None, target=None):
        if name == "numpy" and "numpy" not in seen:
            seen["numpy"] = os.environ.get("OPENBLAS_THREAD_TIMEOUT")
        return None


sys.meta_path.insert(0, Recorder())
if sys.argv[1] == "numpy-first":
    import numpy
import bellis

bellis.Task  # the public surface loads numpy on first use
time.sleep(0.5)
helpers = threads = 0
for tid in os.listdir("/proc/self/task"):
    if int(tid) == os.getpid():
        continue
    with open(f"/proc/self/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    helpers += int(fields[11]) + int(fields[12])
    threads += 1
print(json.dumps({
    "during_import": seen.get("numpy"),
    "after": os.environ.get("OPENBLAS_THREAD_TIMEOUT"),
    "helper_ticks": helpers,
    "helper_threads": threads,
}))
"""


def _probe(mode: str, **env: str) -> dict[str, object]:
    full = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    full.update(env)
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], env=full, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_numpy_is_loaded_with_the_spin_bounded_and_the_environment_restored() -> None:
    r = _probe("bellis-first")
    assert r["during_import"] == "20"
    assert r["after"] is None  # nothing leaks into this process's children
    # OpenBLAS's helper threads went to sleep instead of spinning for ~0.1 s of CPU
    # each (bounded: well under a millisecond each)
    tick = os.sysconf("SC_CLK_TCK")
    spent_ms = int(r["helper_ticks"]) * 1000 // tick  # type: ignore[call-overload]
    assert spent_ms <= 20 + 2 * int(r["helper_threads"]), r  # type: ignore[call-overload]


def test_a_value_the_user_chose_is_kept() -> None:
    r = _probe("bellis-first", OPENBLAS_THREAD_TIMEOUT="26")
    assert r["during_import"] == "26" and r["after"] == "26"


def test_numpy_imported_before_bellis_is_left_alone() -> None:
    r = _probe("numpy-first")
    assert r["during_import"] is None and r["after"] is None
