#!/usr/bin/env bash
# A real single-node Slurm (and Open MPI's mpirun) on this machine, for trying the batch script and
# for the tests that submit it (tests/test_cluster.py):
#
#     scripts/slurm/local_cluster.sh start     # install if missing (root + apt-get), start, print SLURM_CONF
#     export SLURM_CONF=/tmp/jaxnet-slurm/slurm.conf
#     sbatch --wait scripts/slurm/train.sbatch
#     scripts/slurm/local_cluster.sh stop      # stop the daemons it started, by their PIDs
#     scripts/slurm/local_cluster.sh install   # only install the packages if missing (mpirun too)
#
# `start` is idempotent: a daemon whose PID file names a live process of that program is left
# alone, so a second call starts nothing; it ends when the node says idle. `stop` kills only the
# PIDs in the PID files this script's daemons wrote (munged only if this script started it),
# never a process by its name. `status` exits 0 when the cluster answers, 1 otherwise.
# Packages (Debian 12): slurmctld slurmd slurm-client munge openmpi-bin. No systemd and no
# cgroups are needed (proctrack/linuxproc, task/none); everything lives under $JAXNET_SLURM_DIR
# (default /tmp/jaxnet-slurm). Exit code 3: this machine cannot run it (not root, no apt-get);
# the line says why.
set -euo pipefail
DIR=${JAXNET_SLURM_DIR:-/tmp/jaxnet-slurm}
CONF=$DIR/slurm.conf
PACKAGES=(slurmctld slurmd slurm-client munge openmpi-bin)
MUNGE_PID=/run/munge/munged.pid
export SLURM_CONF=$CONF

say() { echo "local_cluster.sh: $*" >&2; }
cannot() { say "$*"; exit 3; }

# running PIDFILE PROGRAM: the PID in PIDFILE if it is a live process of PROGRAM (else nothing)
running() {
  local pid
  [ -r "$1" ] || return 1
  pid=$(tr -dc 0-9 < "$1")
  [ -n "$pid" ] && [ -r "/proc/$pid/comm" ] && [ "$(cat "/proc/$pid/comm")" = "$2" ] && echo "$pid"
}

install() {
  local missing=()
  for program in slurmctld slurmd sbatch munged mpirun; do command -v "$program" > /dev/null || missing+=("$program"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "$(id -u)" -eq 0 ] || cannot "${missing[*]} not installed and not root: install ${PACKAGES[*]} (Debian/Ubuntu)"
  command -v apt-get > /dev/null || cannot "${missing[*]} not installed and no apt-get: install Slurm, munge and Open MPI 4"
  say "installing ${PACKAGES[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq > "${TMPDIR:-/tmp}/jaxnet-apt.log" 2>&1 \
    && apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >> "${TMPDIR:-/tmp}/jaxnet-apt.log" 2>&1 \
    || cannot "apt-get could not install ${PACKAGES[*]} (see ${TMPDIR:-/tmp}/jaxnet-apt.log)"
}

start_munge() {
  [ -n "$(running "$MUNGE_PID" munged)" ] && return 0
  [ -s /etc/munge/munge.key ] || mungekey --create --keyfile=/etc/munge/munge.key
  mkdir -p /run/munge /var/lib/munge /var/log/munge
  chown munge:munge /etc/munge/munge.key /run/munge /var/lib/munge /var/log/munge
  chmod 0400 /etc/munge/munge.key
  chmod 0755 /run/munge
  runuser -u munge -- munged
  touch "$DIR/munged.ours"
  munge -n | unmunge > /dev/null || cannot "munged started but munge -n | unmunge fails (see /var/log/munge/munged.log)"
}

write_conf() {
  local host node
  host=$(hostname -s)
  getent hosts "$host" > /dev/null || echo "127.0.0.1 $host" >> /etc/hosts
  node=$(slurmd -C | head -1)  # NodeName=HOST CPUs=... RealMemory=...
  mkdir -p "$DIR/state" "$DIR/spool"
  cat > "$CONF.new" <<CONFEOF
# written by scripts/slurm/local_cluster.sh: one node, no cgroups, no accounting
ClusterName=jaxnet
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
KillWait=10
# A requeued job waits out the credential lifetime (120 s by default), then the next scheduling pass
AuthInfo=cred_expire=5
SchedulerParameters=sched_interval=1,bf_interval=1
$node State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONFEOF
  mv "$CONF.new" "$CONF"
}

start() {
  install
  mkdir -p "$DIR"
  start_munge
  if [ -z "$(running "$DIR/slurmctld.pid" slurmctld)" ]; then
    write_conf
    slurmctld -f "$CONF"
  fi
  [ -n "$(running "$DIR/slurmd.pid" slurmd)" ] || slurmd -f "$CONF"
  local state
  for _ in $(seq 100); do
    state=$(sinfo -h -N -o %t 2> /dev/null | head -1 || true)
    case $state in idle | mix | alloc) echo "SLURM_CONF=$CONF"; return 0 ;; esac
    sleep 0.2
  done
  say "the node did not become idle in 20 s (state: ${state:-no answer}); see $DIR/slurmctld.log and $DIR/slurmd.log"
  exit 1
}

stop() {  # TERM every daemon this script started, then KILL those still there after 10 s
  local pids=() pid
  pid=$(running "$DIR/slurmd.pid" slurmd) && pids+=("$pid")
  pid=$(running "$DIR/slurmctld.pid" slurmctld) && pids+=("$pid")
  if [ -f "$DIR/munged.ours" ]; then
    pid=$(running "$MUNGE_PID" munged) && pids+=("$pid")
    rm -f "$DIR/munged.ours"
  fi
  [ ${#pids[@]} -gt 0 ] || return 0
  kill -TERM "${pids[@]}" 2> /dev/null || true
  for _ in $(seq 100); do
    local left=0
    for pid in "${pids[@]}"; do [ -d "/proc/$pid" ] && left=1; done
    [ "$left" -eq 0 ] && return 0
    sleep 0.1
  done
  kill -KILL "${pids[@]}" 2> /dev/null || true
}

status() {
  [ -f "$CONF" ] && [ -n "$(running "$DIR/slurmctld.pid" slurmctld)" ] && [ -n "$(running "$DIR/slurmd.pid" slurmd)" ] \
    && sinfo -h -N -o "%N %t" 2> /dev/null
}

case ${1:-} in
  install) install ;;
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: scripts/slurm/local_cluster.sh start|stop|status|install" >&2; exit 2 ;;
esac
