#!/usr/bin/env bash
# The README's Slurm recipes, run for real. Starts a one-node Slurm cluster on this machine
# (Debian's slurm-wlm: slurmctld and slurmd, authenticated by munge; installed with apt-get when
# missing, which needs root), submits each recipe's job script from README.md as an array job
# of 4 tasks, merges the shards with the recipe's own commands, runs the same script unsharded
# (one task) in another folder, and checks that the merged files are byte-identical to the
# unsharded ones (the host's compile times of gears.csv excepted). Stops the daemons it started
# on exit.
#
# Usage, from anywhere: tests/slurm/run.sh [WORK_DIR]   (builds target/release/gearsim first)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=${1:-$(mktemp -d /tmp/gearsim-slurm.XXXXXX)}
tasks=4
mkdir -p "$work"
work=$(cd "$work" && pwd)
say() { printf 'slurm test: %s\n' "$*"; }

(cd "$root" && cargo build -q --release -p gearsim-host --bin gearsim)
export PATH="$root/target/release:$PATH"

# --- Slurm and munge -----------------------------------------------------------------------
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
    if [ "$(id -u)" != 0 ]; then
        echo "slurm test: slurm-wlm is not installed and installing it needs root" >&2
        exit 1
    fi
    say "installing slurm-wlm and munge from Debian's packages"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >"$work/apt.log" 2>&1 ||
        { tail -20 "$work/apt.log" >&2; exit 1; }
fi
if ! munge -n >/dev/null 2>&1; then
    [ -s /etc/munge/munge.key ] || { echo "slurm test: /etc/munge/munge.key is missing" >&2; exit 1; }
    mkdir -p /run/munge && chown munge:munge /run/munge
    runuser -u munge -- /usr/sbin/munged
    sleep 1
    munge -n >/dev/null || { echo "slurm test: munged does not answer" >&2; exit 1; }
fi

node=$(hostname -s)
cpus=$(nproc)
conf="$work/slurm"
rm -rf "$conf" && mkdir -p "$conf/ctld" "$conf/d"
cat >"$conf/slurm.conf" <<CONF
ClusterName=gearsim-test
SlurmctldHost=$node(127.0.0.1)
SlurmUser=$(id -un)
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
SlurmctldPort=16817
SlurmdPort=16818
StateSaveLocation=$conf/ctld
SlurmdSpoolDir=$conf/d
SlurmctldPidFile=$conf/slurmctld.pid
SlurmdPidFile=$conf/slurmd.pid
SlurmctldLogFile=$conf/slurmctld.log
SlurmdLogFile=$conf/slurmd.log
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF="$conf/slurm.conf"
# The daemons run in the foreground of background jobs, so this script knows their pids.
slurmctld -D -c >"$conf/slurmctld.out" 2>&1 &
ctld=$!
slurmd -D >"$conf/slurmd.out" 2>&1 &
slurmd=$!
stop() {
    scancel --quiet --user "$(id -un)" 2>/dev/null || true
    kill "$slurmd" "$ctld" 2>/dev/null || true
    wait "$slurmd" "$ctld" 2>/dev/null || true
}
trap stop EXIT
for _ in $(seq 60); do
    [ "$(sinfo -h -o %t 2>/dev/null)" = idle ] && break
    sleep 1
