#!/usr/bin/env bash
# Issue 30, item 2: the GPU figures and the local GPU assignment on a real GPU, in one go.
#
# Prepare here (CPU machine, once):  bash tests/gpu/fetch_wheels.sh     (fills .whl/, ~19 MB)
# Run with the device tool, from the repo root:
#   run(command="bash tests/gpu/device_check.sh", carry=[".whl"], timeout_s=540)
# Everything is bounded by `timeout`; the whole script ends within DEVICE_CHECK_LIMIT
# seconds (default 480). Results come back under $OUT (at most 8 files, 2 folders deep):
#   device_check.log  everything printed            pytest_gpu.txt  pytest tests/gpu -x -q
#   demo.txt          per-block figures + panel     status.txt      bellis status
#   report.html       bellis report of the demo     store.tar.gz    the demo's tracking store
#   logs.tar.gz       the demo's worker slot logs
# Exit status: 0 all passed; 1 a check failed (read the files); 10 setup failed.
set -u -o pipefail
OUT=${OUT:-$(mktemp -d)}
LIMIT=${DEVICE_CHECK_LIMIT:-480}
START=$(date +%s)
cd "$(dirname "$0")/../.." || exit 10
exec > >(tee "$OUT/device_check.log") 2>&1
export PYTHONUNBUFFERED=1
left() { echo $((LIMIT - ($(date +%s) - START))); }
step() { echo; echo "=== $* ($(left)s left)"; }
fail=0

step "device"
timeout 30 nvidia-smi --query-gpu=name,uuid,memory.total,mig.mode.current,driver_version \
  --format=csv || echo "nvidia-smi failed"
echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-<unset>}"

step "setup: venv over the image's packages, bellis[gpu] from this tree and .whl"
# the image's python3 holds torch, numpy, pytest and nvidia-ml-py; nothing can be fetched
# there, so the dependencies it lacks come from .whl (tests/gpu/fetch_wheels.sh). The test
# extra's linters and cluster tools are not needed for tests/gpu and are not installed.
# torch: tests/gpu needs none (cuda_load drives libcuda through ctypes), so none is added.
timeout 120 python3 -m venv --system-site-packages .venv-gpu || exit 10
PY=$PWD/.venv-gpu/bin/python
timeout 180 "$PY" -m pip install -q --no-index --find-links .whl --no-build-isolation \
  -e ".[gpu]" || { echo "pip install failed: was .whl carried?"; exit 10; }
"$PY" -c "import bellis, pynvml, zarr; print('bellis', bellis.__file__, 'zarr', zarr.__version__)" \
  || exit 10

step "pytest tests/gpu -x -q"
timeout $(( $(left) > 300 ? 240 : $(left) / 2 )) "$PY" -m pytest tests/gpu -x -q -rs \
  -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.txt"
rc=$?; [ $rc -eq 0 ] || { echo "tests/gpu FAILED (exit $rc)"; fail=1; }
grep -q "skipped" "$OUT/pytest_gpu.txt" && ! grep -q "passed" "$OUT/pytest_gpu.txt" \
  && { echo "tests/gpu were all skipped: NVML found no GPU"; fail=1; }

step "demo: 20 blocks, 2 workers on one GPU (gpu=0.5), resource_tracking=True"
DEMO=$(mktemp -d)
timeout $(( $(left) > 160 ? 120 : $(left) / 2 )) "$PY" tests/gpu/demo_pinned.py "$DEMO" \
  2>&1 | tee "$OUT/demo.txt"
rc=$?; [ $rc -eq 0 ] || { echo "demo FAILED (exit $rc)"; fail=1; }
echo "--- the panel's GPU rows:"
grep -i "gpu" "$OUT/demo.txt" | grep -v "^ *[0-9]* *gpu " || echo "(no GPU row in the panel)"

step "bellis status / report"
timeout 60 "$PY" -m bellis status "$DEMO/store" 2>&1 | tee "$OUT/status.txt"
timeout 60 "$PY" -m bellis report "$DEMO/store" -o "$OUT/report.html" || fail=1
grep -o "gpu[ _]util[^<]\{0,80\}" "$OUT/report.html" | head -5
tar -czf "$OUT/store.tar.gz" -C "$DEMO" store 2>/dev/null || echo "no store to bring back"
tar -czf "$OUT/logs.tar.gz" -C "$DEMO" logs 2>/dev/null || echo "no logs to bring back"

step "done: $([ $fail -eq 0 ] && echo ALL PASSED || echo 'SOMETHING FAILED')"
exit $fail
