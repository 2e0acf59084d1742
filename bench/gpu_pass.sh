#!/usr/bin/env bash
# One pass on the GPU machine (see ../shared/GPU.md): configure + build the cuda preset in a fresh
# folder, run the GPU tests, then the benchmarks given as arguments (default: all ops), with the torch
# MLA baseline timed in the same session. Every step's log goes to $OUT (default ./gpu-out).
# Usage: bench/gpu_pass.sh [bench-op ...|none]      e.g. bench/gpu_pass.sh mla-decode
set -u
OUT=${OUT:-./gpu-out}; B=${BUILD:-/tmp/b}; mkdir -p "$OUT"
step() { local name=$1; shift; echo "== $name: $*"; local t0=$SECONDS
  "$@" > "$OUT/$name.log" 2>&1; local rc=$?; tail -n ${TAIL:-25} "$OUT/$name.log"
  echo "== $name rc=$rc ($((SECONDS - t0)) s)"; return $rc; }
step configure cmake --preset cuda -B "$B" || exit 1
step build cmake --build "$B" -j"$(nproc)" -- -k || {
  echo "== -Werror build failed (see build.log); rebuilding with -DKDALAB_WERROR=OFF to keep measuring"
  cmake -B "$B" -DKDALAB_WERROR=OFF > /dev/null && step build-nowerror cmake --build "$B" -j"$(nproc)" || exit 1; }
# the GPU tests run directly (not through ctest) so their printed accuracy numbers reach the logs
for t in "$B"/tests/gpu_test_*; do [ -x "$t" ] && TAIL=${TEST_TAIL:-60} step "$(basename "$t")" "$t" --durations yes; done
step ctest-generator ctest --test-dir "$B" -R generator --output-on-failure
ops=("$@"); [ ${#ops[@]} -eq 0 ] && ops=(kda-prefill kda-decode mla-decode); [ "${ops[0]}" = none ] && ops=()
for op in "${ops[@]}"; do
  peer=()
  if [ "$op" = mla-decode ]; then
    step torch-mla python3 bench/torch_mla_decode.py "$OUT/torch_mla.json" && peer=(--peer-json "$OUT/torch_mla.json")
  fi
  step "bench-$op" "$B/experiments/kdalab" bench --op "$op" "${peer[@]}" --out "$OUT/bench-$op.h5"
done
