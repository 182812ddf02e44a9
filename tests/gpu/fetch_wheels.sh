#!/usr/bin/env bash
# Run HERE (a machine with pip's index), from the repo root, before tests/gpu/device_check.sh:
# the device machine reaches no index, and its image (Python 3.12, torch, numpy, pytest,
# nvidia-ml-py, msgpack, psutil, cloudpickle, tqdm, narwhals...) lacks these of bellis's
# dependencies. They go to .whl/ (ignored by git), which the device call carries.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -d .whl \
  zarr==3.1.6 numcodecs==0.16.6 donfig==0.8.1.post1 google-crc32c==1.9.0 plotly==7.1.0 \
  funlib.geometry==0.3.0
ls -la .whl && du -sh .whl
