#!/bin/sh
# SPDX-License-Identifier: MIT
# slurm-t.sh KNN_MPI MKDATA MPIRUN|none -- knn_mpi started by Slurm's srun (TAP).
# Starts a private single-node Slurm in a scratch directory (munged, slurmctld, slurmd
# in the foreground of this script, on ports of their own, as root; MpiDefault=pmix:
# Debian's Open MPI is built against the same PMIx as Slurm's mpi/pmix plugin), runs
# knn_mpi under srun on 1 and 3 tasks and through sbatch, and compares the result bytes
# with mpirun's and the oracle's; then stops every daemon it started. Every wait is
# bounded. Skips (1..0) where the Debian packages (slurmctld slurmd slurm-client munge)
# or mpirun are missing, or when not root (slurmd starts tasks as their user).

KNN=$1
MK=$2
MPIRUN=${3:-none}
for p in munged mungekey slurmctld slurmd srun sbatch sinfo squeue scancel; do
    command -v "$p" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin"
    command -v "$p" >/dev/null 2>&1 || { echo "1..0 # SKIP $p not found (Debian: slurmctld slurmd slurm-client munge)"; exit 0; }
done
[ "$MPIRUN" != none ] || { echo "1..0 # SKIP built without MPI"; exit 0; }
[ "$(id -u)" -eq 0 ] || { echo "1..0 # SKIP the private Slurm runs its daemons as root"; exit 0; }

. "$(dirname "$0")/tap.sh"
tap_begin slurm-t 12
TAP_DIAG=slurm_diag
LOGS=
KNN=$(cd "$(dirname "$KNN")" && pwd)/$(basename "$KNN")
PIDS=
stop_daemons() { # the daemons started here, by pid, slurmd first; bounded
    for pid in $PIDS; do kill "$pid" 2>/dev/null; done
    w=0
    while [ $w -lt 20 ]; do
        alive=
        for pid in $PIDS; do kill -0 "$pid" 2>/dev/null && alive="$alive $pid"; done
        [ -z "$alive" ] && break
        sleep 0.5; w=$((w + 1))
    done
    for pid in $alive; do kill -9 "$pid" 2>/dev/null; done
    PIDS=
}
trap 'stop_daemons; chmod -R u+rwx "$T" 2>/dev/null; rm -rf "$T"' EXIT
run() { "$@" >"$T/out" 2>"$T/err"; RC=$?; }
slurm_diag() { # $WHY, then the ends of the files in $LOGS
    [ -n "${WHY:-}" ] && echo "# $WHY"
    for f in $LOGS "$T/err"; do [ -f "$f" ] && tail -n 8 "$f" | sed "s|^|#   $(basename "$f"): |"; done
}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

# ---- data and mpirun's results --------------------------------------------------------
mk data integer 600 8 1 "$T/ref.fbin"
mk data integer 77 8 2 "$T/q.fbin"
mk oracle l2 10 "$T/ref.fbin" "$T/q.fbin" "$T/want.bin"
for np in 1 3; do
    run timeout 60 "$MPIRUN" -np $np "$KNN" -q -k 10 -o "$T/mpirun$np.bin" "$T/ref.fbin" "$T/q.fbin"
    ok $([ $RC -eq 0 ] && cmp -s "$T/mpirun$np.bin" "$T/want.bin"; echo $?) "mpirun -np $np: the oracle's bytes"
done
run timeout 60 "$MPIRUN" -np 3 "$KNN" -q -k 5 -o "$T/mpirun-self.bin" "$T/ref.fbin"
ok $([ $RC -eq 0 ] && [ -s "$T/mpirun-self.bin" ]; echo $?) "mpirun -np 3 knn_mpi REF (self-join) for the comparison below"

# ---- a private Slurm ------------------------------------------------------------------
node=$(hostname -s)
port=$((20000 + $$ % 20000))
mkdir -p "$T/state" "$T/spool"
chmod 755 "$T"     # munged wants its socket's directory searchable by all
mungekey -c -k "$T/munge.key" >"$T/munge.out" 2>&1
munged -F -f --key-file="$T/munge.key" --socket="$T/munge.sock" --pid-file="$T/munged.pid" \
    --seed-file="$T/munge.seed" --log-file="$T/munged.log" >>"$T/munge.out" 2>&1 &
