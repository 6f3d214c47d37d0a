"""TRL 1.16's documented GRPO examples, with only the import line changed (`from rlvr import GRPOConfig,
GRPOTrainer`), run to completion on the bundled tiny model with small in-memory datasets of the same shape.
Each test checks the rlvr config the script became against TRL's meaning of its arguments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from datasets import Dataset, IterableDataset

from rlvr import GRPOConfig, GRPOTrainer
from rlvr.config import ConfigError

FAST = dict(per_device_train_batch_size=4, num_generations=4, max_completion_length=8, max_steps=2, bf16=False)


def prompts(n: int = 8) -> Dataset:
    return Dataset.from_list([{"prompt": f"{a}+{a}="} for a in range(n)])


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


# TRL's quickstart: reward_len on a standard (text) dataset
def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


def test_quickstart_runs_with_trls_batch_and_loss_meaning(tmp_path):
    args = GRPOConfig(
        output_dir="quick",
        per_device_train_batch_size=8,
        gradient_accumulation_steps=2,
        num_generations=4,
        max_completion_length=8,
        max_steps=4,
        steps_per_generation=4,
        bf16=False,
        logging_steps=1,
    )
    trainer = GRPOTrainer(model="tiny", reward_funcs=reward_len, args=args, train_dataset=prompts())
    cfg = trainer.cfg
    # TRL: generation batch = 8 x 1 process x 4 steps_per_generation = 32 completions = 8 prompts x 4;
    # one optimizer step = 8 x 2 accumulation = 16 completions, so a generation feeds 2 optimizer steps
    assert (cfg.rollout.prompts_per_step, cfg.rollout.group_size, cfg.optim.steps_per_generation) == (8, 4, 2)
    assert cfg.optim.micro_batch_size == 8 and cfg.steps == 2  # max_steps=4 optimizer steps = 2 generations
    assert (cfg.rollout.max_new_tokens, cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.top_k) == (8, 1.0, 1.0, 0)
    a = cfg.algo
    assert (a.loss_type, a.beta, a.epsilon, a.epsilon_high, a.scale_rewards, a.num_iterations) == ("dapo", 0.0, 0.2, None, "group", 1)
    assert (cfg.optim.lr, cfg.optim.lr_schedule, cfg.optim.beta2, cfg.model.gradient_checkpointing) == (1e-6, "linear", 0.999, True)
    assert cfg.rewards[0].name == "reward_len" and cfg.rewards[0].fn.endswith(":reward_len")
    out = trainer.train()
    assert out.global_step == 4 and trainer.state.global_step == 4
    steps = [h["step"] for h in trainer.state.log_history if "loss" in h]
    assert steps == [2, 4]  # logging_steps=1: every optimizer step that ends an rlvr step
    lines = [json.loads(x) for x in (tmp_path / "quick" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2] and "rewards/reward_len/mean" in lines[0]
    assert (tmp_path / "quick" / "final" / "model.safetensors").is_file()
    trainer.save_model("saved")
    assert (tmp_path / "saved" / "model.safetensors").is_file() and (tmp_path / "saved" / "tokenizer_config.json").is_file()
    # what HF example scripts do after training
    trainer.log_metrics("train", out.metrics)
    trainer.save_metrics("train", out.metrics)
    trainer.save_state()
    assert json.loads((tmp_path / "quick" / "trainer_state.json").read_text())["global_step"] == 4
    assert "train_runtime" in json.loads((tmp_path / "quick" / "train_results.json").read_text())
    with pytest.raises(ConfigError, match="rlvr does not upload"):
        trainer.push_to_hub()


def test_quickstart_with_trls_defaults_fits_the_tiny_models_context(capsys):
    trainer = GRPOTrainer(
        model="tiny", reward_funcs=reward_len, args=GRPOConfig(output_dir="defaults", max_steps=2), train_dataset=prompts()
    )
    cfg = trainer.cfg  # TRL's defaults: 8 completions per device, num_generations 8, 512 tokens, lr 1e-6
    assert (cfg.rollout.prompts_per_step, cfg.rollout.group_size, cfg.optim.lr, cfg.model.autocast) == (1, 8, 1e-6, "auto")
    # the tiny model's context is 128 tokens: 512 would not fit after the prompt, so the budget is what is left, said once
    tok = trainer.processing_class
    rendered = [
        tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False) for p in prompts()["prompt"]
    ]
    longest = max(len(tok(r, add_special_tokens=False)["input_ids"]) for r in rendered)
    assert cfg.rollout.max_new_tokens == 128 - longest
    assert f"max_completion_length=512 does not fit the model's context of 128 tokens after the longest prompt ({longest} tokens)" in (
        capsys.readouterr().out
    )
    trainer.train()


# a conversational dataset whose reward reads a column
def correct_answer(completions, solution, **kwargs):
    return [float(c[0]["content"].strip() == s) for c, s in zip(completions, solution)]


def test_conversational_dataset_with_a_column_reading_reward(tmp_path):
    rows = [{"prompt": [{"role": "user", "content": f"{a}+{a}="}], "solution": str(2 * a)} for a in range(6)]
    args = GRPOConfig(
        output_dir="conv",
        loss_type="grpo",
        beta=0.04,
        epsilon_high=0.28,
        scale_rewards=False,
        reward_weights=[1.0, 0.5],
        logging_strategy="no",
        disable_tqdm=True,
        **FAST,
    )
    trainer = GRPOTrainer(model="tiny", reward_funcs=[correct_answer, reward_len], args=args, train_dataset=Dataset.from_list(rows))
    assert [r.weight for r in trainer.cfg.rewards] == [1.0, 0.5] and trainer._trainer.logger_live is False
    a = trainer.cfg.algo
    assert (a.loss_type, a.beta, a.epsilon_high, a.scale_rewards, a.kl_bias_correction) == ("grpo", 0.04, 0.28, "none", True)
    assert [r.name for r in trainer.cfg.rewards] == ["correct_answer", "reward_len"]
    trainer.train()
    last = [json.loads(x) for x in (tmp_path / "conv" / "metrics.jsonl").read_text().splitlines()][-1]
    assert "rewards/correct_answer/mean" in last and last["kl"] >= 0
    assert not any("loss" in h for h in trainer.state.log_history)  # logging_strategy="no": no on_log


def test_lora_peft_config_maps_to_the_adapter_and_saves_it(tmp_path):
    from peft import LoraConfig

    args = GRPOConfig(output_dir="lora", learning_rate=1e-5, **FAST)
    peft_config = LoraConfig(r=8, lora_alpha=32, lora_dropout=0.05, task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model="tiny", reward_funcs=reward_len, args=args, train_dataset=prompts(), peft_config=peft_config)
    lo = trainer.cfg.model.lora
    assert (lo.r, lo.alpha, lo.dropout, lo.target_modules) == (8, 32.0, 0.05, ["q_proj", "v_proj"])  # peft's llama default
    trainer.train()
    assert type(trainer.model).__name__.startswith("Peft")
    assert (tmp_path / "lora" / "final" / "adapter_model.safetensors").is_file()
    with pytest.raises(ConfigError, match="peft_config.use_dora=True"):
        GRPOTrainer(
            model="tiny",
            reward_funcs=reward_len,
            args=GRPOConfig(output_dir="d", **FAST),
            train_dataset=prompts(),
            peft_config=LoraConfig(r=8, use_dora=True),
        )


def multiply(a: int, b: int) -> int:
    """
    Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.

    Returns:
        The product.
    """
    return a * b


# a chat template that renders tools= (as tool-calling models' templates do), short enough for the tiny model's context
TOOL_TEMPLATE = (
    "{% if tools %}<|system|>tools:{% for t in tools %} {{ t.function.name }}{% endfor %}\n{% endif %}"
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content or '' }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}</tool_call>"
    "{% endfor %}{% if m.role == 'assistant' %}</s>{% endif %}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def tool_tokenizer():
    from transformers import AutoTokenizer

    from rlvr.models import resolve_model_path

    tok = AutoTokenizer.from_pretrained(resolve_model_path("tiny"))
    tok.chat_template = TOOL_TEMPLATE
    return tok


def test_tools_list_and_processing_class_run_multi_turn(tmp_path):
    args = GRPOConfig(output_dir="tools", max_tool_calling_iterations=2, **FAST)
    tok = tool_tokenizer()
    trainer = GRPOTrainer(model="tiny", reward_funcs=reward_len, args=args, train_dataset=prompts(), tools=[multiply], processing_class=tok)
    assert trainer.cfg.tools.functions == [f"{__name__}:multiply"] and trainer.cfg.tools.max_turns == 3
    assert trainer.cfg.model.tokenizer.startswith("rlvr_live:")
    trainer.train()
    assert trainer._trainer.tokenizer is tok
    assert (tmp_path / "tools" / "final" / "chat_template.jinja").read_text() == TOOL_TEMPLATE  # the processing_class was used


class Counter:
    def reset(self, **kwargs) -> str | None:
        self.calls = 0
        return None

    def increment(self, step: int) -> str:
        """
        Add to the counter.

        Args:
            step: How much to add.

        Returns:
            The new count.
        """
        self.calls += step
        return str(self.calls)


def used_the_tool(environments, **kwargs):
    return [float(env.calls > 0) for env in environments]


def test_environment_factory_gives_rewards_the_episodes_environments(tmp_path):
    args = GRPOConfig(output_dir="env", **FAST)
    trainer = GRPOTrainer(
        model="tiny",
        reward_funcs=used_the_tool,
        args=args,
        train_dataset=prompts(),
        environment_factory=Counter,
        processing_class=tool_tokenizer(),
    )
    assert trainer.cfg.tools.environment == f"{__name__}:Counter"
    assert trainer.cfg.tools.max_turns == 9  # TRL: tool calls limited only by max_completion_length
    trainer.train()
    assert json.loads((tmp_path / "env" / "summary.json").read_text())["steps"] == 2


def test_a_callback_stops_training_at_step_3_and_sees_trls_state(tmp_path):
    from transformers import TrainerCallback

    events = []

    class StopAt3(TrainerCallback):
        def on_init_end(self, args, state, control, **kwargs):
            events.append(("init",))

        def on_train_begin(self, args, state, control, **kwargs):
            events.append(("begin", state.global_step, state.max_steps))

        def on_epoch_begin(self, args, state, control, **kwargs):
            events.append(("epoch",))

        def on_step_begin(self, args, state, control, **kwargs):
            events.append(("step_begin", state.global_step))

        def on_step_end(self, args, state, control, **kwargs):
            events.append(("step", state.global_step))
            if state.global_step >= 3:
                control.should_training_stop = True
            return control

        def on_log(self, args, state, control, logs=None, **kwargs):
            events.append(("log", state.global_step, "reward" in logs))

        def on_save(self, args, state, control, **kwargs):
            events.append(("save", state.global_step))

        def on_epoch_end(self, args, state, control, **kwargs):
            events.append(("epoch_end",))

        def on_train_end(self, args, state, control, **kwargs):
            events.append(("end", state.global_step, kwargs["model"] is not None))

    args = GRPOConfig(output_dir="cb", logging_steps=2, save_steps=2, **{**FAST, "max_steps": 10})
    trainer = GRPOTrainer(model="tiny", reward_funcs=reward_len, args=args, train_dataset=prompts(), callbacks=[StopAt3])
    trainer.train()
    assert events == [
        ("init",), ("begin", 0, 10), ("epoch",),
        ("step_begin", 0), ("step", 1),
        ("step_begin", 1), ("step", 2), ("log", 2, True), ("save", 2),
        ("step_begin", 2), ("step", 3), ("log", 3, True),
        ("epoch_end",), ("end", 3, True),
    ]  # fmt: skip
    # stopped as a first Ctrl-C stops: a checkpoint at step 3, resumable from the same script
    assert (tmp_path / "cb" / "checkpoints" / "step-0000003").is_dir()
    again = GRPOTrainer(model="tiny", reward_funcs=reward_len, args=args, train_dataset=prompts())
    with pytest.raises(ConfigError, match="resume_from_checkpoint=True"):
        again.train()
    assert again.train(resume_from_checkpoint=True).global_step == 10


def test_an_iterable_dataset_needs_max_steps_and_is_read_as_far_as_it_reaches():
    def gen():  # endless, as a streamed dataset can be
        a = 0
        while True:
            yield {"prompt": f"{a}+1="}
            a += 1

    with pytest.raises(ConfigError, match="max_steps"):
        GRPOTrainer(
            model="tiny",
            reward_funcs=reward_len,
            args=GRPOConfig(output_dir="it", **{**FAST, "max_steps": -1}),
            train_dataset=IterableDataset.from_generator(gen),
        )
    trainer = GRPOTrainer(
        model="tiny", reward_funcs=reward_len, args=GRPOConfig(output_dir="it", **FAST), train_dataset=IterableDataset.from_generator(gen)
    )
    assert len(trainer.train_dataset) == 2  # 2 steps x 1 prompt
    trainer.train()


def test_eval_dataset_is_scored_with_trls_eval_sampling():
    args = GRPOConfig(output_dir="ev", eval_strategy="steps", eval_steps=1, num_generations_eval=4, **FAST)
    trainer = GRPOTrainer(model="tiny", reward_funcs=reward_len, args=args, train_dataset=prompts(), eval_dataset=prompts(4))
    e = trainer.cfg.eval
    assert (e.every, e.samples, e.temperature, e.before_after) == (1, 4, 1.0, False)
    trainer.train()
    assert e.reward == "all"  # TRL's eval_reward: the reward functions' weighted sum
    metrics = trainer.evaluate()
    assert set(metrics) >= {"eval_reward", "eval_avg@4", "eval_reward_std", "eval_rewards/reward_len/mean", "eval_rewards/reward_len/std"}
    assert metrics["eval_reward"] == metrics["eval_avg@4"] == metrics["eval_rewards/reward_len/mean"]
    assert [h["step"] for h in trainer.state.log_history if "eval_reward" in h] == [1, 2, 2]  # steps 1, 2 and the explicit call


def test_save_strategy_best_keeps_and_loads_the_best_evaluation():
    """save_strategy="best" with metric_for_best_model and load_best_model_at_end, as transformers: a checkpoint at
    each new best eval_reward, the state's best_* fields, and final/ (what save_model writes too) the best model."""
    import torch
    from safetensors.torch import load_file

    fields = dict(FAST, max_steps=4, learning_rate=3e-3, logging_steps=1, max_completion_length=16)
    args = GRPOConfig(output_dir="best", eval_strategy="steps", eval_steps=1, num_generations_eval=2, save_strategy="best", **fields)
    args.metric_for_best_model, args.load_best_model_at_end = "eval_reward", True

    def right(prompts, completions, **kwargs):  # a + a = 2a: the bundled model gets some right, training moves it
        return [float(c.strip().startswith(str(2 * int(p.split("+")[0])))) for p, c in zip(prompts, completions)]

    data = Dataset.from_list([{"prompt": f"{a}+{a}="} for a in range(20, 60)])
    trainer = GRPOTrainer(model="tiny", reward_funcs=right, args=args, train_dataset=data, eval_dataset=data.select(range(8)))
    trainer.train()
    scores = [h["eval_reward"] for h in trainer.state.log_history if "eval_reward" in h]
    assert len(scores) == 4 and len(set(scores)) > 1 and trainer.state.best_metric == max(scores)
    assert trainer.state.best_global_step == scores.index(max(scores)) + 1  # one optimizer step per rlvr step here
    best = Path(trainer.state.best_model_checkpoint)
    assert best.name == f"step-{trainer.state.best_global_step:07d}" and (best / "model.safetensors").exists()
    final, kept = load_file("best/final/model.safetensors"), load_file(str(best / "model.safetensors"))
    assert all(torch.equal(final[k], kept[k]) for k in kept)


