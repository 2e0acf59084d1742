#!/usr/bin/env bash
# One pass on the GPU machine: configure + build the cuda preset in a fresh
# folder, run every GPU test binary (directly, so their printed numbers reach the logs), the generator
# checksum test, then `kdalab bench` with the torch MLA baseline timed in the same session and
# --compare against the card's baselines (data/baselines/h200.h5 and h200/*.h5, or data/baselines/h100/*.h5 on an H100).
# Logs and results go to $OUT (default ./gpu-out) and are also packed into $OUT/gpu_pass.tgz (the device tool returns only a few files).
# Usage: bench/gpu_pass.sh [all|kda-prefill|kda-decode|kda-backward|mla-decode|...|none]   (default: all)
# Env: FLA_BENCH_BWD=1 with op all also times fla's forward + backward (bench/fla_kda.py --ops ...,kda-backward).
# Env: TESTS="gpu_test_a gpu_test_b" runs only those GPU test binaries (default: all).
# Env: SANITIZE=1 also runs each GPU test under compute-sanitizer memcheck (timeout SAN_TIMEOUT s each; serial).
# Env: PY=1 also builds the Python package with CUDA, runs its tests and kdalab-verify on kdalab's kernels, has
#   torch's MLA prefill script also time kdalab and torch in turn at the same clocks (--sustained MLA_SUSTAINED s,
#   default 3), and has the fla gradient files carry kdalab's gradients on the same inputs (bench/fla_kda_bwd.py --candidate all);
#   PY=build builds the CUDA module only (no tests, no verify), for those gradient files.
# Env: FLA_BWD_INPUTS="anchor long-memory", FLA_BWD_CASES=B:T:H,... choose the fla gradient files (op all or kda-backward);
#   FLA_BWD_CANDIDATE overrides --candidate (e.g. kernels: fla's and kdalab's files without the float64 one, for long T).
# Env: PARALLEL=0 runs the GPU test binaries one after another (default 1: all at once, see below).
# Exit status: 1 when a GPU test process failed (after everything else ran and was packed), else 0.
set -u
OUT=${OUT:-./gpu-out}; B=${BUILD:-build/cuda}; mkdir -p "$OUT"
pack() { t=$(mktemp) && tar czf "$t" --exclude=gpu_pass.tgz --exclude="./fla_bwd/*.h5" -C "$OUT" . && mv "$t" "$OUT/gpu_pass.tgz"; }
# Each step's log is packed as soon as it ends, so a pass cut short by the device's time limit still returns its logs.
step() { local name=$1; shift; echo "== $name: $*"; local t0=$SECONDS
  "$@" > "$OUT/$name.log" 2>&1; local rc=$?; tail -n ${TAIL:-25} "$OUT/$name.log"
  echo "== $name rc=$rc ($((SECONDS - t0)) s)"; pack; return $rc; }
step configure cmake --preset cuda -B "$B" || { pack; exit 1; }
step build cmake --build "$B" -j"$(nproc)" -- -k || {
  echo "== -Werror build failed (see build.log); rebuilding with -DKDALAB_WERROR=OFF to keep measuring"
  cmake -B "$B" -DKDALAB_WERROR=OFF > /dev/null && step build-nowerror cmake --build "$B" -j"$(nproc)" -- -k; }
# PARALLEL=1 (the default without SANITIZE): every GPU test binary at once, gpu_test_kda_kernels split by its tags into
# the groups below (a disjoint cover of its test cases; the three [long] cases each alone), one log per process, then one
# summary line per log. The GPU has room for all of them: ~95 s on an H200 against several minutes
# serially. Timings printed by tests run in parallel are not benchmarks.
# the GPU test binaries to run (TESTS filter, executables only): one list for both modes
gpu_tests() { for t in "$B"/tests/gpu_test_*; do
  [ -n "${TESTS:-}" ] && ! [[ " $TESTS " == *" $(basename "$t") "* ]] && continue
  [ -x "$t" ] && echo "$t"; done; }
KDA_GROUPS=("[gpu][kda]~[dim]~[segments]~[long]" "[segments]~[long]" "[dim]~[long]~[segments]" "[segments][long]"
            "[wg][long]" "[dim][long]")
