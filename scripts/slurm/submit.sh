#!/usr/bin/env bash
# Submits a sharded kdalab sweep to Slurm: a job array of N shards, then a merge job that runs after all
# of them succeed (afterok). Prints the two job ids. docs/cluster.md explains the steps.
# Usage: scripts/slurm/submit.sh N OUTDIR SUBCOMMAND [OPTIONS...]     e.g. submit.sh 8 results/p parity --quick
# Extra sbatch options (partition, time, account): SBATCH_ARGS="-p cpu -t 2:00:00" submit.sh ...
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 N OUTDIR SUBCOMMAND [OPTIONS...]" >&2; exit 2; }
n=$1 dir=$2 sub=$3
shift 3
[[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "submit.sh: N '$n' is not accepted; give a whole number >= 1" >&2; exit 2; }
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
read -r -a extra <<< "${SBATCH_ARGS:-}"
array=$(sbatch --parsable "${extra[@]}" --array="1-$n" --export="ALL,KDALAB_SHARDS=$n" \
  --output="$dir/%x-%A_%a.out" "$here/sweep.sbatch" "$dir" "$sub" "$@")
array=${array%%;*}
merge=$(sbatch --parsable "${extra[@]}" --dependency="afterok:$array" --kill-on-invalid-dep=yes \
  --job-name=kdalab-merge --export="ALL,KDALAB_SHARDS=$n" --output="$dir/%x-%j.out" "$here/sweep.sbatch" "$dir" "$sub")
merge=${merge%%;*}
echo "submitted array $array ($n shards of $sub) and merge $merge -> $dir/$sub.h5"
