"""Issue 30, item 2: the per-block GPU figures as a user sees them, on a real GPU.

``python tests/gpu/demo_pinned.py OUTDIR``: 20 blocks on 2 workers pinned to one GPU
(``requires={"gpu": 0.5}``, so both share it), ``resource_tracking=True``. Blocks 0-17 run
the spin kernel of ``cuda_load`` (every SM busy for about 0.5 s, 256 MiB held); blocks 18
and 19 use the CPU only. Prints each block's ``gpu_util_pct`` and ``gpu_mem_bytes`` from the
store, the summary panel (its GPU rows), and checks what issue 30 asks: a busy block has
``gpu_util_pct`` > 50 and ``gpu_mem_bytes`` >= its allocation, a CPU-only block NaN (or 0
when its worker still holds a context) and 0 bytes. Exit 0 when all hold, 1 otherwise.
Run by ``tests/gpu/device_check.sh``; needs nothing beyond bellis and nvidia-ml-py (no torch).
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bellis
from bellis import logging as blog

BLOCKS = 20
CPU_ONLY = {18, 19}
NBYTES = 256 << 20


def work(block: bellis.Block) -> None:
    bid = int(block.block_id[1])
    if bid in CPU_ONLY:
        t = time.perf_counter()
        while time.perf_counter() - t < 0.5:
            pass
        return
    import cuda_load

    cuda_load.busy(0.5, NBYTES)


def main() -> int:
    out = Path(sys.argv[1]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.chdir(out)
    blog.set_log_basedir(str(out / "logs"))
    store = out / "store"
    task = bellis.Task(
        "pinned",
        total_roi=bellis.Roi((0,), (BLOCKS,)),
        read_roi=bellis.Roi((0,), (1,)),
        write_roi=bellis.Roi((0,), (1,)),
        process_function=work,
        read_write_conflict=False,
        max_workers=2,
        requires={"gpu": 0.5},
        resource_tracking=True,
        tracking_path=str(store),
    )
    try:
        ok = bellis.run_blockwise(task, progress=False)  # the summary panel goes to stdout
    except bellis.errors.BellisError as exc:  # a failed run still shows its figures
        print(f"the run failed: {exc}")
        ok = False
    print(f"run ok: {ok}")
    import numpy as np
    import zarr

    g = zarr.open_group(str(store), mode="r")
    util = np.asarray(g["gpu_util_pct"][:], dtype=float)
    mem = np.asarray(g["gpu_mem_bytes"][:], dtype=np.int64)
    failures = []
    print("block  kind  gpu_util_pct  gpu_mem_bytes")
    for b in range(BLOCKS):
        kind = "cpu" if b in CPU_ONLY else "gpu"
        print(f"{b:5d}  {kind}  {util[b]:12.1f}  {mem[b]:13d}")
        if kind == "gpu" and not (util[b] > 50 and mem[b] >= NBYTES):
            failures.append(f"block {b}: util {util[b]}, mem {mem[b]} (want > 50, >= {NBYTES})")
        if kind == "cpu" and not ((math.isnan(util[b]) or util[b] < 5) and mem[b] == 0):
            failures.append(f"block {b}: util {util[b]}, mem {mem[b]} (want NaN or ~0, 0)")
    rep = task.report()
    for w in rep.workers.records:
        print(f"worker {w.worker_id}: slot {w.slot}, GPU {w.gpus}, {w.blocks} blocks")
    if {w.gpus for w in rep.workers.records} != {rep.workers.records[0].gpus}:
        failures.append("the two workers were not given the same GPU at gpu=0.5")
    print("GPU figures:", rep.blocks.gpu_util, rep.blocks.gpu_mem)
    for f in failures:
        print("FAIL", f)
    return 0 if ok and not failures else 1


if __name__ == "__main__":
    sys.exit(main())
