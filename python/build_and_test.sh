#!/usr/bin/env bash
# Builds the Python package kdalab (pyproject.toml) into a virtual environment and runs its pytest
# suite. The build folder build/python/ is kept, so a second run rebuilds only what changed.
# Usage: python/build_and_test.sh [pytest args]
#   VENV=DIR      the virtual environment (default build/venv-pip, apart from the build/venv of
#                 scripts/setup.sh, where the package is the in-tree build; made when missing)
#   JOBS=N        compile jobs (default: the number of cores)
#   KDALAB_BIN=F  the kdalab binary whose `check` truth the oracle is compared with (default
#                 build/default/experiments/kdalab; those tests are skipped without it)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${VENV:-build/venv-pip}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
# The build needs nanobind and scikit-build-core in the environment (no build isolation: a machine
# without network builds with what is installed), the package numpy, the tests pytest.
"$py" -c 'import nanobind, scikit_build_core, numpy, pytest' 2>/dev/null ||
  "$py" -m pip install -q nanobind scikit-build-core numpy pytest
export CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-$(nproc 2>/dev/null || echo 2)}
"$py" -m pip install -q --no-build-isolation --no-deps .
"$py" -m pytest -q python/tests "$@"
