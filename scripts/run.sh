#!/usr/bin/env bash
# The main job in one command: set up, build, run the default experiment suite (quick versions),
# write results/*.h5, draw the figures into figures/ and print a summary.
# Usage: scripts/run.sh            (RESULTS=dir, FIGURES=dir to change where files go)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
jobs=$(nproc 2>/dev/null || echo 2)
cmake --preset default >/dev/null
cmake --build build/default -j "$jobs" --target kdalab   # the tests are built by scripts/test.sh
k=build/default/experiments/kdalab
results=${RESULTS:-results}
mkdir -p "$results"

$k info
echo
# The default suite: quick versions of every experiment that is built.
$k decode-cost --quick --force --out "$results/decode_cost.h5"
echo
$k recall --quick --force --out "$results/recall.h5"
echo
$k copy --quick --force --out "$results/copy.h5"
echo
$k decay-range --quick --force --out "$results/decay_range.h5"
echo
$k parity --quick --force --out "$results/parity.h5"
echo

if [ -x scripts/figures.sh ]; then
  bash scripts/figures.sh "$results"/*.h5 || echo "run.sh: figures failed (see above); results are intact" >&2
fi
# The trained-recall figures come from the GPU runs checked in under data/recall_train/ (docs/recall-training.md),
# each drawn once from all the files of its layout (exit 3: no file of that layout yet, said in one line)
for s in fig_train_kimi.py fig_train_zoology.py; do
  rc=0; /usr/bin/python3 scripts/$s --out-dir figures || rc=$?
  [ $rc = 0 ] || [ $rc = 3 ] || echo "run.sh: $s failed (exit $rc); results are intact" >&2
done
/usr/bin/python3 scripts/summary.py "$results"/*.h5
