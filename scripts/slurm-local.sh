#!/usr/bin/env bash
# A single-node Slurm cluster on this machine, for ptc's Slurm tests and for
# trying the commands of docs/slurm.md: munged + slurmctld + slurmd (Debian's
# munge and slurm-wlm), configured and run entirely under DIR (no /etc, no
# system services), on free local ports.
#
#   scripts/slurm-local.sh start DIR [CPUS]   start (or find running) the cluster in DIR;
#                                             prints "export SLURM_CONF=DIR/slurm.conf"
#   scripts/slurm-local.sh stop DIR           stop it (the daemons; DIR stays)
#   scripts/slurm-local.sh check              exit 0 if this machine can run one, else
#                                             print why and exit 77
#
# Every Slurm command then needs SLURM_CONF=DIR/slurm.conf in its environment.
# The node has CPUS CPUs (default 8: more ranks than cores, as the tests use),
# one partition 'debug', MPI launched through PMIx (srun --mpi=pmix is the
# default), and jobs may requeue. The daemons run as root (slurmd must start
# job steps as their user); on a machine without root, munge or Slurm, `check`
# says which is missing.
set -euo pipefail

usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

check() {
  local missing=()
  for tool in munged mungekey slurmctld slurmd sbatch srun scontrol; do
    command -v "$tool" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin command -v "$tool" >/dev/null 2>&1 ||
      missing+=("$tool")
  done
  if ((${#missing[@]})); then
    echo "slurm-local: cannot start a Slurm cluster: ${missing[*]} not installed (Debian: munge slurm-wlm)"
    return 77
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "slurm-local: cannot start a Slurm cluster: slurmd must run as root to start jobs (this is uid $(id -u))"
    return 77
  fi
  local plugins=/usr/lib/x86_64-linux-gnu/slurm-wlm
  if [ -d "$plugins" ] && [ ! -e "$plugins/mpi_pmix.so" ]; then
    echo "slurm-local: cannot start a Slurm cluster: Slurm's PMIx plugin ($plugins/mpi_pmix.so) is missing"
    return 77
  fi
  return 0
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

running() { # DIR NAME
  [ -f "$1/$2.pid" ] && kill -0 "$(cat "$1/$2.pid")" 2>/dev/null
}

start() {
  local dir cpus
  dir=$(mkdir -p "$1" && cd "$1" && pwd)
  cpus=${2:-8}
  export PATH=$PATH:/usr/sbin
  check
  if running "$dir" slurmctld && running "$dir" slurmd && running "$dir" munged; then
    echo "export SLURM_CONF=$dir/slurm.conf"
    return 0
  fi
  stop "$dir" >/dev/null 2>&1 || true
  mkdir -p "$dir/state" "$dir/spool" "$dir/munge"
  chmod 700 "$dir/munge"
  [ -f "$dir/munge/munge.key" ] || mungekey --create --keyfile="$dir/munge/munge.key" >/dev/null
  chmod 400 "$dir/munge/munge.key"
  munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
    --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munge/seed"

  local node=ptcnode
  cat >"$dir/slurm.conf" <<EOF
# Written by scripts/slurm-local.sh: a one-node cluster for ptc's tests.
ClusterName=ptc-local
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
MpiDefault=pmix
JobRequeue=1
ReturnToService=2
KillWait=30
MinJobAge=600
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SlurmdParameters=config_overrides
NodeName=$node NodeHostname=$(hostname -s) NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF=$dir/slurm.conf
  slurmctld -f "$SLURM_CONF" -i
  slurmd -f "$SLURM_CONF" -N "$node"
  # Up when the node is idle (slurmd registered with slurmctld).
  local state=""
  for _ in $(seq 1 100); do
    state=$(sinfo -h -n "$node" -o %t 2>/dev/null || true)
    case "$state" in idle*|mix*|alloc*) break ;; esac
    sleep 0.2
  done
  case "$state" in
    idle*|mix*|alloc*) ;;
    *) echo "slurm-local: the node did not come up (state '$state'); see $dir/slurmctld.log and $dir/slurmd.log" >&2
       stop "$dir" >/dev/null 2>&1 || true
       return 1 ;;
  esac
  echo "export SLURM_CONF=$SLURM_CONF"
}

stop() {
  local dir=$1
  for name in slurmd slurmctld munged; do
    if [ -f "$dir/$name.pid" ]; then
      local pid
      pid=$(cat "$dir/$name.pid")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
      rm -f "$dir/$name.pid"
    fi
  done
}

case "${1:-}" in
  start) [ $# -ge 2 ] || usage; start "$2" "${3:-}" ;;
  stop) [ $# -eq 2 ] || usage; stop "$2" ;;
  check) check ;;
  *) usage ;;
esac
