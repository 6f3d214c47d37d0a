#!/usr/bin/env bash
# Every GPU check in one call, for a lent GPU machine (a session gets ~15 minutes of device time):
# the environment, a 3-step smoke run of the bundled default on CUDA, bench/gpu_paths.py (every training
# path for three steps: on a GPU the second still meets new shapes), bench/server_overhead.py (where a
# server's generation time goes), bench/servers.py (generation apart from training), bench/engines.py
# (hf; vllm too where it is installed) and bench/gpu_scale.sh.
# Most important first, each with its own time limit inside $BUDGET seconds; a failing part does not stop the rest.
# Needs only the machine's own torch and transformers (rlvr from src/, no install). Results land in
# bench/results/gpu*.md and, with summary.txt and logs.tgz, in $LOGS (default /tmp/rlvr_gpu).
#
#   bash bench/gpu_all.sh                         # then copy $LOGS/* back
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LOGS=${LOGS:-/tmp/rlvr_gpu}
mkdir -p "$LOGS"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-560}  # seconds for all parts: each gets min(its limit, what is left); none starts with under 30 left
part() {  # part NAME LIMIT_S COMMAND...: run it, log to $LOGS/NAME.log, report its exit status and time
  local name=$1 limit=$2 t=$SECONDS rc=0
  shift 2
  (( limit > BUDGET - SECONDS )) && limit=$((BUDGET - SECONDS))
  if (( limit < 30 )); then
    echo "$(date -u +%T) $name: not run (${BUDGET}s budget spent)" | tee -a "$LOGS/summary.txt"
    return
  fi
  timeout -k 15 "$limit" "$@" > "$LOGS/$name.log" 2>&1 || rc=$?
  echo "$(date -u +%T) $name: rc=$rc in $((SECONDS - t))s (limit ${limit}s)" | tee -a "$LOGS/summary.txt"
}
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  $PY -c "import torch, transformers, platform; print('python', platform.python_version(), 'torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name(0))"
  $PY -c "import vllm; print('vllm', vllm.__version__)" 2>&1 | tail -1
  grep -m1 'model name' /proc/cpuinfo; nproc
} > "$LOGS/summary.txt" 2>&1
part smoke 60 $PY -m rlvr train device=cuda model.dtype=bfloat16 steps=3 data.eval_size=64 report_to=[] output_dir=/tmp/rlvr_gpu_smoke --force
[ -f /tmp/rlvr_gpu_smoke/metrics.jsonl ] && tail -n 1 /tmp/rlvr_gpu_smoke/metrics.jsonl >> "$LOGS/smoke.log"
ENGINES=hf
$PY -c "import vllm" 2>/dev/null && ENGINES=hf,vllm
part paths 180 $PY bench/gpu_paths.py --device cuda --timeout 100
part server_overhead 80 $PY bench/server_overhead.py --device cuda --repeats 3
part servers 150 $PY bench/servers.py --device cuda --engines "$ENGINES" --budget-s 100 --serve-wait-s 60
part engines 120 $PY bench/engines.py --device cuda --engines "$ENGINES" --steps 5 --warmup 2
GPU_SERVERS=0 part scale 90 bash bench/gpu_scale.sh
cp bench/results/gpu.md bench/results/gpu_servers.md bench/results/gpu_scale.md bench/results/gpu_paths.md "$LOGS/" 2>/dev/null
(cd "$LOGS" && tar czf logs.tgz ./*.log && rm ./*.log)  # few files: the device tool brings back at most 8
cat "$LOGS/summary.txt"
