#!/usr/bin/env bash
# Single-node Grid Engine (Debian's gridengine 8.1.9, Son of Grid Engine) for CI on a fresh
# Debian 12 machine where we are root.
#
# Installs gridengine-master, -exec and -client non-interactively (debconf preseeding), makes
# the host's name and the name its address resolves back to one host for Grid Engine
# (host_aliases: a host whose name maps to 127.0.0.1, listed after "localhost", is otherwise
# refused by qmaster), starts sge_qmaster and sge_execd directly (no systemd needed), lets
# root submit (min_uid/min_gid 0), schedules every second, and creates the queue all.q on
# this host with SGE_CI_SLOTS slots. Finished jobs go to the accounting file, which qacct
# reads. Running it again while the cluster is up does nothing. SLURM (.ci/slurm_setup.sh)
# may run on the same machine: the two share nothing (Grid Engine uses ports 6444/6445).
#
# Environment overrides:
#   SGE_CI_SLOTS    job slots of the queue (default: 8 per CPU)
#   SGE_CI_TIMEOUT  seconds to wait for the daemons and the queue (default: 60)
set -euo pipefail

export SGE_ROOT=${SGE_ROOT:-/var/lib/gridengine}
export SGE_CELL=${SGE_CELL:-default}
TIMEOUT=${SGE_CI_TIMEOUT:-60}
SLOTS=${SGE_CI_SLOTS:-$(( $(nproc) * 8 ))}
COMMON=$SGE_ROOT/$SGE_CELL/common
NODE=$(hostname)

log() { echo "[sge_setup] $*"; }

if [ "$(id -u)" -ne 0 ]; then
    log "must run as root"
    exit 1
fi

