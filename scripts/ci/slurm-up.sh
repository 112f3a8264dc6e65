#!/usr/bin/env bash
# Install and start a real one-node Slurm 22.05 (Debian packages: munge, slurmctld, slurmd, slurm-client) with
# fake GPUs, then prove it healthy with a real GPU job. Idempotent: safe to run again (no-op when healthy;
# restarts the daemons when the configuration changed). Needs root. Stop it with scripts/ci/slurm-down.sh.
#
# Why each non-default setting is there: ../../README.md (Slurm section) and the measured notes it cites.
# Node shape: config_overrides lets slurmd advertise what slurm.conf claims on any machine; the default shape
# is large enough that every shipped spec's rendered script passes `sbatch --test-only` unchanged.
#   LONGHAUL_SLURM_CPUS   (default 32)      advertised CPUs
#   LONGHAUL_SLURM_MEM_MB (default 524288)  advertised RealMemory in MiB (512 GiB)
#   LONGHAUL_SLURM_GPUS   (default 2)       fake GPUs (symlinks to /dev/null)
#   LONGHAUL_SLURM_GPU_TYPE (default a800)  GRES type of the fake GPUs (untyped --gres=gpu:N still matches)
#   LONGHAUL_SLURM_MULTI_CPUS (default 8)   advertised CPUs of each of the two `multi` nodes
# Two more nodes, lh-node1 and lh-node2, form the non-default partition `multi`: two more slurmd daemons on this
# host (`slurmd -N <node>`, each with its own Port, and pid/spool/log paths through `%n`), so that multi-node jobs
# (Ray head + worker, `srun -N2`) run for real on one machine. Node `localhost` and partition `debug` (the
# default) are what every other test uses and stay as they were.
set -euo pipefail

CPUS="${LONGHAUL_SLURM_CPUS:-32}"
MEM_MB="${LONGHAUL_SLURM_MEM_MB:-524288}"
GPUS="${LONGHAUL_SLURM_GPUS:-2}"
GPU_TYPE="${LONGHAUL_SLURM_GPU_TYPE:-a800}"
MULTI_CPUS="${LONGHAUL_SLURM_MULTI_CPUS:-8}"
MULTI_NODES=(lh-node1 lh-node2)
MULTI_PORTS=(6821 6822)
ETC=/etc/slurm
FAKEGPU_DIR="$ETC/fakegpu"
HEALTH_DIR="${TMPDIR:-/tmp}/longhaul-slurm-health"

