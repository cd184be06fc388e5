#!/usr/bin/env bash
# Start N jaxnet processes on this machine as one multi-process run (CPU collectives over
# localhost), the way N hosts would run it:
#
#     scripts/launch_local.sh 2 transformer_shakespeare:smoke mesh.data=-1 --workdir runs/two
#
# Each process gets its share of the devices: set XLA_FLAGS=--xla_force_host_platform_device_count=K
# to give each K CPU devices. Process 0 prints and writes the logs; the others print only errors.
# If one process fails, the others are stopped (TERM, then KILL 2 s later: JAX catches TERM as a
# preemption notice); the exit code is the first failure's. On TERM (a preemption notice to the
# launcher) the processes get TERM and up to JAXNET_STOP_WAIT_S seconds (default 60, said on
# stderr) to finish the step and write the preemption checkpoint they agree on; those still
# running then are killed.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ $# -lt 2 ] || ! [[ $1 =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: scripts/launch_local.sh N EXPERIMENT [key=value ...] [--workdir DIR]" >&2
  exit 2
fi
N=$1; shift
if [ -z "${PYTHON:-}" ]; then
  if [ -z "${VIRTUAL_ENV:-}" ] && [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"
  else PYTHON=$(command -v python3) || { echo "error: python3 not found; set PYTHON" >&2; exit 2; }; fi
fi
STOP_WAIT_S="${JAXNET_STOP_WAIT_S:-60}"
if ! [[ $STOP_WAIT_S =~ ^[0-9]+$ ]]; then
  echo "error: JAXNET_STOP_WAIT_S=$STOP_WAIT_S: give a whole number of seconds" >&2
  exit 2
fi
PORT="${JAXNET_PORT:-$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("localhost", 0)); print(s.getsockname()[1])')}"

pids=()
alive() { for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && return 0; done; return 1; }
running() { local n=0; for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && n=$((n + 1)); done; echo "$n"; }
# stop_all [SECONDS [SAY]]: TERM every process, wait up to SECONDS (default 2) for them to exit
# (saying so on stderr with SAY), then KILL those left.
stop_all() {
  [ ${#pids[@]} -gt 0 ] || return 0
  alive || return 0
  local limit=${1:-2} say=${2:-}
  kill -TERM "${pids[@]}" 2>/dev/null || true
  if [ -n "$say" ]; then
    echo "launch_local.sh: waiting up to $limit s for $(running) processes to finish their preemption checkpoint" >&2
  fi
  local deadline=$((SECONDS + limit)) tries=0
  while alive; do
    if [ "$SECONDS" -ge "$deadline" ] && [ "$tries" -ge $((limit * 5)) ]; then
      echo "launch_local.sh: $(running) processes still running after $limit s; killing them" >&2
      kill -KILL "${pids[@]}" 2>/dev/null || true
      wait "${pids[@]}" 2>/dev/null || true  # reaped here, without bash's line per killed job
      return 0
    fi
    sleep 0.2
    tries=$((tries + 1))
  done
}
trap stop_all EXIT
trap 'stop_all "$STOP_WAIT_S" say; exit 130' INT
trap 'stop_all "$STOP_WAIT_S" say; exit 143' TERM
for ((i = 0; i < N; i++)); do
  "$PYTHON" -m jaxnet train "$@" --coordinator "localhost:$PORT" --num-processes "$N" --process-id "$i" &
  pids+=($!)
done
status=0
for ((left = N; left > 0; left--)); do
  if wait -n; then :; else
    code=$?
    if [ "$status" -eq 0 ]; then status=$code; stop_all; fi
  fi
done
trap - EXIT
exit "$status"
