#!/usr/bin/env bash
# Runs a grid of `python -m kdalab.train_recall` on one machine as one shard per run, --jobs at a time, then joins the
# shard files with `kdalab merge` into DIR/<grid>.h5 (docs/recall-training.md, "Sharding a grid"). The small models
# of the reduced grids leave one GPU idle with a single process; several processes share it.
#
# Usage: scripts/train_recall_shards.sh --grid GRID --out-dir DIR [--jobs N] [--deadline SECONDS] [-- OPTIONS...]
#   --grid GRID        a train_recall grid (zoology-reduced, kimi-reduced, zoology, kimi)
#   --out-dir DIR      where the shard files <grid>-shard-I-of-N.h5 and the merged <grid>.h5 go (made when missing)
#   --jobs N           shards at a time (default 8)
#   --deadline S       stop the shards still running after S seconds (SIGTERM: each saves its checkpoint at a step
#                      boundary); run the script again with the same options and folder to go on
#   -- OPTIONS         passed to every shard (e.g. -- --mixers softmax --log-every 500); each shard also gets
#                      --shard I/N and --out, and --resume when its checkpoint is there
# A shard whose file exists is done and not run again, so a second call finishes what a first one left.
# On one GPU, CUDA MPS (`nvidia-cuda-mps-control -d` before, `echo quit | nvidia-cuda-mps-control` after) lets the
# shards' kernels run side by side instead of taking turns (docs/recall-training.md has the timings).
# Environment: PYTHON (default python3: torch and the kdalab package), KDALAB (default build/default/experiments/kdalab,
# else build/cuda/experiments/kdalab: the merge), OMP_NUM_THREADS (default: the cores / --jobs, at least 1: each
# shard's torch CPU threads, so that --jobs processes do not each start a pool as large as the machine).
# Exit codes: 0 every shard done and merged; 1 a shard failed (its log: DIR/<shard>.log) or the merge did; 2 bad
# usage (one line, nothing run); 3 shards remain (the deadline came first: run again).
set -uo pipefail
prog=train_recall_shards.sh
usage() { echo "$prog: error: $1" >&2; exit 2; }
grid="" dir="" jobs=8 deadline=0 extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --grid) [ $# -ge 2 ] || usage "--grid needs a value"; grid=$2; shift 2 ;;
    --out-dir) [ $# -ge 2 ] || usage "--out-dir needs a value"; dir=$2; shift 2 ;;
    --jobs) [ $# -ge 2 ] || usage "--jobs needs a value"; jobs=$2; shift 2 ;;
    --deadline) [ $# -ge 2 ] || usage "--deadline needs a value"; deadline=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) usage "'$1' is not an option; see --help" ;;
  esac
done
[ -n "$grid" ] || usage "--grid is required (zoology-reduced, kimi-reduced, zoology or kimi)"
[ -n "$dir" ] || usage "--out-dir is required"
[[ "$jobs" =~ ^[1-9][0-9]{0,3}$ ]] || usage "--jobs '$jobs'; accepted: an integer in [1, 9999]"
[[ "$deadline" =~ ^[0-9]{1,9}$ ]] || usage "--deadline '$deadline'; accepted: seconds, an integer >= 0 (0: none)"
[ -e "$dir" ] && [ ! -d "$dir" ] && usage "--out-dir '$dir' is not a folder"
if [ -n "${OMP_NUM_THREADS:-}" ] && ! [[ "$OMP_NUM_THREADS" =~ ^[1-9][0-9]{0,3}$ ]]; then
  usage "OMP_NUM_THREADS '$OMP_NUM_THREADS'; accepted: an integer in [1, 9999], or unset (the cores / --jobs)"
fi
py=${PYTHON:-python3}
k=${KDALAB:-}
if [ -z "$k" ]; then
  for c in build/default/experiments/kdalab build/cuda/experiments/kdalab; do [ -x "$c" ] && { k=$c; break; }; done
fi
[ -n "$k" ] && [ -x "$k" ] || usage "no kdalab binary for the merge (set KDALAB=path/to/kdalab)"
k=$(cd "$(dirname "$k")" && pwd)/$(basename "$k")
# the grid's size, with the options every shard gets (train_recall checks them: a bad one is its one line, exit 2)
n=$("$py" - "$grid" "${extra[@]}" <<'EOF'
import sys
try:
    from kdalab import train_recall as tr
except ImportError as e:
    sys.stderr.write(f"train_recall_shards.sh: error: the kdalab package does not import ({e}); set PYTHON\n")
    sys.exit(2)
grid, extra = sys.argv[1], sys.argv[2:]
if grid not in tr.GRIDS:
    sys.stderr.write(f"train_recall_shards.sh: error: --grid '{grid}'; accepted: {', '.join(sorted(tr.GRIDS))}\n")
    sys.exit(2)
try:
    cfg = tr.resolve(tr.parser().parse_args(["--grid", grid] + extra))
except tr.BadInput as e:
    sys.stderr.write(f"train_recall_shards.sh: error: {e}\n")
    sys.exit(2)
print(len(tr.runs_of(cfg)))
EOF
) || exit 2
mkdir -p "$dir" || usage "--out-dir '$dir' cannot be made"
cd "$dir" || exit 1
start=$(date +%s)
todo=()
for i in $(seq 1 "$n"); do
  f="$grid-shard-$i-of-$n.h5"
  [ -f "$f" ] || todo+=("$i")
done
echo "$prog: $grid: $n runs, one a shard; $((n - ${#todo[@]})) done, ${#todo[@]} to run, $jobs at a time, in $PWD"
run_one() {  # I: one shard, its output and messages in <shard>.log, its exit code in <shard>.rc
  local i=$1 f="$grid-shard-$1-of-$n.h5" resume=() extra=() t0 rc left
  mapfile -d '' extra < "$ARGS_FILE"
  [ -f "$f.ckpt" ] && resume=(--resume)
  t0=$(date +%s)
  if [ "$deadline" -gt 0 ]; then
    left=$((start + deadline - t0))
    [ "$left" -gt 5 ] || { echo "shard $i: not started (deadline)"; return 0; }
    timeout -s TERM "$left" "$py" -m kdalab.train_recall --grid "$grid" "${extra[@]}" --shard "$i/$n" --out "$f" \
      "${resume[@]}" > "$f.log" 2>&1
  else
    "$py" -m kdalab.train_recall --grid "$grid" "${extra[@]}" --shard "$i/$n" --out "$f" "${resume[@]}" > "$f.log" 2>&1
  fi
  rc=$?
  echo "$rc" > "$f.rc"
  echo "shard $i: exit $rc after $(($(date +%s) - t0)) s$([ $rc = 0 ] || echo " (see $PWD/$f.log)")"
}
# the options every shard gets, NUL-separated (an exported variable cannot hold an array)
ARGS_FILE=$(mktemp "${TMPDIR:-/tmp}/kdalab-shard-args.XXXXXX") || exit 1
trap 'rm -f "$ARGS_FILE"' EXIT
[ ${#extra[@]} -eq 0 ] || printf '%s\0' "${extra[@]}" > "$ARGS_FILE"
cores=$(nproc 2>/dev/null || echo 1)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$((cores / jobs > 0 ? cores / jobs : 1))}
export -f run_one
export grid n py deadline start ARGS_FILE
printf '%s\n' "${todo[@]}" | grep . | xargs -P "$jobs" -I{} bash -c 'run_one {}'
missing=0 failed=0
for i in $(seq 1 "$n"); do
  f="$grid-shard-$i-of-$n.h5"
  [ -f "$f" ] && continue
  missing=$((missing + 1))
  # stopped at the deadline (timeout's 124, or SIGTERM's 143) or never started: to go on; any other exit: failed
  rc=$(cat "$f.rc" 2>/dev/null || echo 143)
  case "$rc" in 0|124|143) ;; *) failed=$((failed + 1)) ;; esac
done
if [ "$failed" -gt 0 ]; then
  echo "$prog: $failed shard(s) failed (their .log files say why); $missing of $n not done" >&2
  exit 1
fi
if [ "$missing" -gt 0 ]; then
  echo "$prog: $missing of $n shards not done (the deadline came first); run again with the same options to go on"
  exit 3
fi
shards=()
for i in $(seq 1 "$n"); do shards+=("$grid-shard-$i-of-$n.h5"); done
"$k" merge "${shards[@]}" --out "$grid.h5" --force || { echo "$prog: the merge failed" >&2; exit 1; }
echo "$prog: $n of $n shards done; merged into $PWD/$grid.h5"
