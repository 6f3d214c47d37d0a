"""A setting the user changed that the rest of the config leaves unused (data.digits with
data.path, model.lora.alpha with LoRA off, eval.* with evaluation off, ...) is named at start-up
with why it has no effect; a default value, or a run's own config.yaml (which holds every key),
gives no such note."""

import json

import pytest
import yaml

from rlvr.config import load_config, to_dict
from rlvr.training.setup import check_config


def _notes(*overrides: str) -> list[str]:
    return [w for w in check_config(load_config(None, list(overrides))) if "has no effect" in w]


EVAL_OFF = "has no effect: evaluation is off in training (eval.before_after=false, eval.every=0); only `rlvr eval RUN` reads it"

CASES = [
    (
        ["data.path=rows.jsonl", "data.digits=3", "data.operators=*", "data.eval_size=50"],
        [
            "data.digits=3 has no effect: it configures a built-in task, and data.path=rows.jsonl trains on a dataset "
            "(its held-out set is eval.data, limited by eval.size)",
            "data.operators=* has no effect: it configures a built-in task, and data.path=rows.jsonl trains on a dataset "
            "(its held-out set is eval.data, limited by eval.size)",
            "data.eval_size=50 has no effect: it configures a built-in task, and data.path=rows.jsonl trains on a dataset "
            "(its held-out set is eval.data, limited by eval.size)",
        ],
    ),
    (
        ["data.path=rows.parquet", "data.split=validation", "data.subset=main"],
        [
            "data.split=validation has no effect: data.path=rows.parquet is a file; split and subset pick part of a `datasets` dataset",
            "data.subset=main has no effect: data.path=rows.parquet is a file; split and subset pick part of a `datasets` dataset",
        ],
    ),
    (
        ["data.prompt_column=question", "data.shuffle=false"],
        [
            "data.prompt_column=question has no effect: it applies to data.path, and the built-in task arithmetic makes its own prompts",
            "data.shuffle=False has no effect: it applies to data.path, and the built-in task arithmetic makes its own prompts",
        ],
    ),
    (
        ["data.task=multiplication", "data.digits=3"],
        ["data.digits=3 has no effect: only the arithmetic task uses it, and data.task=multiplication"],
    ),
    (
        ["model.lora.alpha=32", "model.lora.dropout=0.05", "model.lora.target_modules=[q_proj,v_proj]"],
        [
            "model.lora.alpha=32.0 has no effect: LoRA is off (model.lora.r=0); set model.lora.r (e.g. 16) to train adapters",
            "model.lora.dropout=0.05 has no effect: LoRA is off (model.lora.r=0); set model.lora.r (e.g. 16) to train adapters",
            "model.lora.target_modules=[q_proj, v_proj] has no effect: LoRA is off (model.lora.r=0); set model.lora.r (e.g. 16) "
            "to train adapters",
        ],
    ),
    (
        ["eval_before_after=false", "eval.data=held.jsonl", "eval.reward=math", "eval.size=20", "data.eval_size=100"],
        [
            f"eval.data=held.jsonl {EVAL_OFF}",
            f"eval.reward=math {EVAL_OFF}",
            f"eval.size=20 {EVAL_OFF}",
            f"data.eval_size=100 {EVAL_OFF}",
        ],
    ),
    (
        ["eval.size=20", "eval.split=validation"],
        [
            "eval.split=validation has no effect: it applies to eval.data, which is unset: the built-in task's held-out set is used "
            "(size: data.eval_size)",
            "eval.size=20 has no effect: it applies to eval.data, which is unset: the built-in task's held-out set is used "
            "(size: data.eval_size)",
        ],
    ),
    (
        ["eval.data=held.csv", "eval.reward=math", "eval.subset=main", "data.eval_size=100"],
        [
            "data.eval_size=100 has no effect: the held-out set is eval.data=held.csv (limited by eval.size)",
            "eval.subset=main has no effect: eval.data=held.csv is a file; split and subset pick part of a `datasets` dataset",
        ],
    ),
    (
        ["rollout.vllm.gpu_memory_utilization=0.5", "rollout.vllm.enforce_eager=true"],
        [
            "rollout.vllm.gpu_memory_utilization=0.5 has no effect: it configures the vllm engine, and rollout.engine=hf",
            "rollout.vllm.enforce_eager=True has no effect: it configures the vllm engine, and rollout.engine=hf",
        ],
    ),
    (
        [
            "algo.kl_estimator=k1",
            "algo.max_resample_rounds=8",
            "algo.sampler_correction_cap=5",
            "algo.sampler_correction_min=0.5",
            "algo.scale_rewards=none",
            "algo.std_ddof=1",
        ],
        [
            "algo.kl_estimator=k1 has no effect: there is no KL term (algo.beta=0)",
            "algo.max_resample_rounds=8 has no effect: algo.dynamic_sampling is off",
            "algo.sampler_correction_cap=5.0 has no effect: algo.sampler_correction=auto corrects nothing with rollout.engine=hf "
            "(its sampler is the trained model)",
            "algo.sampler_correction_min=0.5 has no effect: algo.sampler_correction=auto corrects nothing with rollout.engine=hf "
            "(its sampler is the trained model)",
            "algo.std_ddof=1 has no effect: algo.scale_rewards=none divides by no standard deviation",
        ],
    ),
    (
        ["algo.sapo_temperature_neg=2", "algo.vespo_k_pos=1", "algo.delta=4"],
        [
            "algo.sapo_temperature_neg=2.0 has no effect: algo.loss_type=dapo does not use it (used by: sapo)",
            "algo.vespo_k_pos=1.0 has no effect: algo.loss_type=dapo does not use it (used by: vespo)",
        ],
    ),
    (
        ["algo.loss_type=sapo", "algo.epsilon_high=0.28"],
        ["algo.epsilon_high=0.28 has no effect: algo.loss_type=sapo does not use it (used by: grpo, bnpo, dr_grpo, dapo, cispo, luspo)"],
    ),
    (
        ["optim.min_lr_rate=0.1", "optim.warmup_from_zero=true", "algo.ref_sync_steps=4"],
        [
            "algo.ref_sync_steps=4 has no effect: there is no KL term (algo.beta=0)",
            "optim.min_lr_rate=0.1 has no effect: only the cosine schedule ends above 0, and optim.lr_schedule=constant",
            "optim.warmup_from_zero=True has no effect: there is no warm-up (optim.warmup_steps=0)",
        ],
    ),
    (
        ["logging.completions_every=0", "logging.num_completions=4"],
        ["logging.num_completions=4 has no effect: logging.completions_every=0 logs no completions"],
    ),
    (
        ["log_completions_every=0", "num_completions_logged=4"],  # the old names: the same settings
        ["logging.num_completions=4 has no effect: logging.completions_every=0 logs no completions"],
    ),
    (["rollout.temperature=0", "rollout.top_k=20"], ["rollout.top_k=20 has no effect: rollout.temperature=0 decodes greedily"]),
]


