#!/usr/bin/env bash
# Single-node SLURM for CI on a fresh Debian 12 machine where we are root.
#
# Installs slurm-wlm and munge, writes /etc/slurm/slurm.conf for this host, starts munged, slurmctld and
# slurmd directly (no systemd needed) and waits until the node is idle. Running it again while the cluster
# is up does nothing.
#
# Job accounting without slurmdbd: finished jobs stay visible to `scontrol show job -o ID` and
# `squeue -t all` for MinJobAge seconds, and every finished job is appended as one line to the
# jobcomp/filetxt log (JOBCOMP_LOG below), which keeps State, ExitCode and requested memory for good.
#
# Environment overrides:
#   SLURM_CI_CPUS          CPUs to declare for the node (default: nproc; more than nproc oversubscribes)
#   SLURM_CI_MEM_MARGIN_MB memory left out of RealMemory (default: 512)
#   SLURM_CI_OVERSUBSCRIBE jobs that may share one CPU in the "oversub" partition (default: 128)
#   SLURM_CI_TIMEOUT       seconds to wait for the node to become idle (default: 60)
set -euo pipefail

CONF_DIR=/etc/slurm
CONF=$CONF_DIR/slurm.conf
SPOOL_CTLD=/var/spool/slurmctld
SPOOL_D=/var/spool/slurmd
LOG_DIR=/var/log/slurm
JOBCOMP_LOG=$LOG_DIR/jobcomp.log
RUN_DIR=/run/slurm
MUNGE_KEY=/etc/munge/munge.key
MUNGE_RUN=/run/munge
TIMEOUT=${SLURM_CI_TIMEOUT:-60}

log() { echo "[slurm_setup] $*"; }

if [ "$(id -u)" -ne 0 ]; then
    log "must run as root"
    exit 1
fi

NODE=$(hostname -s)

diagnostics() {
    log "---- diagnostics ----"
    for p in munged slurmctld slurmd; do
        if pgrep -x "$p" >/dev/null 2>&1; then log "$p: running (pid $(pgrep -x "$p" | tr '\n' ' '))"
        else log "$p: NOT running"; fi
    done
    log "munge self-test:"; (munge -n | unmunge) 2>&1 | head -5 || true
    log "sinfo:"; sinfo -N -l 2>&1 || true
    log "scontrol show node:"; scontrol show node "$NODE" 2>&1 || true
    for f in "$LOG_DIR/slurmctld.log" "$LOG_DIR/slurmd.log" /var/log/munge/munged.log; do
        if [ -f "$f" ]; then log "tail of $f:"; tail -n 30 "$f"; fi
    done
    log "slurm.conf:"; cat "$CONF" 2>/dev/null || true
}

node_state() {
    sinfo -h -N -n "$NODE" -o '%T' 2>/dev/null | head -n 1
}

is_up() {
    command -v sinfo >/dev/null 2>&1 || return 1
    pgrep -x munged >/dev/null 2>&1 || return 1
    pgrep -x slurmctld >/dev/null 2>&1 || return 1
    pgrep -x slurmd >/dev/null 2>&1 || return 1
    case "$(node_state)" in
        idle|mixed|allocated|completing) return 0 ;;
        *) return 1 ;;
    esac
}

# ---- slurm.conf ------------------------------------------------------------------------------------
CPUS=${SLURM_CI_CPUS:-$(nproc)}
MEM_TOTAL_MB=$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)
MEM_MARGIN_MB=${SLURM_CI_MEM_MARGIN_MB:-512}
REAL_MEM_MB=$((MEM_TOTAL_MB - MEM_MARGIN_MB))
if [ "$REAL_MEM_MB" -lt 256 ]; then REAL_MEM_MB=$((MEM_TOTAL_MB * 3 / 4)); fi
# Jobs that do not pass --mem get an equal share per CPU, so that several of them can run at once.
DEF_MEM_PER_CPU=$((REAL_MEM_MB / CPUS))
# Jobs per CPU in the "oversub" partition (SLURM_CI_OVERSUBSCRIBE overrides).
OVERSUB=${SLURM_CI_OVERSUBSCRIBE:-128}

