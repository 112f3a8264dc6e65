#!/usr/bin/env bash
# Stop the CI Slurm started by scripts/ci/slurm-up.sh: every slurmd (one per node), slurmctld, munged, each by the PID in
# its pid file (SIGTERM, wait up to 30 s on that PID, then SIGKILL). Idempotent; never kills by name.
# LONGHAUL_SLURM_WIPE=1 also wipes the controller state (job ids restart at 1 on the next start).
set -euo pipefail

log() { printf 'slurm-down: %s\n' "$*" >&2; }

alive() {  # alive PIDFILE COMM: a live, non-zombie process with the expected name
  local pid state
  [ -s "$1" ] || return 1
  pid="$(tr -dc 0-9 <"$1")"; [ -n "$pid" ] && [ -r "/proc/$pid/comm" ] || return 1
  [ "$(cat "/proc/$pid/comm")" = "$2" ] || return 1
  state="$(awk '/^State:/{print $2}' "/proc/$pid/status" 2>/dev/null)"; [ "$state" != Z ]
}

stop() {  # stop PIDFILE COMM
  if ! alive "$1" "$2"; then log "$2 not running"; return 0; fi
  local pid i; pid="$(tr -dc 0-9 <"$1")"
  kill -TERM "$pid" 2>/dev/null || true
  # slurmctld deletes its pid file at the start of shutdown: wait on the PID itself.
  for i in $(seq 1 300); do
    if ! kill -0 "$pid" 2>/dev/null; then log "stopped $2 ($pid)"; return 0; fi
    state="$(awk '/^State:/{print $2}' "/proc/$pid/status" 2>/dev/null || echo gone)"
    if [ "$state" = Z ] || [ "$state" = gone ]; then log "stopped $2 ($pid)"; return 0; fi
    sleep 0.1
  done
  log "$2 ($pid) ignored SIGTERM for 30 s; SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
}

# One slurmd per node (SlurmdPidFile=/run/slurmd-%n.pid); /run/slurmd.pid: a cluster from an older slurm-up.sh.
for pidfile in /run/slurmd-*.pid /run/slurmd.pid; do
  if [ -e "$pidfile" ]; then stop "$pidfile" slurmd; fi
done
stop /run/slurmctld.pid slurmctld
stop /run/munge/munged.pid munged
if [ "${LONGHAUL_SLURM_WIPE:-0}" = 1 ]; then
  rm -rf /var/lib/slurm/slurmctld/* /var/lib/slurm/slurmd/*
  log "wiped controller and node state"
fi
