#!/usr/bin/env bash
# The GPU check: one command that verifies and measures jaxnet on an NVIDIA GPU, writing every
# result under --out DIR (default $OUT, else runs/gpu-check; see scripts/gpu_check.py for the parts).
#
# Where there is a network, once:  scripts/gpu_check.sh --prepare .gpu_carry
#   (tensorboardX's wheel, the treebank and shakespeare corpora and the four Fashion-MNIST files,
#   about 35 MiB, in a folder git ignores, for a GPU machine without a network)
# Practise on the CPU:             JAX_PLATFORMS=cpu scripts/gpu_check.sh --dry-run --out /tmp/gpu-check
# On the GPU machine (the checkout and .gpu_carry copied there; at most 10 minutes, --budget 570 s):
#   bash scripts/gpu_check.sh
# If its bench runs out of time, a second run gives the bench the whole budget, for some families:
#   bash scripts/gpu_check.sh --only setup,bench --families transformer,cnn
# The sweep's speed (8 and 32 members batched against one by one) has a run of its own:
#   bash scripts/gpu_check.sh --only sweep
# So does jaxnet plan's predicted memory and step time against the measured ones:
#   bash scripts/gpu_check.sh --only plan
# And jaxnet against PyTorch on the GPU (GPT-2 small, a Llama-shaped 1B; bf16, fp8; remat none, full; 420 s):
#   bash scripts/gpu_check.sh --only setup,facts,speed
#
# Options: --dry-run, --out DIR (default $OUT, else runs/gpu-check), --carry DIR (default .gpu_carry),
# --budget SECONDS, --only setup,facts,tests,smokes,plan,bench,sweep,speed, --rows (the speed part's rows),
# --families (the bench part's: gpt2,lstm,resnet,transformer,cnn).
# Exit status 0: every part passed;
# 1: a part failed or ran out of time (the others still ran and wrote); 2: bad input.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ -z "${PYTHON:-}" ]; then
  # here, the project's virtual environment; on the GPU machine (no .venv travels) its own python3
  if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
command -v "$PYTHON" >/dev/null 2>&1 || { echo "gpu_check.sh: error: $PYTHON not found; set PYTHON=/path/to/python3" >&2; exit 2; }
exec "$PYTHON" "$ROOT/scripts/gpu_check.py" "$@"