PIDS="$!"
cat >"$T/slurm.conf" <<EOF
ClusterName=xknntest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
AuthInfo=socket=$T/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/slurmctld.log
SlurmdLogFile=$T/slurmd.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
ReturnToService=2
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=$node NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=xknn Nodes=$node Default=YES MaxTime=5 State=UP
EOF
export SLURM_CONF="$T/slurm.conf"
w=0
while [ ! -S "$T/munge.sock" ] && [ $w -lt 20 ]; do sleep 0.5; w=$((w + 1)); done
munge -S "$T/munge.sock" -n 2>"$T/err" | unmunge -S "$T/munge.sock" >/dev/null 2>>"$T/err"
RC=$?
WHY="munge | unmunge exit $RC"; LOGS="$T/munge.out"
ok $RC "munged: a credential made and checked on its private socket"
slurmctld -D -i -f "$T/slurm.conf" >"$T/slurmctld.out" 2>&1 &
PIDS="$! $PIDS"
slurmd -D -N "$node" -f "$T/slurm.conf" >"$T/slurmd.out" 2>&1 &
PIDS="$! $PIDS"
w=0
while [ "$(sinfo -h -n "$node" -o %t 2>/dev/null)" != idle ] && [ $w -lt 60 ]; do sleep 0.5; w=$((w + 1)); done
state=$(sinfo -h -n "$node" -o %t 2>&1)
WHY="node state after $((w / 2)) s: $state"
LOGS="$T/slurmctld.out $T/slurmd.out $T/slurmctld.log $T/slurmd.log"
ok $([ "$state" = idle ]; echo $?) "slurmctld + slurmd: node $node idle"

# ---- srun and sbatch -------------------------------------------------------------------
# (without an idle node each would only wait for its timeout: they fail at once)
if [ "$state" = idle ]; then
    for np in 1 3; do
        run timeout 60 srun -n $np "$KNN" -k 10 -o "$T/srun$np.bin" "$T/ref.fbin" "$T/q.fbin"
        WHY="srun -n $np exit $RC"; LOGS="$T/out $T/slurmd.log"
        ok $([ $RC -eq 0 ] && grep -q "ranks=$np " "$T/err" "$T/out"; echo $?) \
            "srun -n $np knn_mpi: one MPI job of $np ranks (ranks=$np)"
        ok $(cmp -s "$T/srun$np.bin" "$T/mpirun$np.bin"; echo $?) "srun -n $np: the bytes of mpirun -np $np"
    done
    run timeout 60 srun -n 3 "$KNN" -q -k 5 -o "$T/srun-self.bin" "$T/ref.fbin"
    WHY="srun -n 3 self-join exit $RC"; LOGS="$T/slurmd.log"
    ok $([ $RC -eq 0 ] && cmp -s "$T/srun-self.bin" "$T/mpirun-self.bin"; echo $?) \
        "srun -n 3 knn_mpi REF (symmetric self-join ring): the bytes of mpirun -np 3"
    cat >"$T/job.sh" <<EOF
#!/bin/sh
#SBATCH --ntasks=3
#SBATCH --cpus-per-task=1
#SBATCH --time=00:05:00
#SBATCH -o $T/job.out
export OMP_NUM_THREADS=\$SLURM_CPUS_PER_TASK
srun --mpi=pmix "$KNN" -k 10 -o "$T/sbatch.bin" "$T/ref.fbin" "$T/q.fbin"
EOF
    run timeout 90 sbatch --wait "$T/job.sh"
    WHY="sbatch --wait exit $RC"; LOGS="$T/out $T/job.out"
    ok $([ $RC -eq 0 ] && cmp -s "$T/sbatch.bin" "$T/want.bin" && grep -q "ranks=3 " "$T/job.out"; echo $?) \
        "sbatch -n 3 with srun inside: ranks=3, the oracle's bytes"
else
    WHY="no idle Slurm node"; LOGS=
    for t in 1 2 3 4 5 6; do ok 1 "srun/sbatch case $t not run: no idle node"; done
fi

# ---- stop ----------------------------------------------------------------------------
for j in $(squeue -h -o %i 2>/dev/null); do scancel "$j"; done
all=$PIDS
stop_daemons
left=
for pid in $all; do kill -0 "$pid" 2>/dev/null && left="$left $pid"; done
WHY="still running:$left"; LOGS=
ok $([ -z "$left" ]; echo $?) "munged, slurmctld and slurmd stopped"
tap_end
