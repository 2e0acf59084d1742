#!/usr/bin/env bash
# On the GPU machine (nvcc, cmake, ninja, torch; no network): builds the CUDA Python module from this
# tree with CMake (no pip build, so no isolation), then runs the pytest suite with it, the CUDA
# kernel tests included (python/tests/test_cuda_kernels.py). nanobind and pytest come as wheels in
# .whl/ at the repository root (git-ignored), installed into a target folder, not the system: pure
# Python wheels (python 3.11+), made where there is a network with
#   pip download --only-binary=:all: --no-deps -d .whl nanobind pytest iniconfig packaging pluggy pygments
# and, for bench/fla_kda_bwd.py's files (h5py, a binary wheel for the GPU machine's Python 3.12):
#   pip download --only-binary=:all: --no-deps --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl h5py
# Usage: python/gpu_check.sh [pytest args]
#   PYTHON=python3   the interpreter that has torch and numpy (its C headers are needed too)
#   SITE=/tmp/site   where the wheels are installed
#   JOBS=N           compile jobs (default: the number of cores)
#   PYTEST=0         build only, run no tests
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(command -v "${PYTHON:-python3}")
site=${SITE:-/tmp/site}
if ! PYTHONPATH="$site" "$py" -c 'import nanobind, pytest' >/dev/null 2>&1; then
  ls .whl/*.whl >/dev/null 2>&1 || { echo "gpu_check.sh: no wheels in .whl/ (nanobind, pytest and their dependencies)" >&2; exit 3; }
  "$py" -m pip install -q --no-index --no-deps --target "$site" .whl/*.whl
fi
export PYTHONPATH="$site"
"$py" -c 'import torch, numpy; assert torch.cuda.is_available(), "torch sees no GPU"'
cmake --preset cuda -DKDALAB_PYTHON=ON -DPython_EXECUTABLE="$py" \
  -Dnanobind_DIR="$("$py" -m nanobind --cmake_dir)" >/dev/null
cmake --build build/cuda -j "${JOBS:-$(nproc)}" --target kdalab_py_core kdalab
[ "${PYTEST:-1}" = 0 ] && exit 0
PYTHONPATH="$site:$PWD/python:$PWD/build/cuda/python" KDALAB_BIN="$PWD/build/cuda/experiments/kdalab" \
  "$py" -m pytest -q -p no:cacheprovider -rs python/tests "$@"
