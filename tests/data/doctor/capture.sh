#!/usr/bin/env bash
# Re-makes the real runs of the doctor's labelled set (tests/_doctor_cases.py): short `rlvr train`
# runs on CPU, whose metrics.jsonl and config.yaml are kept here (label.json is written by hand).
#   bash tests/data/doctor/capture.sh   (from the repository root; about 1 minute of CPU in all)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=${WORK:-/tmp/rlvr-doctor-runs}
mkdir -p "$work"
py=${PYTHON:-python}
# the random tiny model of tests/conftest.py (tiny_model_dir): it never solves a problem
$py -c "
import torch
from transformers import LlamaForCausalLM
from rlvr.models.build import char_llama_config
from rlvr.models.tokenizer import build_char_tokenizer
tok = build_char_tokenizer(); torch.manual_seed(1234)
m = LlamaForCausalLM(char_llama_config(tok, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2))
m.save_pretrained('$work/tiny_random'); tok.save_pretrained('$work/tiny_random')"
cat > "$work/broken_reward.py" <<'PY'
def broken(prompts, completions, **kwargs):
    """A reward function with a bug: it raises on every call."""
    raise KeyError("answer_text")
PY
common="threads=1 report_to=[] eval_before_after=false log_completions_every=0 --force"
run() {  # name, overrides...
    local name=$1; shift
    $py -m rlvr train "output_dir=$work/$name" "$@" $common
    mkdir -p "$here/$name"
    cp "$work/$name/metrics.jsonl" "$work/$name/config.yaml" "$here/$name/"
}
run healthy_demo steps=30
run failing_reward steps=12 "rewards=[$work/broken_reward.py:broken]"
run random_model steps=12 "model.path=$work/tiny_random"
run max_new_tokens_1 steps=12 rollout.max_new_tokens=1
run lr_1e-2 steps=30 optim.lr=1e-2
