#!/usr/bin/env bash
# The test command: set up, configure, build, run the CPU tier (ctest -LE gpu).
# Usage: scripts/test.sh [extra ctest args]     PRESET=debug|asan scripts/test.sh for other builds
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
preset=${PRESET:-default}
jobs=$(nproc 2>/dev/null || echo 2)
# The Python package (its module, test label python) is built in the same tree when setup.sh made its
# environment; not in the debug and asan builds (an asan module cannot be loaded by python).
venv=${VENV:-build/venv}
if [ "$preset" = default ] && "$venv/bin/python" -c 'import nanobind, numpy, pytest' >/dev/null 2>&1; then
  py=(-DKDALAB_PYTHON=ON "-DPython_EXECUTABLE=$(cd "$venv/bin" && pwd)/python")
else
  py=(-DKDALAB_PYTHON=OFF)
fi
cmake --preset "$preset" "${py[@]}" >/dev/null
cmake --build "build/$preset" -j "$jobs"
exclude="gpu"
[ "$preset" != "default" ] && exclude="gpu|slow"
ctest --test-dir "build/$preset" -LE "$exclude" --output-on-failure -j "$jobs" "$@"