diagnostics() {
    log "---- diagnostics ----"
    for p in sge_qmaster sge_execd; do
        if pgrep -x "$p" >/dev/null 2>&1; then log "$p: running"; else log "$p: NOT running"; fi
    done
    log "qstat -f:"; timeout 20 qstat -f 2>&1 || true
    for f in /var/spool/gridengine/qmaster/messages /var/spool/gridengine/execd/*/messages; do
        if [ -f "$f" ]; then log "tail of $f:"; tail -n 20 "$f"; fi
    done
}

queue_up() {
    command -v qstat >/dev/null 2>&1 || return 1
    local line
    line=$(timeout 20 qstat -f -q "all.q" 2>/dev/null | grep "^all.q@" | head -n 1) || return 1
    [ -n "$line" ] || return 1
    # a sixth column holds the queue instance's states (a: alarm, u: unknown, E: error, d: disabled)
    [ "$(echo "$line" | awk '{print $6}')" = "" ]
}

configured() {
    timeout 20 qconf -sq all.q 2>/dev/null | grep -Eq '^load_thresholds +NONE$' \
        && timeout 20 qconf -sconf global 2>/dev/null | grep -q 'accounting_flush_time=00:00:00'
}

if pgrep -x sge_qmaster >/dev/null 2>&1 && pgrep -x sge_execd >/dev/null 2>&1 && queue_up \
        && configured; then
    log "already up: $(timeout 20 qstat -f | grep '^all.q@')"
    exit 0
fi

# ---- packages --------------------------------------------------------------------------------------
if ! command -v qconf >/dev/null 2>&1 || [ ! -x /usr/lib/gridengine/sge_qmaster ] \
        || [ ! -x /usr/lib/gridengine/sge_execd ]; then
    log "installing gridengine-master, gridengine-exec and gridengine-client"
    export DEBIAN_FRONTEND=noninteractive
    debconf-set-selections <<PRESEED
gridengine-common shared/gridenginecell string $SGE_CELL
gridengine-common shared/gridengineconfig boolean true
gridengine-common shared/gridenginesgeroot string $SGE_ROOT
gridengine-client shared/gridenginemaster string $NODE
gridengine-master shared/gridenginemaster string $NODE
gridengine-exec shared/gridenginemaster string $NODE
PRESEED
    packages="gridengine-master gridengine-exec gridengine-client"
    # shellcheck disable=SC2086
    if ! apt-get install -y -q --no-install-recommends $packages >/dev/null; then
        apt-get update -q >/dev/null
        apt-get install -y -q --no-install-recommends $packages >/dev/null
    fi
fi

# ---- host names ------------------------------------------------------------------------------------
address=$(getent hosts "$NODE" | awk '{print $1; exit}')
back=$(getent hosts "$address" | awk '{print $2; exit}')
if [ -n "$back" ] && [ "$back" != "$NODE" ]; then
    # e.g. 127.0.0.1 -> localhost: one host for Grid Engine, known as $NODE
    if ! grep -qx "$NODE $back" "$COMMON/host_aliases" 2>/dev/null; then
        log "host_aliases: $NODE $back"
        echo "$NODE $back" >"$COMMON/host_aliases"
        pids=$(pgrep -x sge_qmaster || true)
        # a qmaster started before the alias must read it again
        for pid in $pids; do kill "$pid" || true; done
        for _ in $(seq 1 50); do pgrep -x sge_qmaster >/dev/null 2>&1 || break; sleep 0.2; done
    fi
fi
echo "$NODE" >"$COMMON/act_qmaster"

# ---- qmaster ---------------------------------------------------------------------------------------
if ! pgrep -x sge_qmaster >/dev/null 2>&1; then
    log "starting sge_qmaster"
    /etc/init.d/gridengine-master start >/dev/null 2>&1 || /usr/lib/gridengine/sge_qmaster
fi
deadline=$((SECONDS + TIMEOUT))
until timeout 10 qconf -sh >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then log "qmaster does not answer"; diagnostics; exit 1; fi
    sleep 1
done

edit() {  # edit <qconf option> [object]: qconf's editor applies the sed expression in $SED
    local editor
    editor=$(mktemp)
    printf '#!/bin/sh\nsed -i "%s" "$1"\n' "$SED" >"$editor"
    chmod +x "$editor"
    EDITOR=$editor timeout 20 qconf "$@" >/dev/null
    rm -f "$editor"
}

# root may submit (CI runs as root); finished jobs reach the accounting file (qacct) at once,
# not after the default 15 s flush. Idempotent: every accounting_flush_time is dropped before
# the one is added after flush_time (matching "flush_time=" inside "accounting_flush_time="
# doubled the setting at each run, until qmaster refused the 8 MB configuration)
SED='s/^min_uid .*/min_uid 0/; s/^min_gid .*/min_gid 0/; s/[ \t]*accounting_flush_time=[0-9:]*//g; s/\([ \t]\)flush_time=[0-9:]*/\1flush_time=00:00:01 accounting_flush_time=00:00:00/' edit -mconf global
# schedule every second, not every 15 s
SED='s/^schedule_interval .*/schedule_interval 0:0:1/; s/^flush_submit_sec .*/flush_submit_sec 1/; s/^flush_finish_sec .*/flush_finish_sec 1/' edit -msconf

# ---- hosts and execd -------------------------------------------------------------------------------
timeout 20 qconf -ah "$NODE" >/dev/null 2>&1 || true
timeout 20 qconf -as "$NODE" >/dev/null 2>&1 || true
if ! timeout 20 qconf -sel 2>/dev/null | grep -qx "$NODE"; then
    host_file=$(mktemp)
    printf 'hostname %s\nload_scaling NONE\ncomplex_values NONE\nuser_lists NONE\nxuser_lists NONE\nprojects NONE\nxprojects NONE\nusage_scaling NONE\nreport_variables NONE\n' "$NODE" >"$host_file"
    timeout 20 qconf -Ae "$host_file" >/dev/null
    rm -f "$host_file"
fi
if ! pgrep -x sge_execd >/dev/null 2>&1; then
    log "starting sge_execd"
    /etc/init.d/gridengine-exec start >/dev/null 2>&1 || /usr/lib/gridengine/sge_execd
fi

# ---- the queue -------------------------------------------------------------------------------------
if ! timeout 20 qconf -sql 2>/dev/null | grep -qx "all.q"; then
    log "creating queue all.q ($SLOTS slots on $NODE)"
    SED="s/^hostlist .*/hostlist $NODE/; s/^slots .*/slots $SLOTS/; s/^pe_list .*/pe_list NONE/; s|^shell .*|shell /bin/sh|; s/^shell_start_mode .*/shell_start_mode unix_behavior/; s/^load_thresholds .*/load_thresholds NONE/" \
        edit -aq all.q
else
    timeout 20 qconf -mattr queue slots "$SLOTS" all.q >/dev/null 2>&1 || true
fi
# a loaded CI machine must not put the queue in alarm (np_load_avg=1.75 by default)
SED='s/^load_thresholds .*/load_thresholds NONE/' edit -mq all.q
timeout 20 qmod -c "all.q@$NODE" >/dev/null 2>&1 || true
timeout 20 qmod -e "all.q@$NODE" >/dev/null 2>&1 || true

deadline=$((SECONDS + TIMEOUT))
until queue_up; do
    if [ "$SECONDS" -ge "$deadline" ]; then
        log "queue all.q@$NODE did not come up within ${TIMEOUT}s"
        diagnostics
        exit 1
    fi
    sleep 1
done
log "up: $(timeout 20 qstat -f | grep '^all.q@')"