failed=0  # GPU test processes that exited non-zero: the script's exit status says so (a GPU CI gate must see it)
if [ "${PARALLEL:-$([ "${SANITIZE:-0}" = 1 ] && echo 0 || echo 1)}" = 1 ]; then
  pids=(); logs=()
  for t in $(gpu_tests); do
    if [ "$(basename "$t")" = gpu_test_kda_kernels ]; then
      for i in "${!KDA_GROUPS[@]}"; do
        l="$OUT/gpu_test_kda_kernels.g$i.log"; logs+=("$l")
        "$t" "${KDA_GROUPS[$i]}" --durations yes > "$l" 2>&1 & pids+=($!)
      done
    else
      l="$OUT/$(basename "$t").log"; logs+=("$l")
      "$t" --durations yes > "$l" 2>&1 & pids+=($!)
    fi
  done
  echo "== GPU tests: ${#pids[@]} processes in parallel"; t0=$SECONDS
  for pid in "${pids[@]}"; do wait "$pid" || failed=$((failed + 1)); done
  for l in "${logs[@]}"; do echo "$(basename "$l"): $(grep -E 'All tests passed|test cases:' "$l" | tail -1)"; done
  echo "== GPU tests done ($((SECONDS - t0)) s)"; pack
else
  for t in $(gpu_tests); do
    TAIL=${TEST_TAIL:-60} step "$(basename "$t")" "$t" --durations yes || failed=$((failed + 1))
    [ "${SANITIZE:-0}" = 1 ] && TAIL=3 step "san-$(basename "$t")" timeout "${SAN_TIMEOUT:-90}" compute-sanitizer --tool memcheck "$t"
  done
fi
step ctest-generator ctest --test-dir "$B" -R generator --output-on-failure
# PY=1: the Python package's CUDA build and tests (python/gpu_check.sh; needs nanobind and pytest wheels in .whl/), then
# kdalab-verify on kdalab's own KDA prefill and MLA decode kernels (unbuffered, with faulthandler: a crash names its frame)
# PY=build: the CUDA module only (no pytest, no verify), enough for the gradient table below
pyenv=(env PYTHONUNBUFFERED=1 "PYTHONPATH=${SITE:-/tmp/site}:$PWD/python:$PWD/$B/python" "KDALAB_BIN=$PWD/$B/experiments/kdalab")
[ "${PY:-0}" = build ] && { step py-cuda env PYTEST=0 bash python/gpu_check.sh || failed=$((failed + 1)); }
if [ "${PY:-0}" = 1 ]; then
  step py-cuda bash python/gpu_check.sh || failed=$((failed + 1))
  step verify-kda "${pyenv[@]}" python3 -X faulthandler -m kdalab.verify --op kda --adapter kdalab-cuda \
    --param d_k=128 --param d_v=128 --out "$OUT/verify-kda.h5"
  step verify-mla "${pyenv[@]}" python3 -X faulthandler -m kdalab.verify --op mla_decode --adapter kdalab-mla-cuda \
    --param n_h=16 --param d_c=512 --out "$OUT/verify-mla.h5"
