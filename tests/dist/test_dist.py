"""Scale-out: 2 gloo ranks on CPU equal 1 process on the same global batch; a dead rank stops the
other with an error naming it; batch-plan refusals; `nproc=N` launches through torchrun."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rlvr.config import ConfigError, load_config
from rlvr.training.checkpoint import latest_checkpoint
from rlvr.training.setup import check_config

from _runs import DENSE_REWARD
from _paths import TESTS

WORKER = str(TESTS / "_dist_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_env(rank: int, world: int, port: int) -> dict:
    """torchrun's variables for one rank of `world` on this machine."""
    return dict(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def _launch(world: int, out: Path, steps: int, overrides: list[str], extra_env: dict | None = None) -> list[subprocess.Popen]:
    port = _free_port()
    procs = []
    for rank in range(world):
        # Keep the caller's PYTHONPATH (e.g. a worktree's src/) after tests/ so the workers
        # import the same rlvr as the test itself, not whichever one is pip-installed.
        pythonpath = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=pythonpath)
        if world > 1:
            env.update(_rank_env(rank, world, port))
        env.update(extra_env or {})
        procs.append(
            subprocess.Popen(
                [sys.executable, WORKER, str(out), str(steps), *overrides],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    return procs


def _wait(procs, timeout=120) -> list[tuple[int, str]]:
    res = []
    for p in procs:
        try:
            o, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            o, _ = p.communicate()
        res.append((p.returncode, o))
    return res


# Only prompts with an odd answer get a spread of rewards: dynamic sampling drops the others and
# resamples rounds of 1-3 prompts, so a rank can have no prompt in a round, or fewer groups.
PARITY_REWARD = """
def parity(prompts, completions, answer, **kwargs):
    return [0.5 if int(answer[i]) % 2 == 0 else (i % 4) / 4 for i in range(len(completions))]
"""


@pytest.fixture(scope="module")
def parity_reward(tmp_path_factory) -> str:
    reward = tmp_path_factory.mktemp("reward") / "parity.py"
    reward.write_text(PARITY_REWARD)
    return f"{reward}:parity"


@pytest.fixture(scope="module")
def base_overrides(tiny_model_dir, tmp_path_factory):
    reward = tmp_path_factory.mktemp("reward") / "dense.py"
    reward.write_text(DENSE_REWARD)
    return [
        f"model.path={tiny_model_dir}",
        "threads=1",
        "rollout.prompts_per_step=4",
        "rollout.group_size=4",
        "rollout.max_new_tokens=6",
        "optim.lr=0.001",
        f"rewards.0.fn={reward}:digit_share",
        "doctor_every=0",
        "report_to=[]",
        "model.autocast=none",
    ]  # fp32 in both: autocast=auto times each shape, and a loaded machine may pick bf16


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


DYNAMIC = ["algo.loss_type=grpo", "algo.dynamic_sampling=true", "algo.max_resample_rounds=3", "algo.beta=0.04", "rewards.0.fn={parity}"]


@pytest.mark.parametrize(
    "extra",
    [
        ["optim.micro_batch_size=4", "algo.scale_rewards=batch"],  # dapo (global token count), batch std
        DYNAMIC,  # uneven shares (a rank idle in a resample round, 1 vs 2 groups in the update), KL
        # FSDP2 on gloo: sharded DTensor weights and gradients, accumulation through
        # set_requires_gradient_sync, generation with the weights gathered (also on an idle rank)
        ["dist.strategy=fsdp", "optim.micro_batch_size=4", "algo.scale_rewards=batch", "algo.beta=0.04"],  # + frozen reference copy
        # LoRA: the reference is the sharded policy with its adapter off, micro-batched over uneven shares
        ["dist.strategy=fsdp", *DYNAMIC, "model.lora.r=4", "optim.micro_batch_size=4"],
        # 2 minibatches of 2 prompts (1 per rank), each its own optimizer step, mu=2; cispo with the entropy bonus and OPSM
        [
            "optim.steps_per_generation=2",
            "algo.num_iterations=2",
            "algo.loss_type=cispo",
            "algo.epsilon_high=5.0",
            "algo.entropy_coef=0.01",
            "algo.off_policy_mask_threshold=0.5",
        ],
        # DDP: each rank moves its own reference copy after every optimizer step; step 2's KL reads the moved one
        ["optim.micro_batch_size=4", "algo.beta=0.04", "algo.ref_sync_steps=1", "algo.ref_sync_alpha=0.5"],
    ],
    ids=["dapo-batchstd-accum", "grpo-dynamic-kl", "fsdp-accum-kl", "fsdp-lora-dynamic-kl", "minibatches-cispo-entropy-opsm", "ddp-ref-sync"],
)
def test_two_gloo_ranks_equal_one_process(tmp_path, base_overrides, parity_reward, extra):
    # Clip-Cov (the default) draws its tokens among each rank's rows, not in one draw: off, so the ranks compute one loss
    overrides = base_overrides + ["algo.clip_cov_ratio=0"] + [x.format(parity=parity_reward) for x in extra]
    t0 = time.time()
    one = _launch(1, tmp_path / "one.pt", 2, overrides)
    two = _launch(2, tmp_path / "two.pt", 2, overrides)
    for rc, out in _wait(one + two):
        assert rc == 0, out[-3000:]
    a, b = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    import rlvr

    assert a["rlvr_file"] == b["rlvr_file"] == rlvr.__file__  # the workers ran this checkout's rlvr
    assert b["sharded"] == ("dist.strategy=fsdp" in extra) and not a["sharded"]
    assert (a["strategy"], b["strategy"]) == ("none", "fsdp" if "dist.strategy=fsdp" in extra else "ddp")  # as the job was joined
    if "algo.dynamic_sampling=true" in extra:  # the uneven splits really happened
        assert any(m["sampling/prompts_consumed"] % 2 for m in b["metrics"]), b["metrics"]
    for step in range(2):
        assert abs(a["loss"][step] - b["loss"][step]) < 1e-5, (a["loss"], b["loss"])
        assert a["metrics"][step]["grad_norm"] > 0  # a real update to compare
        assert _max_diff(a["grads"][step], b["grads"][step]) < 1e-5
        for key in ("reward", "entropy", "completions/mean_length", "clip_ratio/region_mean", "grad_norm"):
            assert abs(a["metrics"][step][key] - b["metrics"][step][key]) < 1e-5, key
    assert any(x != 0.0 for x in a["loss"])  # (GRPO's loss can be exactly 0 at ratio 1: zero-mean advantages)
    # the weights after two AdamW steps: an element whose gradient is near Adam's eps turns a rounding-level gradient
    # difference (the ranks' products run at other row counts; on an Intel Xeon MKL's sums then round differently) into
    # up to a share of lr (1e-3); a wrong update would move most elements by about lr
    diffs = torch.cat([(a["weights"][k] - b["weights"][k]).abs().flatten() for k in a["weights"]])
    assert float(diffs.max()) < 1e-4 and float((diffs > 1e-6).float().mean()) < 1e-3, (float(diffs.max()), int((diffs > 1e-6).sum()))
    print(
        f"2 ranks vs 1 ({' '.join(extra)}): loss diff {max(abs(x - y) for x, y in zip(a['loss'], b['loss'])):.2e}, "
        f"grad diff {max(_max_diff(g, h) for g, h in zip(a['grads'], b['grads'])):.2e}, "
        f"weight diff {_max_diff(a['weights'], b['weights']):.2e}, {time.time() - t0:.0f}s"
    )


def test_dead_rank_stops_the_other_with_a_clear_error(tmp_path, base_overrides):
    t0 = time.time()
    procs = _launch(2, tmp_path / "x.pt", 3, base_overrides + ["dist.timeout=20"], {"RLVR_TEST_DIE": "1:2"})
    (rc0, out0), (rc1, _) = _wait(procs, timeout=90)
    assert rc1 == -9  # SIGKILLed inside step 2's update
    assert rc0 != 0, out0[-2000:]
    assert "DistError" in out0 and "rank(s) [1] stopped responding" in out0, out0[-2000:]
    assert time.time() - t0 < 60


def test_batch_split_refusals_name_the_setting():
    with pytest.raises(
        ConfigError, match=r"rollout.prompts_per_step`=6 does not split over 4 ranks.*multiple of 4 \(e.g. 8\), or nproc to 3"
    ):
        check_config(load_config(None, ["nproc=4", "rollout.prompts_per_step=6"]))
    # a micro-batch larger than a rank's completions is all of them in one pass, with a note
    assert (
        "optim.micro_batch_size=40 is larger than the 32 completions per rank (8 prompts x 8 completions / 2 ranks): "
        "each update runs them as one micro-batch"
    ) in check_config(load_config(None, ["nproc=2", "rollout.prompts_per_step=8", "optim.micro_batch_size=40"]))
    assert not any(
        "micro_batch_size" in w
        for w in check_config(load_config(None, ["nproc=2", "rollout.prompts_per_step=8", "optim.micro_batch_size=32"]))
    )


def test_batch_plan_printed(make_trainer):
    t = make_trainer("rollout.group_size=8", "rollout.prompts_per_step=4", "optim.micro_batch_size=8", "model.gradient_checkpointing=true")
    text = t.plan.describe()
    assert "4 prompts x 8 completions = 32 completions per step" in text
    assert "micro-batch 8 completions -> at most 4 forward/backward pass(es) per rank per update" in text
    assert "weights" in text and "optimizer" in text and "activations" in text and "gradient checkpointing on" in text
    assert getattr(t.model, "is_activation_checkpointing", None) or t.model.is_gradient_checkpointing


def test_nproc_launches_through_torchrun(tmp_path, base_overrides, rlvr_cli):
    out = tmp_path / "run"
    proc = rlvr_cli(
        "train",
        "nproc=2",
        "steps=2",
        "eval_before_after=false",
        "save_every=1",
        f"output_dir={out}",
        *base_overrides,
        env={"OMP_NUM_THREADS": "1"},
        check=True,
    )
    assert "2 ranks (ddp): 2 prompts, 8 completions per rank" in proc.stdout
    assert proc.stdout.count("step 2/2") == 1  # only rank 0 logs
    assert (out / "final" / "model.safetensors").exists() and (out / "checkpoints" / "step-0000001").exists()
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_nproc_fsdp_end_to_end(tmp_path, base_overrides, tiny_model_dir, rlvr_cli, lora):
    """`rlvr train nproc=2 dist.strategy=fsdp` on CPU/gloo: held-out eval before and after (rank 0
    generates while the other rank helped gather the weights), and final/ loads: a plain model
    with the same tensors as the starting one (tied embeddings written once), or the adapter."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    out = tmp_path / "run"
    proc = rlvr_cli(
        "train",
        "nproc=2",
        "dist.strategy=fsdp",
        "steps=2",
        "save_every=1",
        "eval_before_after=true",
        "data.eval_size=8",
        f"output_dir={out}",
        *base_overrides,
        *(["model.lora.r=4"] if lora else []),
        env={"OMP_NUM_THREADS": "1"},
        check=True,
    )
    assert "2 ranks (fsdp): 2 prompts, 8 completions per rank" in proc.stdout
    assert "held-out accuracy before training" in proc.stdout and "held-out accuracy after training" in proc.stdout
    ckpt = latest_checkpoint(out / "checkpoints")  # save_every=1 after step 1, then the end (step 2), whole, as final/ is
    assert ckpt is not None and ckpt.name == "step-0000002" and (out / "checkpoints" / "step-0000001" / "COMPLETE").exists()
    assert (ckpt / ("adapter_model.safetensors" if lora else "model.safetensors")).exists()
    if lora:
        from peft import PeftModel

        adapter = load_file(out / "final" / "adapter_model.safetensors")
        assert adapter and any("lora_B" in k and adapter[k].abs().max() > 0 for k in adapter)  # saved, and trained (B starts at 0)
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), out / "final")
        loaded = {k.replace(".default", ""): v for k, v in model.state_dict().items() if "lora_" in k}
        assert loaded.keys() == adapter.keys() and all(torch.equal(loaded[k], adapter[k]) for k in adapter)
        return
    saved, start = load_file(out / "final" / "model.safetensors"), load_file(Path(tiny_model_dir) / "model.safetensors")
    assert saved.keys() == start.keys()
    assert max(float((saved[k] - start[k]).abs().max()) for k in start) > 0  # trained
    model, info = AutoModelForCausalLM.from_pretrained(out / "final", output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    assert all(torch.equal(model.state_dict()[k], saved[k]) for k in saved)


# Checkpoints under FSDP2 are written unsharded, exactly as one process writes them (model
# safetensors + trainer_state.pt with the optimizer state numbered in optimizer order), so any
# strategy resumes any other's. Reference: one process running 4 steps straight (the FSDP2 ranks
# equal it to 1e-5, test above), which also writes a checkpoint after step 2.
CKPT = ["dist.strategy=fsdp", "optim.micro_batch_size=4", "algo.beta=0.04", "steps=4"]


def _run_ok(procs) -> None:
    for rc, out in _wait(procs):
        assert rc == 0, out[-3000:]


@pytest.fixture(scope="module", params=[False, True], ids=["full", "lora"])
def checkpoints(request, tmp_path_factory, base_overrides):
    """(overrides, the one-process record, its output_dir, the FSDP run's output_dir): one process
    4 steps saving after step 2, and 2 FSDP2 ranks 2 steps saving after step 2, side by side."""
    tmp = tmp_path_factory.mktemp("ckpt")
    overrides = base_overrides + CKPT + (["model.lora.r=4"] if request.param else [])
    save = {"RLVR_TEST_SAVE_AFTER": "2"}
    _run_ok(
        _launch(1, tmp / "one.pt", 4, overrides + [f"output_dir={tmp / 'one'}"], save)
        + _launch(2, tmp / "fsdp.pt", 2, overrides + [f"output_dir={tmp / 'fsdp'}"], save)
    )
    return overrides, torch.load(tmp / "one.pt"), tmp / "one", tmp / "fsdp"


def test_fsdp_checkpoint_is_what_one_process_writes(checkpoints):
    """Same files, same names, same optimizer layout; the values agree to 1e-5."""
    from safetensors.torch import load_file

    overrides, _, one, fsdp = checkpoints
    a, b = one / "checkpoints" / "step-0000002", fsdp / "checkpoints" / "step-0000002"
    files = sorted(p.name for p in a.iterdir())
    assert files == sorted(p.name for p in b.iterdir())
    assert ("adapter_model.safetensors" in files) == ("model.lora.r=4" in overrides)
    for f in a.glob("*.safetensors"):
        wa, wb = load_file(f), load_file(b / f.name)
        assert wa.keys() == wb.keys() and _max_diff(wa, wb) < 1e-5
    sa, sb = (torch.load(p / "trainer_state.pt", weights_only=False) for p in (a, b))
    oa, ob = sa["optimizer"], sb["optimizer"]
    assert list(oa["state"]) == list(ob["state"]) and all(isinstance(k, int) for k in oa["state"])
    assert [g["params"] for g in oa["param_groups"]] == [g["params"] for g in ob["param_groups"]]
    for i in oa["state"]:
        assert oa["state"][i].keys() == ob["state"][i].keys()
        for key, v in oa["state"][i].items():
            assert v.shape == ob["state"][i][key].shape and float((v - ob["state"][i][key]).abs().max()) < 1e-5, (i, key)
    assert sa["step"] == sb["step"] == 2 and sa["data"] == sb["data"] and sa["scheduler"] == sb["scheduler"]


@pytest.mark.parametrize("source, world", [("fsdp", 2), ("fsdp", 1), ("one", 2)], ids=["fsdp-to-fsdp", "fsdp-to-one", "one-to-fsdp"])
def test_checkpoint_resumes_under_any_strategy(tmp_path, checkpoints, source, world):
    """resume=auto from a step-2 checkpoint, then steps 3-4: the same losses and final weights as
    the one process that ran 4 steps straight (1e-5), whoever wrote the checkpoint."""
    import shutil

    overrides, straight, one, fsdp = checkpoints
    out = tmp_path / "run"
    shutil.copytree(one if source == "one" else fsdp, out)
    t0 = time.time()
    _run_ok(_launch(world, tmp_path / "resumed.pt", 2, overrides + [f"output_dir={out}", "resume=auto"]))
    r = torch.load(tmp_path / "resumed.pt")
    assert r["start_step"] == 2 and r["sharded"] == (world == 2)
    loss_diff = max(abs(x - y) for x, y in zip(straight["loss"][2:], r["loss"]))
    weight_diff = _max_diff(straight["weights"], r["weights"])
    assert loss_diff < 1e-5 and weight_diff < 1e-5, (straight["loss"], r["loss"], weight_diff)
    assert any(m["grad_norm"] > 0 for m in r["metrics"])  # real updates after the resume
    print(
        f"{source} checkpoint resumed by {world} process(es): loss diff {loss_diff:.2e}, weight diff {weight_diff:.2e}, "
        f"{time.time() - t0:.0f}s"
    )


def test_fsdp_sigterm_saves_a_checkpoint_and_exits_zero(tmp_path, base_overrides, rlvr_cli):
    """SIGTERM to both FSDP2 ranks of `rlvr train`: they finish the step together, gather and write a
    checkpoint of the step they stopped at (the one a plain resume=auto continues from), exit 0."""
    import signal

    out, port = tmp_path / "run", _free_port()
    args = [
        "train",
        "nproc=2",
        "dist.strategy=fsdp",
        "steps=100000",
        "save_every=0",
        "eval_before_after=false",
        f"output_dir={out}",
        *base_overrides,
    ]
    procs = [rlvr_cli.popen(*args, env={"OMP_NUM_THREADS": "1", **_rank_env(rank, 2, port)}, stderr=subprocess.STDOUT) for rank in range(2)]
    metrics, deadline = out / "metrics.jsonl", time.time() + 90
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 1):
        time.sleep(0.1)
    for p in procs:
        p.send_signal(signal.SIGTERM)
    results = _wait(procs, timeout=90)
    for rc, o in results:
        assert rc == 0, o[-3000:]
    assert "stopped by SIGTERM" in results[0][1] and "Resume with: rlvr train --resume" in results[0][1]
    steps = len(metrics.read_text().splitlines())
    ckpt = latest_checkpoint(out / "checkpoints")
    assert ckpt is not None and ckpt.name == f"step-{steps:07d}" and (ckpt / "model.safetensors").exists()
    assert torch.load(ckpt / "trainer_state.pt", weights_only=False)["step"] == steps
