#!/usr/bin/env bash
# Generation apart from training on a GPU: `rlvr train` generating in-process, then through
# `rlvr serve --engine hf` and `--engine vllm` on 127.0.0.1 with rollout.max_staleness 0 and 1,
# and k = 1 with no server named (rlvr's own local server). A server on the second GPU when there
# are two (NCCL weight sync between GPUs), else on the trainer's GPU. Step-time split per run in
# bench/results/gpu_servers.md. Hard limit: 6 minutes (runs not started after 4.5 are listed as
# not run), so it fits beside the other GPU checks. Also run by bench/gpu.sh and bench/gpu_scale.sh.
#
#   pip install -e '.[vllm]' && bash bench/gpu_servers.sh
#   bash bench/gpu_servers.sh --engines hf                # without vLLM
#   bash bench/gpu_servers.sh --device cpu --engines hf --steps 3 --warmup 1 --out /tmp/servers_cpu.md   # on CPU
#
# Run on one H200 on 2026-12-04 with --engines hf (vLLM was not installed there): bench/results/gpu_servers.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
if [[ " $* " != *" --device cpu "* ]]; then
  if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_servers.sh: no CUDA GPU visible (torch.cuda.is_available() is False); pass --device cpu --engines hf to run on CPU" >&2
    exit 2
  fi
fi
ARGS=("$@")
if [[ " $* " != *" --engines "* ]] && ! $PY -c "import vllm" 2>/dev/null; then
  echo "gpu_servers.sh: vLLM is not installed in $PY's environment, so only --engines hf runs (pip install -e '.[vllm]' for both)" >&2
  ARGS+=(--engines hf)
fi
exec timeout -k 20 360 $PY bench/servers.py --budget-s 270 "${ARGS[@]}"