new_conf=$(mktemp)
cat >"$new_conf" <<EOF
# Written by .ci/slurm_setup.sh: a single-node cluster for CI.
ClusterName=ci
SlurmctldHost=$NODE
AuthType=auth/munge
CryptoType=crypto/munge
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$SPOOL_CTLD
SlurmdSpoolDir=$SPOOL_D
SlurmctldPidFile=$RUN_DIR/slurmctld.pid
SlurmdPidFile=$RUN_DIR/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
SchedulerType=sched/backfill
# Start queued jobs as soon as resources free up (the default defers batch scheduling by 3 s).
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,default_queue_depth=1000
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$DEF_MEM_PER_CPU
JobAcctGatherType=jobacct_gather/linux
# Memory is polled every 2 s and a job above its --mem is killed (state OUT_OF_MEMORY); there are no
# cgroups to enforce it otherwise.
JobAcctGatherFrequency=task=2
JobAcctGatherParams=OverMemoryKill
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$JOBCOMP_LOG
ReturnToService=2
SlurmdParameters=config_overrides
MinJobAge=600
InactiveLimit=0
KillWait=5
OverTimeLimit=0
MessageTimeout=10
SlurmdTimeout=60
SlurmctldTimeout=60
Waittime=0
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$REAL_MEM_MB State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
# The same node, shared: up to OVERSUB jobs per CPU, for tests that start many small workers at once
# (they pass a small --mem: memory is still allocated and enforced per job).
PartitionName=oversub Nodes=$NODE Default=NO MaxTime=INFINITE State=UP OverSubscribe=FORCE:$OVERSUB
EOF

if is_up && [ -f "$CONF" ] && cmp -s "$new_conf" "$CONF"; then
    rm -f "$new_conf"
    log "already up: node $NODE is $(node_state)"
    exit 0
fi

# ---- packages --------------------------------------------------------------------------------------
if ! command -v slurmctld >/dev/null 2>&1 || ! command -v slurmd >/dev/null 2>&1 \
        || ! command -v munged >/dev/null 2>&1 || ! command -v sinfo >/dev/null 2>&1; then
    log "installing slurm-wlm and munge"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null; then
        apt-get update -q >/dev/null
        apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null
    fi
fi

# ---- munge -----------------------------------------------------------------------------------------
mkdir -p /etc/munge "$MUNGE_RUN" /var/lib/munge /var/log/munge
if [ ! -s "$MUNGE_KEY" ]; then
    log "generating munge key"
    if command -v mungekey >/dev/null 2>&1; then
        mungekey --create --keyfile="$MUNGE_KEY" --force
    else
        dd if=/dev/urandom of="$MUNGE_KEY" bs=1 count=1024 status=none
    fi
fi
chown munge:munge /etc/munge "$MUNGE_KEY" "$MUNGE_RUN" /var/lib/munge /var/log/munge
chmod 0700 /etc/munge
chmod 0400 "$MUNGE_KEY"
chmod 0755 "$MUNGE_RUN"
if ! pgrep -x munged >/dev/null 2>&1; then
    log "starting munged"
    rm -f "$MUNGE_RUN/munge.socket.2.lock"
    runuser -u munge -- /usr/sbin/munged
fi
for _ in $(seq 1 50); do
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then break; fi
    sleep 0.2
done
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    log "munge does not work"
    diagnostics
    exit 1
fi

mkdir -p "$CONF_DIR" "$SPOOL_CTLD" "$SPOOL_D" "$LOG_DIR" "$RUN_DIR"
touch "$JOBCOMP_LOG"
if [ -f "$CONF" ] && cmp -s "$new_conf" "$CONF"; then
    rm -f "$new_conf"
else
    log "writing $CONF (NodeName=$NODE CPUs=$CPUS RealMemory=$REAL_MEM_MB)"
    install -m 0644 "$new_conf" "$CONF"
    rm -f "$new_conf"
    # A daemon started with an older file must re-read it.
    if pgrep -x slurmctld >/dev/null 2>&1; then scontrol reconfigure >/dev/null 2>&1 || true; fi
fi

# ---- daemons ---------------------------------------------------------------------------------------
if ! pgrep -x slurmctld >/dev/null 2>&1; then
    log "starting slurmctld"
    /usr/sbin/slurmctld
fi
if ! pgrep -x slurmd >/dev/null 2>&1; then
    log "starting slurmd"
    /usr/sbin/slurmd
fi

# ---- wait for the node -----------------------------------------------------------------------------
deadline=$((SECONDS + TIMEOUT))
state=""
while [ "$SECONDS" -lt "$deadline" ]; do
    state=$(node_state || true)
    case "$state" in
        idle|mixed|allocated|completing)
            log "up: node $NODE is $state (CPUs=$CPUS RealMemory=${REAL_MEM_MB}M)"
            exit 0 ;;
        down*|drain*|drained*)
            # A node remembered as down from an earlier run comes back once slurmd has registered.
            scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 || true ;;
    esac
    sleep 1
done
log "node $NODE did not become idle within ${TIMEOUT}s (last state: '${state}')"
diagnostics
exit 1
