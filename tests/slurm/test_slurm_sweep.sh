#!/usr/bin/env bash
# The Slurm recipe on a real Slurm (ctest label slurm): starts munged, slurmctld and slurmd for this one machine from a
# generated slurm.conf in a temp folder, submits scripts/slurm/submit.sh's 4-shard array of `parity --quick` and its
# afterok merge job, waits for them (timeout), and checks the merged file against the unsharded run (same_results.py:
# every dataset bit for bit, timing columns aside). The daemons are stopped and the folder removed on every exit.
# Needs root (slurmd starts jobs as their user) and Debian's slurmctld, slurmd, slurm-client and munge (scripts/setup.sh).
# Env: KDALAB_BIN (the kdalab binary; ctest sets it), SLURM_TEST_TIMEOUT (seconds for the jobs, default 600).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
kdalab=${KDALAB_BIN:-$root/build/default/experiments/kdalab}
timeout_s=${SLURM_TEST_TIMEOUT:-600}
log() { echo "slurm test: $*"; }
fail() { echo "slurm test: FAILED: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || fail "needs root (slurmd runs each job as its submitting user); run as root or exclude: ctest -LE slurm"
for c in munged slurmctld slurmd sbatch scontrol sinfo; do
  command -v "$c" >/dev/null || fail "'$c' not found; scripts/setup.sh installs Debian's slurmctld slurmd slurm-client munge"
done
[ -x "$kdalab" ] || fail "kdalab binary '$kdalab' not found (set KDALAB_BIN)"
/usr/bin/python3 -c 'import h5py' 2>/dev/null || fail "python3-h5py missing (scripts/setup.sh installs it)"

T=$(mktemp -d /tmp/kdalab-slurm.XXXXXX)
chmod 0755 "$T"
pids=()
jobs=()
cleanup() {
  local rc=$?
  if [ $rc -ne 0 ]; then
    for f in "$T"/slurmctld.log "$T"/slurmd.log "$T"/munged.log "$T"/out/*.out; do
      [ -f "$f" ] && { echo "---- $f (last 25 lines)"; tail -n 25 "$f"; }
    done
  fi
  # this test's jobs first (on a failure they may still run), then the daemons, by the pids this script started
  [ ${#jobs[@]} -gt 0 ] && scancel --full "${jobs[@]}" 2>/dev/null && sleep 1
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done
  rm -rf "$T"
  log "daemons stopped, $T removed (exit $rc)"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- munge: a private key and socket ----
mkdir -p "$T/munge" "$T/state" "$T/spool" "$T/out"
chmod 0700 "$T/munge"
dd if=/dev/urandom of="$T/munge/munge.key" bs=1024 count=1 status=none
chmod 0400 "$T/munge/munge.key"
sock="$T/munge/munge.socket"
munged -F --force --socket="$sock" --key-file="$T/munge/munge.key" --pid-file="$T/munge/munged.pid" \
  --log-file="$T/munged.log" --seed-file="$T/munge/seed" >/dev/null 2>&1 &
pids+=($!)
for _ in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || fail "munged did not create its socket"
log "munged running (pid ${pids[0]})"

# ---- slurm.conf for this machine: its name, CPUs and memory; two free ports ----
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
host=$(hostname -s)
cpus=$(nproc)
mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 2 ))
cat > "$T/slurm.conf" <<CONF
ClusterName=kdalabtest
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sock
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/slurmctld.log
SlurmdLogFile=$T/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$T/jobcomp.txt
MpiDefault=none
ReturnToService=2
MinJobAge=600
SlurmdTimeout=60
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF="$T/slurm.conf"
slurmctld -D -i -f "$SLURM_CONF" >"$T/slurmctld.stdout" 2>&1 &
pids+=($!)
slurmd -D -N "$host" -f "$SLURM_CONF" >"$T/slurmd.stdout" 2>&1 &
pids+=($!)
state=""
for _ in $(seq 60); do
  state=$(sinfo -h -n "$host" -o %T 2>/dev/null || true)
  [ "$state" = idle ] && break
  sleep 0.5
done
[ "$state" = idle ] || fail "node $host did not become idle (state '$state')"
log "slurmctld (pid ${pids[1]}) and slurmd (pid ${pids[2]}) running; node $host idle with $cpus CPUs"

# ---- the recipe: 4 shards of parity --quick, then the merge ----
# The quick grid (12 points in 4 shards) at d_k = d_v = 16: the same sharding, merge and rows in a tenth of the time.
small=(--dk 16 --dv 16)
cd "$T/out"
out=$(KDALAB="$kdalab" "$root/scripts/slurm/submit.sh" 4 "$T/out" parity --quick "${small[@]}")
log "$out"
array=$(sed -n 's/.*array \([0-9]*\).*/\1/p' <<<"$out")
merge=$(sed -n 's/.* merge \([0-9]*\).*/\1/p' <<<"$out")
[ -n "$array" ] && [ -n "$merge" ] || fail "no job ids in '$out'"
jobs=("$array" "$merge")
job_state() { scontrol -o show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n 's/^JobState=//p' | sort | uniq -c | tr -s ' ' | paste -sd, -; }
waited=0
while :; do
  ms=$(scontrol -o show job "$merge" 2>/dev/null | tr ' ' '\n' | sed -n 's/^JobState=//p')
  case "$ms" in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY) break ;; esac
  [ $waited -lt "$timeout_s" ] || fail "jobs not done after ${timeout_s}s (array: $(job_state "$array"); merge: $ms)"
  sleep 2
  waited=$((waited + 2))
done
log "after ${waited}s: array $array tasks: $(job_state "$array"); merge $merge: $ms"
if [ -f "$T/jobcomp.txt" ]; then  # the controller's record of every finished job
  while read -r line; do
    log "jobcomp: $(grep -oE '(^| )(JobId|Name|ArrayJobId|ArrayTaskId|JobState|StartTime|EndTime|ExitCode)=[^ ]*' <<<"$line" | tr -d ' ' | paste -sd' ' -)"
  done < "$T/jobcomp.txt"
fi
[ "$ms" = COMPLETED ] || fail "merge job $merge ended $ms"
cat "$T/out"/kdalab-merge-*.out
ls "$T/out"/parity-shard-*-of-4.h5 >/dev/null || fail "no shard files"

# ---- the unsharded run, and the comparison ----
"$kdalab" parity --quick "${small[@]}" --quiet --out "$T/out/unsharded.h5" >/dev/null
/usr/bin/python3 "$here/same_results.py" "$T/out/parity.h5" "$T/out/unsharded.h5" || fail "merged file differs from the unsharded run"
log "PASSED: the merged 4-shard parity --quick equals the unsharded run (timing columns aside)"