fi
op=${1:-all}
if [ "$op" != none ]; then
  peer=(); cmp=()
  case "$op" in all|mla-decode)
    step torch-mla python3 bench/torch_mla_decode.py "$OUT/torch_mla.json" --force && peer+=(--peer-json "$OUT/torch_mla.json");; esac
  # torch's MLA prefill (K, V products + SDPA per backend): the peer of the mla-prefill-fast rows
  # With PY (kdalab.cuda built) it also times kdalab's fast precision and torch's best backend in turn at the same
  # clocks (--sustained MLA_SUSTAINED seconds a shape, default 3; docs/kernels/mla_prefill.md)
  case "$op" in all|mla-prefill)
    sus=(); [ "${PY:-0}" != 0 ] && sus=(--sustained "${MLA_SUSTAINED:-3}")
    step torch-mla-prefill "${pyenv[@]}" python3 bench/torch_mla_prefill.py "$OUT/torch_mla_prefill.json" --force "${sus[@]}" \
      && peer+=(--peer-json "$OUT/torch_mla_prefill.json");; esac
  # fla (KDA peer) when its source was carried to peers/fla-src (git-ignored; see bench/fla_kda.py). kda-backward: fla's
  # forward + backward rows only (--ops kda-backward); op all adds them to the default ops only with FLA_BENCH_BWD=1
  # (fla's backward compiles and autotunes for several minutes on its first call)
  case "$op" in all|kda-prefill|kda-decode|kda-backward)
    fla_ops=(); [ "$op" = kda-backward ] && fla_ops=(--ops kda-backward)
    [ "$op" = all ] && [ "${FLA_BENCH_BWD:-0}" = 1 ] && fla_ops=(--ops kda-prefill,kda-decode,check,kda-backward)
    [ -d peers/fla-src ] && step fla-kda python3 bench/fla_kda.py --fla-path peers/fla-src --json "$OUT/fla_kda.json" \
      --check-dir "$OUT/fla_check" "${fla_ops[@]}" && peer+=(--peer-json "$OUT/fla_kda.json");; esac
  # the baselines of this card: data/baselines/h100/*.h5 on an H100 (all.h5, and the rows it lacks: kda-backward,
  # the accurate precision's kda-prefill rows, the mla-prefill rows behind a cached prefix), otherwise
  # data/baselines/h200/*.h5 (one file an op, newer) before data/baselines/h200.h5 (the rows they lack: kda-decode and
  # the default kda-prefill rows of D = 64 and 256); --compare takes a row from the first file that has it
  base=(data/baselines/h200/*.h5 data/baselines/h200.h5); nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H100 && base=(data/baselines/h100/*.h5)
  for f in "${base[@]}"; do [ -f "$f" ] && cmp+=(--compare "$f"); done
  TAIL=${BENCH_TAIL:-40} step "bench-$op" "$B/experiments/kdalab" bench --op "$op" "${peer[@]}" "${cmp[@]}" --out "$OUT/bench-$op.h5"
  # fla's KDA gradients (bench/fla_kda_bwd.py) checked by `kdalab check --op kda-bwd`: with op all or kda-backward,
  # peers/fla-src present, FLA_BWD not 0 and a kdalab whose check knows kda-bwd; FLA_BWD_INPUTS lists the input
  # distributions (default anchor; e.g. "anchor long-memory"), FLA_BWD_CASES the cases (default: the script's), the
  # budget FLA_BWD_BUDGET seconds each. The .h5 files stay out of gpu_pass.tgz (too large).
  if { [ "$op" = all ] || [ "$op" = kda-backward ]; } && [ -d peers/fla-src ] && [ "${FLA_BWD:-1}" != 0 ]; then
    if "$B/experiments/kdalab" check --help 2>&1 | grep -q kda-bwd; then
      # with PY=1 or PY=build kdalab's own gradients on the same inputs too (--candidate all, through kdalab.torch)
      cand=both; fenv=(); [ "${PY:-0}" != 0 ] && { cand=all; fenv=("${pyenv[@]}"); }
      cand=${FLA_BWD_CANDIDATE:-$cand}
      fcases=(); [ -n "${FLA_BWD_CASES:-}" ] && fcases=(--cases "$FLA_BWD_CASES")
      for inp in ${FLA_BWD_INPUTS:-anchor}; do
        step "fla-kda-bwd-$inp" "${fenv[@]}" python3 bench/fla_kda_bwd.py --fla-path peers/fla-src --out-dir "$OUT/fla_bwd" \
          --candidate $cand --inputs "$inp" "${fcases[@]}" --force --time-budget "${FLA_BWD_BUDGET:-300}"
      done
      for f in "$OUT"/fla_bwd/fla_kda_bwd_*.h5; do [ -f "$f" ] || continue; n=$(basename "$f" .h5)
        TAIL=30 step "check-$n" "$B/experiments/kdalab" check --op kda-bwd --in "$f" --out "$OUT/fla_bwd/$n.report.h5"; done
    else echo "== fla-kda-bwd skipped: this kdalab check has no --op kda-bwd"; fi
  fi
fi
pack
[ "$failed" = 0 ] || { echo "== $failed GPU test process(es) failed (see their logs)"; exit 1; }