done
[ "$(sinfo -h -o %t)" = idle ] || { echo "slurm test: the node is not idle:" >&2; sinfo >&2; tail "$conf"/*.log >&2; exit 1; }
say "one-node cluster up ($node, $cpus CPUs)"

# --- the recipes ---------------------------------------------------------------------------
# A recipe is a README ```sh block with the comment `# recipe: NAME job` (the job script) or
# `# recipe: NAME merge` (the commands run once the array has finished).
block() {
    python3 - "$root/README.md" "$1" <<'PY'
import sys
text, tag = open(sys.argv[1]).read().split("\n"), "# recipe: " + sys.argv[2]
blocks, cur = [], None
for line in text:
    if cur is None and line.startswith("```sh"):
        cur = []
    elif cur is not None and line.startswith("```"):
        blocks.append(cur)
        cur = None
    elif cur is not None:
        cur.append(line)
found = [b for b in blocks if any(l.strip().startswith(tag) for l in b)]
if len(found) != 1:
    sys.exit(f"README.md: expected one ```sh block with `{tag}`, found {len(found)}")
print("\n".join(found[0]))
PY
}

# A folder that looks like the checkout (the recipes name tests/ and docs/ files).
checkout() {
    mkdir -p "$1"
    ln -sfn "$root/tests" "$1/tests"
    ln -sfn "$root/docs" "$1/docs"
}

# Byte-identical, but for the columns that time the host (gears.csv's compile_ms): those
# are compared for presence only.
same() {
    python3 - "$1" "$2" <<'PY'
import sys
host_columns = {"compile_ms"}
a, b = (open(p).read() for p in sys.argv[1:3])
if not sys.argv[1].endswith(".csv"):
    sys.exit(a != b)
def masked(text):
    lines = text.split("\n")
    head = lines[0].split(",")
    drop = {i for i, h in enumerate(head) if h in host_columns}
    return [",".join("*" if i in drop else f for i, f in enumerate(l.split(","))) for l in lines]
sys.exit(masked(a) != masked(b))
PY
}

failed=0
for recipe in gears advise calibrate; do
    job=$(block "$recipe job")
    merge=$(block "$recipe merge")
    sharded="$work/$recipe/sharded" whole="$work/$recipe/whole"
    rm -rf "$work/$recipe"
    checkout "$sharded"
    checkout "$whole"
    printf '%s\n' "$job" >"$work/$recipe/job.sbatch"
    started=$(date +%s)
    (cd "$sharded" && sbatch --wait --quiet --array=0-$((tasks - 1)) --cpus-per-task=1 \
        --output="$sharded/slurm-%A_%a.out" "$work/$recipe/job.sbatch") || {
        echo "slurm test: the $recipe array failed:" >&2
        tail -n 20 "$sharded"/slurm-*.out >&2
        exit 1
    }
    (cd "$sharded" && bash -euo pipefail -c "$merge" >"$sharded/merge.out" 2>&1) ||
        { cat "$sharded/merge.out" >&2; exit 1; }
    sharded_s=$(($(date +%s) - started))
    started=$(date +%s)
    (cd "$whole" && SLURM_ARRAY_TASK_ID=0 SLURM_ARRAY_TASK_COUNT=1 \
        bash -euo pipefail "$work/$recipe/job.sbatch" >"$whole/job.out" 2>&1 &&
        bash -euo pipefail -c "$merge" >"$whole/merge.out" 2>&1) ||
        { cat "$whole/job.out" "$whole/merge.out" >&2 2>/dev/null; exit 1; }
    whole_s=$(($(date +%s) - started))
    # Every file the merge wrote next to the job folders (not under out/) is compared.
    compared=0
    for f in $(cd "$whole" && find . -maxdepth 2 -type f \( -name '*.csv' -o -name '*.svg' \) -not -path './out/*' | sort); do
        compared=$((compared + 1))
        if same "$sharded/$f" "$whole/$f"; then
            say "$recipe: $f identical ($(wc -l <"$whole/$f") lines)"
        else
            say "$recipe: $f DIFFERS"
            diff "$whole/$f" "$sharded/$f" | head -20 || true
            failed=1
        fi
    done
    [ "$compared" -gt 0 ] || { say "$recipe: the merge wrote no file to compare"; failed=1; }
    say "$recipe: $tasks array tasks + merge in ${sharded_s} s, unsharded in ${whole_s} s"
done
[ "$failed" = 0 ] && say "every merged file equals the unsharded run's"
exit "$failed"