@pytest.mark.parametrize("overrides,notes", CASES, ids=[c[0][-1] for c in CASES])
def test_each_unused_setting_is_named_with_why(overrides, notes):
    force = any(o == "rollout.temperature=0" for o in overrides)  # refused as a mistake unless forced
    got = [w for w in check_config(load_config(None, overrides), force=force) if "has no effect" in w]
    assert got == notes


def test_settings_that_take_effect_get_no_note():
    assert _notes() == []
    assert (
        _notes(
            "data.digits=3",
            "data.eval_size=100",
            "model.lora.r=8",
            "model.lora.alpha=32",
            "rollout.engine=vllm",
            "rollout.vllm.gpu_memory_utilization=0.5",
            "algo.beta=0.04",
            "algo.kl_estimator=k1",
            "algo.loss_type=sapo",
            "algo.sapo_temperature_neg=2",
        )
        == []
    )
    # eval.data without its own prompt column reads data.prompt_column, even on a built-in task
    assert _notes("eval.data=held.jsonl", "eval.reward=math", "data.prompt_column=question") == []
    # a default value written out changes nothing either way
    assert _notes("data.path=rows.jsonl", "data.digits=2", "model.lora.alpha=16") == []


def test_a_runs_own_config_yaml_gives_no_note(tmp_path):
    """--resume loads config.yaml, which holds every key: only values that differ from the defaults are the user's."""
    saved = tmp_path / "config.yaml"
    saved.write_text(yaml.safe_dump(to_dict(load_config(None, ["data.path=rows.jsonl", "eval_before_after=false"]))))
    assert [w for w in check_config(load_config(saved)) if "has no effect" in w] == []


def test_rlvr_train_prints_each_unused_setting_and_trains(tmp_path, tiny_model_dir, rlvr_cli):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(4)))
    proc = rlvr_cli(
        "train",
        f"model.path={tiny_model_dir}",
        f"data.path={rows}",
        "data.digits=3",
        "model.lora.alpha=32",
        "eval.data=held.jsonl",
        "eval_before_after=false",
        "rewards=[arithmetic]",
        "steps=1",
        "rollout.group_size=2",
        "rollout.prompts_per_step=2",
        "rollout.max_new_tokens=2",
        "report_to=[]",
        "threads=1",
        "model.autocast=none",
        f"output_dir={tmp_path / 'run'}",
        env={"OMP_NUM_THREADS": "1"},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for note in (
        f"[note] data.digits=3 has no effect: it configures a built-in task, and data.path={rows} trains on a dataset",
        "[note] model.lora.alpha=32.0 has no effect: LoRA is off (model.lora.r=0)",
        f"[note] eval.data=held.jsonl {EVAL_OFF}",
    ):
        assert note in proc.stdout, (note, proc.stdout[-3000:])
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 1