def test_evaluate_scores_the_eval_dataset_with_evaluation_off_in_training(capsys):
    """TRL's default eval_strategy="no": no evaluation while training, but a script's trainer.evaluate() still scores
    the eval_dataset (and no note calls it unused)."""
    args = GRPOConfig(output_dir="ev_no", num_generations_eval=4, **FAST)
    trainer = GRPOTrainer(model="tiny", reward_funcs=reward_len, args=args, train_dataset=prompts(), eval_dataset=prompts(4))
    assert (trainer.cfg.eval.every, trainer.cfg.eval.before_after) == (0, False)
    trainer.train()
    assert "eval.data" not in capsys.readouterr().out
    assert not any("eval_reward" in h for h in trainer.state.log_history)
    metrics = trainer.evaluate()
    assert metrics["eval_reward"] == metrics["eval_avg@4"] and -20 <= metrics["eval_reward"] <= -12  # <= 8 characters
    assert sum("eval_reward" in h for h in trainer.state.log_history) == 1


def test_a_loaded_model_object_is_trained_in_place():
    import torch
    from transformers import AutoModelForCausalLM

    from rlvr.models import resolve_model_path

    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny"))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    args = GRPOConfig(output_dir="obj", learning_rate=1e-3, **FAST)
    trainer = GRPOTrainer(model=model, reward_funcs=reward_len, args=args, train_dataset=prompts())
    assert trainer.cfg.model.path == "rlvr_live:model" and trainer.cfg.model.dtype == "float32"
    trainer.train()
    assert trainer.model is model and trainer.processing_class is not None  # the tokenizer of the model's folder
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_trl_rollout_func_gets_each_prompt_num_generations_times_and_its_extra_fields_reach_rewards():
    calls = []

    def my_rollout(prompts, trainer):
        calls.append(len(prompts))
        tok = trainer.processing_class
        out: dict = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "source": []}
        for p in prompts:
            completion = tok("42", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            out["prompt_ids"].append(tok(p, add_special_tokens=False)["input_ids"])
            out["completion_ids"].append(completion)
            out["logprobs"].append([-1.0] * len(completion))
            out["source"].append("mine")
        return out

    def from_my_rollout(completions, source, **kwargs):
        return [float(s == "mine") for s in source]

    args = GRPOConfig(output_dir="rf", **FAST)
    trainer = GRPOTrainer(model="tiny", reward_funcs=from_my_rollout, args=args, train_dataset=prompts(), rollout_func=my_rollout)
    trainer.train()
    assert calls == [4, 4]  # 1 prompt x num_generations 4, per step
    last = [json.loads(x) for x in (Path("rf") / "metrics.jsonl").read_text().splitlines()][-1]
    assert last["rewards/from_my_rollout/mean"] == 1.0


def test_logging_strategy_epoch_logs_when_a_pass_over_the_dataset_ends():
    args = GRPOConfig(output_dir="ep", logging_strategy="epoch", **{**FAST, "max_steps": 5})
    trainer = GRPOTrainer(model="tiny", reward_funcs=reward_len, args=args, train_dataset=prompts(4))  # 4 rows, 1 per step
    trainer.train()
    assert [h["step"] for h in trainer.state.log_history if "loss" in h] == [4, 5]  # the pass's end, then the run's
