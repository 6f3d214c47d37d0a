#!/usr/bin/env bash
# DDP and FSDP2 on every GPU present: a few GRPO steps of a ~25M Llama each, under 8 minutes,
# results in bench/results/gpu_scale.md. Fails clearly when there is no GPU.
#
#   bash bench/gpu_scale.sh            # uses all visible GPUs
#
# Then bench/gpu_servers.sh (at most 6 minutes; GPU_SERVERS=0 skips it): steps through `rlvr serve`
# with rollout.max_staleness 0 and 1, the server on the second GPU when there are two
# -> bench/results/gpu_servers.md.
#
# Run on one H200 on 2026-12-04 (one rank: DDP's wrapper, no NCCL collective; FSDP needs two GPUs and has not run on GPUs).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
NGPU=$($PY -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
if [ "$NGPU" -lt 1 ]; then
  echo "gpu_scale.sh: no CUDA GPU visible (torch.cuda.is_available() is False); this benchmark needs at least one GPU" >&2
  exit 2
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
$PY - "$WORK/model" <<'PYEOF'
import sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
from rlvr.models.tokenizer import build_char_tokenizer
tok = build_char_tokenizer(); torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=len(tok), hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8,
                  intermediate_size=1376, max_position_embeddings=256, tie_word_embeddings=True, pad_token_id=tok.pad_token_id,
                  eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
LlamaForCausalLM(cfg).save_pretrained(sys.argv[1]); tok.save_pretrained(sys.argv[1])
PYEOF
OUT=bench/results/gpu_scale.md
{
  echo "# GPU scale-out: DDP and FSDP2 ($NGPU GPU(s): $($PY -c 'import torch; print(torch.cuda.get_device_name(0))'))"
  echo
  echo "25M Llama, 10 steps of 32 prompts x 8 completions, 32 new tokens, bf16. \`bash bench/gpu_scale.sh\`, $(date -u +%F)."
  echo
  echo "| strategy | ranks | s/step (median, steps 3-10) | completion tokens/s | peak GPU memory rank 0 (GiB) |"
  echo "|---|---|---|---|---|"
} > "$OUT"
for STRATEGY in ddp fsdp; do
  for N in $(printf '1\n%s\n' "$NGPU" | sort -un); do
    [ "$STRATEGY" = fsdp ] && [ "$N" = 1 ] && continue  # one rank runs no FSDP (the model is not wrapped)
    RUN="$WORK/run-$STRATEGY-$N"
    timeout 200 $PY -m rlvr train model.path="$WORK/model" model.dtype=bfloat16 nproc="$N" dist.strategy="$STRATEGY" \
      steps=10 rollout.prompts_per_step=32 rollout.group_size=8 rollout.max_new_tokens=32 eval_before_after=false \
      report_to=[] doctor_every=0 output_dir="$RUN" > "$RUN.log" 2>&1 || { echo "| $STRATEGY | $N | FAILED (see log) | | |" >> "$OUT"; tail -20 "$RUN.log"; continue; }
    $PY - "$RUN/metrics.jsonl" "$STRATEGY" "$N" >> "$OUT" <<'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][2:]
step = statistics.median(r["time/step"] for r in rows)
toks = statistics.median(r["completions/mean_length"] * 256 / r["time/step"] for r in rows)
mem = max(r.get("memory/peak_gib", float("nan")) for r in rows)
print(f"| {sys.argv[2]} | {sys.argv[3]} | {step:.2f} | {toks:.0f} | {mem:.2f} |")
PYEOF
  done
done
cat "$OUT"
if [ "${GPU_SERVERS:-1}" != 0 ]; then
  PYTHON=$PY bash bench/gpu_servers.sh || { echo "gpu_scale.sh: bench/gpu_servers.sh failed (exit $?)" >&2; exit 1; }
fi
