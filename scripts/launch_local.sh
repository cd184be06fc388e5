#!/usr/bin/env bash
# Start N jaxnet processes on this machine as one multi-process run (CPU collectives over
# localhost), the way N hosts would run it:
#
#     scripts/launch_local.sh 2 transformer_shakespeare:smoke mesh.data=-1 --workdir runs/two
#
# Each process gets its share of the devices: set XLA_FLAGS=--xla_force_host_platform_device_count=K
# to give each K CPU devices. Process 0 prints and writes the logs; the others print only errors.
# If one process fails, the others are stopped (TERM, then KILL: JAX catches TERM as a preemption
# notice); the exit code is the first failure's.
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
PORT="${JAXNET_PORT:-$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("localhost", 0)); print(s.getsockname()[1])')}"

pids=()
alive() { for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && return 0; done; return 1; }
stop_all() {
  [ ${#pids[@]} -gt 0 ] || return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    alive || return 0
    sleep 0.2
  done
  kill -KILL "${pids[@]}" 2>/dev/null || true
}
trap stop_all EXIT
trap 'stop_all; exit 130' INT
trap 'stop_all; exit 143' TERM
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
