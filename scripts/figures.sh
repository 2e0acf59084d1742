#!/usr/bin/env bash
# Draws every figure the given results files support into figures/ (FIGURES=dir to change).
# Usage: scripts/figures.sh RESULTS.h5...
# Each scripts/fig_<name>.py reads one file and exits 0 (drawn), 3 (this file does not hold what the
# figure needs: skipped quietly) or anything else (an error: reported, the other figures still drawn).
# When a second results file of the same run draws a figure already drawn (e.g. results/parity.h5 and
# results/parity_long.h5 both draw parity_error), the later one is saved as <figure>-<results file stem>
# instead of replacing the first.
# Runs under /usr/bin/python3 (Debian's h5py and matplotlib), never whatever python3 is first on PATH.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out=${FIGURES:-figures}
py=${KDALAB_PYTHON:-/usr/bin/python3}
if [ $# -eq 0 ]; then
  echo "usage: scripts/figures.sh RESULTS.h5..." >&2
  exit 2
fi
mkdir -p "$out"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kdalab-figures.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
drawn=0
failed=0
seen=" "  # figure file names written by this run
# Every (results file, script) pair runs first, $(nproc) at a time (each is a Python start-up and a drawing), into
# its own folder; then the outcomes are taken in order, file by file and script by script, as if run one by one.
jobs=${FIGURE_JOBS:-$(nproc 2>/dev/null || echo 2)}
# Every (file, script) pair is one run of `fig_<name>.py FILE --out-dir $tmp/<i>`, its output in $tmp/<i>.msg and its
# exit code in $tmp/<i>.rc; figures_fork.py starts them, $jobs at once, each a fork of one python that imported
# matplotlib once (most runs skip their file: a fork instead of a python start).
i=0
for f in "$@"; do
  [ -f "$f" ] || continue
  for s in "$here"/fig_*.py; do
    i=$((i + 1))
    mkdir "$tmp/$i"
    printf '%s\t%s\t%s\n' "$i" "$s" "$f"
  done
done > "$tmp/jobs"
"$py" "$here/figures_fork.py" "$jobs" "$tmp" < "$tmp/jobs"
i=0
for f in "$@"; do
  if [ ! -f "$f" ]; then
    echo "figures.sh: $f: no such file" >&2
    failed=$((failed + 1))
    continue
  fi
  stem=$(basename "$f" .h5)
  nscripts=0; fails=(); rcs=(); msgs=()
  for s in "$here"/fig_*.py; do
    i=$((i + 1))
    nscripts=$((nscripts + 1))
    rc=$(cat "$tmp/$i.rc" 2>/dev/null || echo "unknown: figures_fork.py did not run it")
    case $rc in
      0)
        written=""
        for p in "$tmp/$i"/*; do
          [ -e "$p" ] || continue
          name=$(basename "$p")
          case "$seen" in *" $name "*) name="${name%.*}-$stem.${name##*.}" ;; esac
          seen="$seen$name "
          mv -f "$p" "$out/$name"
          written="$written $out/$name"
        done
        echo "wrote$written"
        drawn=$((drawn + 1)) ;;
      3) ;;
      *) fails+=("$(basename "$s")"); rcs+=("$rc"); msgs+=("$i") ;;
    esac
  done
  # a file every script refuses with the same message (not HDF5, unreadable, ...) is reported once, not per script
  one=""
  if [ ${#fails[@]} -eq "$nscripts" ] && [ "$nscripts" -gt 1 ]; then
    one=$(for m in "${msgs[@]}"; do sed -E 's/^fig_[a-z_]+\.py: //' "$tmp/$m.msg"; done | sort -u)
    [ "$(printf '%s\n' "$one" | wc -l)" -eq 1 ] || one=""
  fi
  if [ -n "$one" ]; then
    echo "figures.sh: every figure failed on $f: $one" >&2
    failed=$((failed + 1))
  else
    for k in "${!fails[@]}"; do
      echo "figures.sh: ${fails[$k]} failed on $f (exit ${rcs[$k]}):" >&2
      cat "$tmp/${msgs[$k]}.msg" >&2
      failed=$((failed + 1))
    done
  fi
done
echo "figures.sh: $drawn figure(s) drawn into $out/, $failed failure(s)"
[ "$failed" -eq 0 ]