log() { printf 'slurm-up: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; for f in /var/log/slurm/slurmctld.log /var/log/slurm/slurmd-*.log; do
  [ -f "$f" ] && { log "--- tail $f"; tail -n 20 "$f" >&2; }; done; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root (installs packages and starts daemons)"
T0_MS=$(( $(date +%s%N) / 1000000 ))

# --- 1. packages (no service starts during install: no systemd here) ---------------------------------------
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null \
  || ! command -v munged >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  created_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && created_policy=1
  fi
  if ! apt-cache show slurmctld >/dev/null 2>&1; then apt-get -o DPkg::Lock::Timeout=600 update; fi
  apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends munge slurmctld slurmd slurm-client
  if [ "$created_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
  log "installed slurm $(dpkg-query -W -f '${Version}' slurmctld)"
fi

# --- 2. configuration (rewritten only when it differs; a change restarts running daemons) -------------------
install -d -m 755 "$ETC" "$FAKEGPU_DIR" /var/log/slurm
install -d -o slurm -g slurm -m 755 /var/lib/slurm /var/lib/slurm/slurmctld /var/lib/slurm/slurmd
for node in localhost "${MULTI_NODES[@]}"; do install -d -m 755 "/var/lib/slurm/slurmd/$node"; done
chown slurm:slurm /var/log/slurm
last=$((GPUS - 1))
for i in $(seq 0 "$last"); do ln -sfn /dev/null "$FAKEGPU_DIR/gpu$i"; done

changed=0
put() {  # put FILE MODE: write stdin to FILE when the content differs
  local tmp; tmp="$(mktemp)"; cat >"$tmp"
  if [ -f "$1" ] && cmp -s "$tmp" "$1"; then rm -f "$tmp"; else
    install -m "$2" "$tmp" "$1"; rm -f "$tmp"; changed=1; log "wrote $1"; fi
}
gres_range="gpu0"; [ "$GPUS" -gt 1 ] && gres_range="gpu[0-$last]"
put "$ETC/slurm.conf" 644 <<EOF
# Written by longhaul scripts/ci/slurm-up.sh: the CI cluster (see the README's Slurm section): node localhost
# (partition debug, the default) and the two-node partition multi, all slurmd daemons on this one host.
ClusterName=ci
SlurmctldHost=localhost
SlurmUser=slurm
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire=10
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd/%n
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd-%n.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
SlurmctldPort=6817
SlurmdPort=6818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=2,sched_interval=2
SlurmdParameters=config_overrides
GresTypes=gpu
EnforcePartLimits=ALL
ReturnToService=2
MpiDefault=none
MailProg=/bin/true
KillWait=5
MinJobAge=300
InactiveLimit=0
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=/var/log/slurm/jobcomp.log
NodeName=${MULTI_NODES[0]} NodeAddr=127.0.0.1 Port=${MULTI_PORTS[0]} CPUs=$MULTI_CPUS RealMemory=$MEM_MB State=UNKNOWN
NodeName=${MULTI_NODES[1]} NodeAddr=127.0.0.1 Port=${MULTI_PORTS[1]} CPUs=$MULTI_CPUS RealMemory=$MEM_MB State=UNKNOWN
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM_MB Gres=gpu:$GPU_TYPE:$GPUS State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
PartitionName=multi Nodes=${MULTI_NODES[0]},${MULTI_NODES[1]} Default=NO MaxTime=INFINITE State=UP
EOF
put "$ETC/gres.conf" 644 <<EOF
AutoDetect=off
NodeName=localhost Name=gpu Type=$GPU_TYPE File=$FAKEGPU_DIR/$gres_range
EOF
put "$ETC/cgroup.conf" 644 <<EOF
CgroupPlugin=cgroup/v1
EOF

# munged refuses a key readable by group/other and an insecure key directory.
chown -R munge:munge /etc/munge && chmod 0700 /etc/munge && chmod 0400 /etc/munge/munge.key
install -d -o munge -g munge -m 755 /run/munge

# --- 3. daemons (tracked by their pid files; a stale or zombie pid counts as dead) ---------------------------
alive() {  # alive PIDFILE COMM
  local pid state
  [ -s "$1" ] || return 1
  pid="$(tr -dc 0-9 <"$1")"; [ -n "$pid" ] && [ -r "/proc/$pid/comm" ] || return 1
  [ "$(cat "/proc/$pid/comm")" = "$2" ] || return 1
  state="$(awk '/^State:/{print $2}' "/proc/$pid/status" 2>/dev/null)"; [ "$state" != Z ]
}
stop() {  # stop PIDFILE COMM: SIGTERM, wait up to 30 s on the pid, then SIGKILL
  alive "$1" "$2" || return 0
  local pid i; pid="$(tr -dc 0-9 <"$1")"; kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 300); do alive "$1" "$2" || return 0; kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  log "$2 ($pid) ignored SIGTERM for 30 s; SIGKILL"; kill -KILL "$pid" 2>/dev/null || true
}
MUNGE_PID=/run/munge/munged.pid CTLD_PID=/run/slurmctld.pid
NODES=(localhost "${MULTI_NODES[@]}")
slurmd_pid() { printf '/run/slurmd-%s.pid' "$1"; }  # SlurmdPidFile with %n = node name
if [ "$changed" = 1 ]; then  # AuthInfo and node shape need a daemon restart, not `scontrol reconfigure`
  stop /run/slurmd.pid slurmd  # a one-node cluster started by an older version of this script
  for node in "${NODES[@]}"; do stop "$(slurmd_pid "$node")" slurmd; done
  stop "$CTLD_PID" slurmctld
fi
if ! alive "$MUNGE_PID" munged; then
  runuser -u munge -- /usr/sbin/munged || die "munged did not start"
fi
for i in $(seq 1 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
munge -n | unmunge >/dev/null || die "munge round trip failed"
alive "$CTLD_PID" slurmctld || /usr/sbin/slurmctld || die "slurmctld did not start"
for node in "${NODES[@]}"; do
  alive "$(slurmd_pid "$node")" slurmd || /usr/sbin/slurmd -N "$node" || die "slurmd -N $node did not start"
done

# --- 4. health: controller up, node idle, a real GPU job completes ------------------------------------------
for i in $(seq 1 300); do scontrol ping 2>/dev/null | grep -q 'is UP' && break; sleep 0.1; done
scontrol ping | grep -q 'is UP' || die "slurmctld does not answer scontrol ping"
for node in "${NODES[@]}"; do
  state=""
  for i in $(seq 1 300); do
    state="$(sinfo -h -n "$node" -o '%T' 2>/dev/null || true)"
    case "$state" in
      idle*|mixed*|allocated*) break ;;
      drain*|drained*) scontrol update nodename="$node" state=resume || true ;;
    esac
    sleep 0.1
  done
  case "$state" in idle*|mixed*|allocated*) ;; *) die "node $node is '$state', not idle" ;; esac
done

rm -rf "$HEALTH_DIR"; install -d -m 755 "$HEALTH_DIR"
run_job() {  # run_job SBATCH-ARGS...: submit, poll scontrol (sbatch --wait polls at 2, 10, 42 s); sets $job
  local i line jstate=""
  job="$(sbatch --parsable -o "$HEALTH_DIR/%j.out" -t 1 "$@")" || die "health job was not accepted: $*"
  job="${job%%;*}"
  for i in $(seq 1 600); do
    line="$(scontrol show job -o "$job" 2>/dev/null || true)"
    jstate="$(sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' <<<"$line")"
    case "$jstate" in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL) break ;; esac
    sleep 0.2
  done
  [ "$jstate" = COMPLETED ] || die "health job $job ended '$jstate': $line"
}
run_job -J longhaul-health --gres="gpu:$GPUS" --wrap 'echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"'
grep -q '^CUDA_VISIBLE_DEVICES=0' "$HEALTH_DIR/$job.out" || die "health job saw no fake GPUs: $(cat "$HEALTH_DIR/$job.out")"
gpu_job="$job"
# The two-node partition: one job step with a task on each node, each reporting the node it ran on.
run_job -J longhaul-health-multi -p multi -N 2 --ntasks-per-node=1 --wrap 'srun printenv SLURMD_NODENAME'
seen="$(sort "$HEALTH_DIR/$job.out" | tr '\n' ' ')"
[ "$seen" = "${MULTI_NODES[0]} ${MULTI_NODES[1]} " ] || die "2-node job $job ran on '$seen', not ${MULTI_NODES[*]}"
log "healthy: $(sinfo -h -o '%P %a %D %T %N' | tr '\n' ';') cpus=$CPUS mem=${MEM_MB}M gres=gpu:$GPU_TYPE:$GPUS" \
  "job $gpu_job $(cat "$HEALTH_DIR/$gpu_job.out"), 2-node job $job on $seen in $(( $(date +%s%N) / 1000000 - T0_MS )) ms"
