"""The real-workload benchmark of issue 38 (``benchmarks/bench_real.py``): its kernels,
data and runners. Importable by worker processes (they get the driver's ``sys.path``)."""
