#!/usr/bin/env bash
# The test command: set up, configure, build, run the CPU tier (ctest -LE gpu).
# Usage: scripts/test.sh [extra ctest args]     PRESET=debug|asan scripts/test.sh for other builds
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
preset=${PRESET:-default}
jobs=$(nproc 2>/dev/null || echo 2)
cmake --preset "$preset" >/dev/null
cmake --build "build/$preset" -j "$jobs"
exclude="gpu"
[ "$preset" != "default" ] && exclude="gpu|slow"
ctest --test-dir "build/$preset" -LE "$exclude" --output-on-failure -j "$jobs" "$@"
