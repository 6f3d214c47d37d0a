"""TRL 1.16's loss types beyond the clipped one (cispo, sapo, vespo, luspo), off-policy sequence
masking, the KL bias correction and the entropy bonus, three ways:

1. against a reference written here as plain Python loops (scalar ops, floats for the detached
   weights), float64, ragged random inputs, token and sequence level: loss and the gradients with
   respect to the log-probs and the entropies to 1e-10, for every loss type and feature;
2. micro-batches of any rows give the full batch's loss and gradients exactly;
3. against TRL's own formulas, transcribed line by line from trl 1.16.0
   trainer/grpo_trainer.py `_compute_loss` (one micro-batch, one process, no accumulation).
Hand-checked properties (gradients at ratio 1, what the KL correction does in expectation) close it.
"""

import math
import random

import numpy as np
import pytest
import torch

from rlvr import algo
from rlvr.algo import BatchNorms, policy_loss

D = torch.float64
TOL = dict(rtol=0, atol=1e-10)
SEEDS = [0, 1, 2]
ALL_LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "vespo", "luspo"]
NEW_LOSS_TYPES = ["cispo", "sapo", "vespo", "luspo"]
LEVELS = ["token", "sequence"]
OPSM = 0.1  # threshold on the mean drift; ragged() draws rows on both sides of it


def ragged(seed):
    """Random float64 inputs with ragged rows, garbage in the padding, an empty row on even seeds and
    a row with advantage exactly 0; per-row sampler offsets put OPSM's drift on both sides of OPSM."""
    rnd = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    N, L = rnd.randint(5, 8), rnd.randint(3, 9)
    lengths = [rnd.randint(1, L) for _ in range(N)]
    if seed % 2 == 0:
        lengths[rnd.randrange(N)] = 0
    mask = torch.zeros(N, L, dtype=D)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    logp = -3 * torch.rand(N, L, generator=g, dtype=D)
    old = logp + 0.3 * torch.randn(N, L, generator=g, dtype=D)
    ref = logp + 0.5 * torch.randn(N, L, generator=g, dtype=D)
    sampling = logp + 0.6 * (torch.rand(N, 1, generator=g, dtype=D) - 0.5) + 0.05 * torch.randn(N, L, generator=g, dtype=D)
    if seed == 1:
        sampling[0, 0] = float("nan")  # a token the sampler could not score: no evidence of drift
    adv = torch.randn(N, generator=g, dtype=D)
    adv[rnd.randrange(N)] = 0.0
    weights = (torch.rand(N, L, generator=g, dtype=D) > 0.4).to(D)  # a token selection, as top-entropy makes
    sampler = 0.5 + 1.5 * torch.rand(N, L, generator=g, dtype=D)  # sampler-correction weights
    entropy = 2 * torch.rand(N, L, generator=g, dtype=D)
    max_len = L + rnd.randint(0, 3)
    return dict(
        logp=logp,
        old=old,
        ref=ref,
        sampling=sampling,
        adv=adv,
        mask=mask,
        weights=weights,
        sampler=sampler,
        entropy=entropy,
        max_len=max_len,
    )


# ---------------------------------------------------------------------------------------------
# the loop reference


def _sig(x):
    return 1 / (1 + torch.exp(-x))


def _clamp(x, lo, hi):
    return max(lo, min(hi, x))


def ref_loss(
    logp,
    entropy,
    x,
    *,
    loss_type,
    level,
    epsilon=0.2,
    epsilon_high=None,
    delta=None,
    tau_pos=1.0,
    tau_neg=1.05,
    k_pos=2.0,
    lam_pos=3.0,
    k_neg=3.0,
    lam_neg=2.0,
    beta=0.0,
    kl_bias=False,
    weights=False,
    sampler=False,
    opsm=None,
    entropy_coef=0.0,
    num_micro=1,
):
    """TRL's loss of one micro-batch, one row and one token at a time. logp, entropy: leaf tensors; the rest lists."""
    old, adv, mask, ref, samp = (x[k].tolist() for k in ("old", "adv", "mask", "ref", "sampling"))
    w = x["weights"].tolist() if weights else None
    s = x["sampler"].tolist() if sampler else None
    eps_high = epsilon if epsilon_high is None else epsilon_high
    N, L = len(mask), len(mask[0])
    rows, counts = [], []
    for i in range(N):
        toks = [t for t in range(L) if mask[i][t] == 1.0]
        n = len(toks)
        seq_lr = sum((logp[i, t] - old[i][t] for t in toks), torch.zeros((), dtype=D)) / max(n, 1)
        keep = 1.0
        if opsm is not None:
            drift = sum(0.0 if math.isnan(samp[i][t]) else samp[i][t] - logp[i, t].item() for t in toks) / max(n, 1)
            keep = 1.0 if (adv[i] >= 0 or drift <= opsm) else 0.0
        if loss_type == "vespo":
            log_w = sum(_clamp(logp[i, t].item() - old[i][t], -20.0, 20.0) for t in toks)
            if s is not None:
                log_w += sum(_clamp(math.log(s[i][t]), math.log(1e-8), 20.0) for t in toks)
            log_w = _clamp(log_w, math.log(1e-8), 20.0)
            k, lam = (k_pos, lam_pos) if adv[i] >= 0 else (k_neg, lam_neg)
            phi = math.exp(lam + k * log_w - lam * math.exp(log_w))
        row = torch.zeros((), dtype=D)
        for t in toks:
            lr = logp[i, t] - old[i][t] if level == "token" else seq_lr
            r = torch.exp(lr)
            if loss_type == "cispo":
                term = -min(r.item(), eps_high) * adv[i] * logp[i, t]
            elif loss_type == "sapo":
                tau = tau_pos if adv[i] > 0 else tau_neg
                term = -(4 / tau) * _sig(tau * (r - 1)) * adv[i]
            elif loss_type == "vespo":
                term = -phi * adv[i] * logp[i, t]
            else:
                rv = r.item()
                rc = 1 - epsilon if rv < 1 - epsilon else (1 + eps_high if rv > 1 + eps_high else r)
                capped = delta if (delta is not None and rv > delta) else r
                a, b = capped * adv[i], rc * adv[i]
                a_val, b_val = (v.item() if torch.is_tensor(v) else v for v in (a, b))
                term = -(a if a_val <= b_val else b)
            term = term * keep
            if w is not None:
                term = term * w[i][t]
            if s is not None and loss_type != "vespo":
                term = term * s[i][t]
            if beta:
                lk = ref[i][t] - logp[i, t]
                kl = torch.exp(lk) - lk - 1
                term = term + beta * (kl * r if kl_bias else kl)
            row = row + term
        rows.append(row)
        counts.append(n)
    n_seq, n_tok = N, int(x["mask"].sum())
    aggregation = algo.LOSS_TYPES[loss_type].aggregation
    if aggregation == "grpo":
        loss = sum(r / c if c else r * 0 for r, c in zip(rows, counts)) / n_seq
    elif aggregation == "bnpo":
        loss = sum(rows) / max(sum(counts), 1) / num_micro
    elif aggregation == "dr_grpo":
        loss = sum(rows) / (n_seq * x["max_len"])
    elif aggregation == "dapo":
        loss = sum(rows) / n_tok
    else:  # luspo: per-completion sum, mean over completions
        loss = sum(rows) / n_seq
    if entropy_coef:
        total, n_kept = torch.zeros((), dtype=D), 0
        for i in range(N):
            for t in range(L):
                if mask[i][t] == 1.0 and (w is None or w[i][t] == 1.0):
                    total = total + entropy[i, t]
                    n_kept += 1
        loss = loss - entropy_coef * total / n_kept
    return loss


SETUPS = {
    "plain": dict(),
    "kl": dict(beta=0.04),
    "kl_bias_correction": dict(beta=0.04, kl_bias=True),
    "opsm": dict(opsm=OPSM),
    "entropy_bonus": dict(entropy_coef=0.01),
    "entropy_bonus_top_tokens": dict(entropy_coef=0.01, weights=True),
    "sampler_weights": dict(sampler=True),
    "everything": dict(beta=0.04, kl_bias=True, opsm=OPSM, entropy_coef=0.01, weights=True, sampler=True, delta=1.3),
}


def lib_loss(
    x,
    rows=None,
    cols=None,
    num_micro=1,
    *,
    loss_type,
    level,
    epsilon=0.2,
    epsilon_high=None,
    delta=None,
    beta=0.0,
    kl_bias=False,
    weights=False,
    sampler=False,
    opsm=None,
    entropy_coef=0.0,
    logp=None,
    entropy=None,
):
    """policy_loss on rows (all by default) and the first `cols` columns, with whole-batch norms."""
    rows = torch.arange(x["mask"].shape[0]) if rows is None else torch.as_tensor(rows)
    c = slice(None, cols)
    sub = lambda k: x[k][rows, c]  # noqa: E731
    m = x["mask"]
    kept = m * x["weights"] if weights else m
    norms = BatchNorms(
        num_sequences=m.shape[0],
        num_tokens=int(m.sum()),
        max_completion_length=x["max_len"],
        num_micro_batches=num_micro,
        num_entropy_tokens=int(kept.sum()) if weights else None,
    )
    return policy_loss(
        logp[rows, c],
        sub("old"),
        x["adv"][rows],
        sub("mask"),
        norms,
        loss_type=loss_type,
        importance_level=level,
        epsilon=epsilon,
        epsilon_high=epsilon_high,
        delta=delta,
        beta=beta,
        ref_logp=sub("ref") if beta else None,
        kl_bias_correction=kl_bias,
        token_weights=sub("weights") if weights else None,
        sampler_weights=sub("sampler") if sampler else None,
        off_policy_mask_threshold=opsm,
        sampling_logp=sub("sampling"),
        entropy=entropy[rows, c],
        entropy_coef=entropy_coef,
    )


def _eps_high(loss_type):
    return 1.2 if loss_type == "cispo" else 0.28  # cispo: the cap itself, low enough that some weights are capped


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("setup", list(SETUPS))
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("loss_type", ALL_LOSS_TYPES)
def test_loss_and_gradients_match_the_loop_reference(loss_type, level, setup, seed):
    x = ragged(seed)
    kw = dict(SETUPS[setup], loss_type=loss_type, level=level, epsilon_high=_eps_high(loss_type))
    lp, ent = x["logp"].clone().requires_grad_(True), x["entropy"].clone().requires_grad_(True)
    out = lib_loss(x, logp=lp, entropy=ent, **kw)
    out.loss.backward()
    lp_ref, ent_ref = x["logp"].clone().requires_grad_(True), x["entropy"].clone().requires_grad_(True)
    loss = ref_loss(lp_ref, ent_ref, x, **kw)
    loss.backward()
    torch.testing.assert_close(out.loss.detach(), loss.detach(), **TOL)
    torch.testing.assert_close(lp.grad, lp_ref.grad, **TOL)
    if kw.get("entropy_coef"):
        torch.testing.assert_close(ent.grad, ent_ref.grad, **TOL)
        assert ent.grad.abs().max() > 0
    else:
        assert ent.grad is None or ent.grad.abs().max() == 0
    assert lp.grad.abs().max() > 1e-4  # the case is not degenerate


def test_the_random_cases_exercise_every_branch():
    """OPSM drops some negative rows and keeps others, cispo caps some weights, vespo's weights vary."""
    dropped = kept_negative = capped = 0
    phis = []
    for seed in SEEDS:
        x = ragged(seed)
        m = algo.off_policy_sequence_mask(x["adv"], x["logp"], x["sampling"], x["mask"], OPSM).squeeze(-1)
        neg = (x["adv"] < 0) & (x["mask"].sum(-1) > 0)
        dropped += int((m[neg] == 0).sum())
        kept_negative += int((m[neg] == 1).sum())
        assert bool((m[x["adv"] >= 0] == 1).all())
        capped += int(((x["logp"] - x["old"]).exp()[x["mask"].bool()] > 1.2).sum())
        phis.append(
            algo.objectives.vespo_weight(
                x["logp"], x["old"], x["adv"], x["mask"], None, vespo_k_pos=2.0, vespo_lambda_pos=3.0, vespo_k_neg=3.0, vespo_lambda_neg=2.0
            )
        )
    assert dropped >= 2 and kept_negative >= 2 and capped >= 3
    phi = torch.cat(phis)
    assert phi.min() < 0.8 and phi.max() > 0.95 and phi.std() > 0.05


# ---------------------------------------------------------------------------------------------
# micro-batches


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("loss_type", NEW_LOSS_TYPES + ["dapo", "grpo"])
def test_micro_batches_of_any_rows_give_the_full_batch_loss_exactly(loss_type, level, seed):
    """With every feature on: the entropy bonus and OPSM are per-row over whole-batch normalisers too."""
    x = ragged(seed)
    N = x["mask"].shape[0]
    kw = dict(SETUPS["everything"], loss_type=loss_type, level=level, epsilon_high=_eps_high(loss_type))
    assert algo.rows_can_be_regrouped(loss_type)

    def accumulate(chunks):
        lp, ent = x["logp"].clone().requires_grad_(True), x["entropy"].clone().requires_grad_(True)
        total = 0.0
        for rows in chunks:
            cols = max(int(x["mask"][torch.as_tensor(rows)].sum(-1).max()), 1)  # trimmed to its longest row, as the trainer
            out = lib_loss(x, rows, cols, len(chunks), logp=lp, entropy=ent, **kw)
            out.loss.backward()
            total += out.loss.item()
        return total, lp.grad, ent.grad

    full = accumulate([range(N)])
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(seed)).tolist()
    for chunks in ([[0], range(1, N)], [[i] for i in range(N)], [perm[: N // 2], perm[N // 2 :]]):
        loss, g_lp, g_ent = accumulate(chunks)
        assert loss == pytest.approx(full[0], abs=1e-12)
        torch.testing.assert_close(g_lp, full[1], **TOL)
        torch.testing.assert_close(g_ent, full[2], **TOL)


# ---------------------------------------------------------------------------------------------
# TRL's formulas, transcribed from trl 1.16.0 trainer/grpo_trainer.py (GRPOTrainer._compute_loss,
# get_off_policy_mask, get_gamma_weights): one micro-batch, one process, no accumulation
# (current_gradient_accumulation_steps = steps_per_generation = num_processes = 1, num_items_in_batch =
# mask.sum()), old log-probs given, no top-entropy mask; `inputs["importance_sampling_ratio"]` = sampler.


def trl_loss(
    per_token_logps,
    entropies,
    x,
    *,
    loss_type,
    importance_sampling_level,
    epsilon,
    epsilon_high,
    delta=None,
    sapo_temperature_pos=1.0,
    sapo_temperature_neg=1.05,
    beta=0.0,
    use_bias_correction_kl=False,
    off_policy_mask_threshold=None,
    importance_sampling_ratio=None,
    entropy_coef=0.0,
):
    mask = x["mask"]
    advantages = x["adv"].unsqueeze(1)
    old_per_token_logps = x["old"]
    epsilon_low = epsilon
    if off_policy_mask_threshold is not None:  # get_off_policy_mask
        kl_div = torch.nan_to_num(x["sampling"] - per_token_logps.detach(), nan=0.0)
        avg_seq_kl = (kl_div * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
        off_policy_mask = ((advantages >= 0) | (avg_seq_kl <= off_policy_mask_threshold)).to(dtype=mask.dtype)
    log_ratio = per_token_logps - old_per_token_logps
    if importance_sampling_level == "token":
        log_importance_weights = log_ratio
    else:
        log_importance_weights = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(log_importance_weights)
    if beta != 0.0:
        ref = x["ref"]
        per_token_kl = torch.exp(ref - per_token_logps) - (ref - per_token_logps) - 1
        if use_bias_correction_kl:
            per_token_kl = per_token_kl * coef_1
    if loss_type == "cispo":
        clamped_ratios = torch.clamp(coef_1, max=epsilon_high).detach()
        per_token_loss = -clamped_ratios * advantages * per_token_logps
    elif loss_type in ["grpo", "bnpo", "dr_grpo", "dapo", "luspo"]:
        coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
        if delta is not None:
            coef_1 = torch.clamp(coef_1, max=delta)
        per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    elif loss_type == "sapo":
        temperatures = torch.where(advantages > 0, sapo_temperature_pos, sapo_temperature_neg)
        soft_coef_1 = torch.sigmoid(temperatures * (coef_1 - 1)) * 4 / temperatures
        per_token_loss = -soft_coef_1 * advantages
    elif loss_type == "vespo":
        with torch.no_grad():  # get_gamma_weights (k_pos=2, lambda_pos=3, k_neg=3, lambda_neg=2: TRL's defaults)
            lower_clamp = math.log(1e-8)
            seq_log_ratio = torch.sum(torch.clamp(log_ratio, -20.0, 20.0) * mask, dim=-1, keepdim=True)
            if importance_sampling_ratio is not None:
                seq_log_ratio += torch.sum(torch.clamp(torch.log(importance_sampling_ratio), lower_clamp, 20.0), dim=-1, keepdim=True)
            log_w_seq = torch.clamp(seq_log_ratio, lower_clamp, 20.0)
            w_seq = torch.exp(log_w_seq)
            is_nonneg_adv = advantages >= 0
            k_seq = torch.where(is_nonneg_adv, 2.0, 3.0)
            lambda_seq = torch.where(is_nonneg_adv, 3.0, 2.0).clamp(min=1e-4)
            phi_seq = torch.exp(lambda_seq + k_seq * log_w_seq - lambda_seq * w_seq).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
        per_token_loss = -phi_seq * advantages * per_token_logps
    if off_policy_mask_threshold is not None:
        per_token_loss = per_token_loss * off_policy_mask
    if importance_sampling_ratio is not None and loss_type != "vespo":
        per_token_loss = per_token_loss * importance_sampling_ratio
    if beta != 0.0:
        per_token_loss = per_token_loss + beta * per_token_kl
    if loss_type in ["grpo", "sapo"]:
        loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif loss_type == "bnpo":
        loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    elif loss_type == "dr_grpo":
        loss = (per_token_loss * mask).sum() / (per_token_loss.size(0) * x["max_len"])
    elif loss_type in ["cispo", "dapo", "vespo"]:
        loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    elif loss_type == "luspo":
        loss = (per_token_loss * mask).sum(-1).mean()
    if entropy_coef:
        loss = loss - entropy_coef * ((entropies * mask).sum() / mask.sum().clamp(min=1.0))
    return loss


TRL_CASES = {
    "cispo": dict(epsilon_high=1.2),
    "sapo": dict(sapo_temperature_pos=1.0, sapo_temperature_neg=1.25),  # float32-exact temperatures: see below
    "vespo": dict(),
    "vespo_with_sampler_weights": dict(importance_sampling_ratio=True),
    "luspo": dict(),
    "opsm": dict(off_policy_mask_threshold=OPSM),
    "kl_bias_correction": dict(beta=0.04, use_bias_correction_kl=True),
    "entropy_coef": dict(entropy_coef=0.01),
    "sampler_weights": dict(importance_sampling_ratio=True),
}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("case", list(TRL_CASES))
def test_trl_formulas_are_reproduced(case, level, seed):
    """rlvr's policy_loss (loss_type, algo.* settings) equals TRL 1.16.0's _compute_loss on one micro-batch:

    cispo   -clamp(coef_1, max=epsilon_high).detach() * A * logp, token mean over the batch
    sapo    -sigmoid(tau * (coef_1 - 1)) * 4 / tau * A, tau = where(A > 0, tau_pos, tau_neg), per-sequence mean
    vespo   -phi_seq * A * logp, phi_seq = get_gamma_weights(...) (sampler IS ratio folded in), token mean
    luspo   clipped objective, (per_token_loss * mask).sum(-1).mean()
    opsm    per_token_loss * get_off_policy_mask(...), the sampler's log-probs against the current ones
    kl      per_token_kl * coef_1 when use_bias_correction_kl
    entropy loss - entropy_coef * (entropies * mask).sum() / mask.sum()
    """
    x = ragged(seed)
    kw = dict(TRL_CASES[case])
    loss_type = case.split("_")[0] if case.split("_")[0] in algo.LOSS_TYPES else "dapo"
    kw.setdefault("epsilon_high", 0.28)
    ours = dict(
        loss_type=loss_type,
        importance_level=level,
        epsilon=0.2,
        epsilon_high=kw["epsilon_high"],
        beta=kw.get("beta", 0.0),
        ref_logp=x["ref"],
        kl_bias_correction=kw.get("use_bias_correction_kl", False),
        off_policy_mask_threshold=kw.get("off_policy_mask_threshold"),
        sampling_logp=x["sampling"],
        sampler_weights=x["sampler"] * x["mask"] if kw.get("importance_sampling_ratio") else None,
        entropy_coef=kw.get("entropy_coef", 0.0),
        sapo_temperature_pos=kw.get("sapo_temperature_pos", 1.0),
        sapo_temperature_neg=kw.get("sapo_temperature_neg", 1.05),
    )
    if kw.get("importance_sampling_ratio"):  # TRL's ratio is exp((old - sampling) * mask): exactly 1 off the mask
        kw["importance_sampling_ratio"] = torch.where(x["mask"].bool(), x["sampler"], torch.ones_like(x["sampler"]))
    m = x["mask"]
    norms = BatchNorms(num_sequences=m.shape[0], num_tokens=int(m.sum()), max_completion_length=x["max_len"])
    lp, ent = x["logp"].clone().requires_grad_(True), x["entropy"].clone().requires_grad_(True)
    out = policy_loss(lp, x["old"], x["adv"], m, norms, entropy=ent, **ours)
    out.loss.backward()
    lp_t, ent_t = x["logp"].clone().requires_grad_(True), x["entropy"].clone().requires_grad_(True)
    trl = trl_loss(lp_t, ent_t, x, loss_type=loss_type, importance_sampling_level=level, epsilon=0.2, **kw)
    trl.backward()
    torch.testing.assert_close(out.loss.detach(), trl.detach(), **TOL)
    torch.testing.assert_close(lp.grad, lp_t.grad, **TOL)
    if kw.get("entropy_coef"):
        torch.testing.assert_close(ent.grad, ent_t.grad, **TOL)


def test_trl_forms_the_sapo_temperatures_in_float32():
    """torch.where(cond, 1.0, 1.05) is float32 even for float64 inputs, so in float64 TRL's sapo uses
    float32(1.05) = 1.0499999523; rlvr keeps the inputs' dtype. With that value rlvr agrees to 1e-10;
    with the exact 1.05 the two differ by ~1e-8: the only gap, and it vanishes in float32 training."""
    x = ragged(0)
    m = x["mask"]
    norms = BatchNorms(num_sequences=m.shape[0], num_tokens=int(m.sum()), max_completion_length=x["max_len"])
    old = x["logp"] + 0.5 * (x["old"] - x["logp"])
    x = dict(x, old=old)
    trl = trl_loss(x["logp"], None, x, loss_type="sapo", importance_sampling_level="token", epsilon=0.2, epsilon_high=0.2)
    f32 = float(np.float32(1.05))
    ours = {t: policy_loss(x["logp"], old, x["adv"], m, norms, loss_type="sapo", sapo_temperature_neg=t).loss.item() for t in (1.05, f32)}
    assert ours[f32] == pytest.approx(trl.item(), abs=1e-12)
    assert 1e-10 < abs(ours[1.05] - trl.item()) < 1e-7


# ---------------------------------------------------------------------------------------------
# properties by hand


def _rows(ratios, advs, n_tokens=1):
    old = torch.zeros(len(ratios), n_tokens, dtype=D)
    lp = torch.log(torch.tensor(ratios, dtype=D))[:, None].expand(-1, n_tokens).clone().requires_grad_(True)
    mask = torch.ones(len(ratios), n_tokens, dtype=D)
    return lp, old, torch.tensor(advs, dtype=D), mask, BatchNorms(len(ratios), len(ratios) * n_tokens, n_tokens)


def test_cispo_keeps_every_token_s_gradient_with_a_capped_detached_weight():
    # PPO's clip would zero the first (A > 0, r = 3 > 1 + eps) and third (A < 0, r = 0.5 < 1 - eps) gradients.
    lp, old, adv, mask, norms = _rows([3.0, 1.1, 0.5], [1.0, 1.0, -2.0])
    out = policy_loss(lp, old, adv, mask, norms, loss_type="cispo", epsilon_high=2.0)
    out.loss.backward()
    # d/dlogp of -sg(min(r, 2)) A logp = -min(r, 2) A, over 3 tokens
    torch.testing.assert_close(lp.grad[:, 0], torch.tensor([-2.0, -1.1, 1.0], dtype=D) / 3, **TOL)
    assert out.high_clipped.item() == pytest.approx(1 / 3) and out.low_clipped.item() == 0.0


@pytest.mark.parametrize("loss_type", ["sapo", "vespo", "cispo", "luspo"])
def test_at_ratio_one_the_gradient_is_the_advantage_weighted_log_likelihood(loss_type):
    """The first pass of every step (r = 1): sapo's gate has slope 4 s (1 - s) = 1 at r = 1 for any
    temperature, vespo's phi(1) = e^lam e^-lam = 1, cispo's weight is 1: all reduce to -A grad logp."""
    g = torch.Generator().manual_seed(3)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=D)
    logp = (-3 * torch.rand(3, 4, generator=g, dtype=D)).requires_grad_(True)
    adv = torch.tensor([1.5, -0.5, 2.0], dtype=D)
    norms = BatchNorms(3, int(mask.sum()), 4)
    out = policy_loss(logp, logp.detach(), adv, mask, norms, loss_type=loss_type, epsilon_high=5.0, sapo_temperature_neg=3.0)
    out.loss.backward()
    n = mask.sum(-1, keepdim=True)
    weight = {"sapo": 1 / (3 * n), "luspo": torch.full_like(n, 1 / 3)}.get(loss_type, torch.full_like(n, 1 / mask.sum()))
    torch.testing.assert_close(logp.grad, -adv[:, None] * weight * mask, **TOL)


def test_sapo_gate_is_soft_and_faster_for_negative_advantages():
    ratios = [0.5, 0.9, 1.0, 1.1, 2.0]
    grads = {}
    for sign, tau_neg in [(1.0, 1.05), (-1.0, 1.05), (-1.0, 3.0)]:
        lp, old, adv, mask, norms = _rows(ratios, [sign] * 5)
        policy_loss(lp, old, adv, mask, norms, loss_type="sapo", sapo_temperature_neg=tau_neg).loss.backward()
        grads[(sign, tau_neg)] = lp.grad[:, 0].abs() * 5  # per-token |dL/dlogp| = r * 4 s (1 - s) with s = sigmoid(tau (r - 1))
    for (sign, tau), g in grads.items():
        for j, r in enumerate(ratios):
            s = 1 / (1 + math.exp(-(1.0 if sign > 0 else tau) * (r - 1)))
            assert g[j].item() == pytest.approx(r * 4 * s * (1 - s), abs=1e-12)
    assert (grads[(-1.0, 3.0)][[0, 4]] < grads[(-1.0, 1.05)][[0, 4]]).all()  # a hotter gate fades faster off-policy
    assert (grads[(1.0, 1.05)] > 0).all()  # never exactly zero, unlike the hard clip


def test_luspo_weighs_each_completion_by_its_length():
    """Sequence-level ratios at r = 1: GSPO (grpo aggregation) gives every completion the same total
    weight; LUSPO scales completion i's by its length n_i (per-token gradient -A_i / N for every token)."""
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 1]], dtype=D)
    logp = torch.full((2, 4), -1.0, dtype=D, requires_grad=True)
    adv = torch.tensor([1.0, 1.0], dtype=D)
    norms = BatchNorms(2, 5, 4)
    policy_loss(logp, logp.detach(), adv, mask, norms, loss_type="luspo", importance_level="sequence").loss.backward()
    per_row = logp.grad.sum(-1)
    assert per_row.tolist() == pytest.approx([-0.5, -2.0], abs=1e-12)  # n_i * (-A_i / N)


def test_opsm_drops_only_drifted_completions_with_negative_advantage():
    logp = torch.zeros(4, 3, dtype=D)
    sampling = torch.tensor([[0.6, 0.6, 0.0], [0.6, 0.6, 0.0], [0.1, 0.1, 9.0], [float("nan"), 0.0, 0.0]], dtype=D)
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 1, 1]], dtype=D)
    adv = torch.tensor([-1.0, 1.0, -1.0, -1.0])
    keep = algo.off_policy_sequence_mask(adv, logp, sampling, mask, 0.3)
    # row 0: drift 0.4 > 0.3 and A < 0: dropped; row 1: A > 0: kept; row 2: 0.1 (the 9.0 is padding); row 3: NaN counts 0
    assert keep.squeeze(-1).tolist() == [0.0, 1.0, 1.0, 1.0]


def test_kl_bias_correction_turns_the_gradient_into_that_of_the_reverse_kl():
    """Enumerate a 6-token vocabulary, tokens from the policy p (on-policy, r = 1): the expected gradient
    of beta * r * k3 is exactly grad KL(p || ref) (DeepSeek-V3.2's unbiased estimator, TRL's default),
    while plain k3's expected gradient is grad KL(ref || p), the forward KL, which rlvr keeps by default."""
    g = torch.Generator().manual_seed(2)
    theta = torch.randn(6, generator=g, dtype=D, requires_grad=True)
    ref = torch.log_softmax(torch.randn(6, generator=g, dtype=D), 0)
    mask = torch.ones(6, 1, dtype=D)

    def expected_grad(correct):
        logp = torch.log_softmax(theta, 0)
        p = logp.exp().detach()
        per_token = [
            policy_loss(
                logp[j].view(1, 1),
                logp[j].detach().view(1, 1),
                torch.zeros(1, dtype=D),
                mask[:1],
                BatchNorms(1, 1, 1),
                beta=1.0,
                ref_logp=ref[j].view(1, 1),
                kl_bias_correction=correct,
            ).loss
            for j in range(6)
        ]
        return torch.autograd.grad(sum(p[j] * per_token[j] for j in range(6)), theta)[0]

    p = torch.softmax(theta, 0)
    reverse = torch.autograd.grad((p * (p.log() - ref)).sum(), theta)[0]
    forward = torch.autograd.grad((ref.exp() * (ref - torch.log_softmax(theta, 0))).sum(), theta)[0]
    torch.testing.assert_close(expected_grad(True), reverse, rtol=0, atol=1e-12)
    torch.testing.assert_close(expected_grad(False), forward, rtol=0, atol=1e-12)
    assert (reverse - forward).abs().max() > 1e-2


def test_entropy_with_grad_matches_finite_differences_and_the_bonus_raises_entropy():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 5, generator=g, dtype=D, requires_grad=True)
    ent = algo.token_entropy_with_grad(logits, chunk_rows=1)
    torch.testing.assert_close(ent.detach(), algo.token_entropy(logits.detach()), **TOL)
    (grad,) = torch.autograd.grad(ent.sum(), logits)
    h = 1e-6
    for idx in [(0, 0, 0), (1, 2, 4), (0, 1, 3)]:
        up, down = logits.detach().clone(), logits.detach().clone()
        up[idx] += h
        down[idx] -= h
        fd = (algo.token_entropy(up).sum() - algo.token_entropy(down).sum()).item() / (2 * h)
        assert grad[idx].item() == pytest.approx(fd, abs=1e-8)
    # the bonus alone (advantages 0): a gradient step on its loss raises the mean entropy
    mask = torch.ones(2, 3, dtype=D)
    idx = torch.zeros(2, 3, dtype=torch.long)
    lg = logits.detach().clone().requires_grad_(True)
    e = algo.token_entropy_with_grad(lg)
    lp = algo.selective_log_softmax(lg, idx)
    loss = policy_loss(lp, lp.detach(), torch.zeros(2, dtype=D), mask, BatchNorms(2, 6, 3), entropy=e, entropy_coef=0.1).loss
    (g_lg,) = torch.autograd.grad(loss, lg)
    assert algo.token_entropy(lg.detach() - 5.0 * g_lg).mean() > e.detach().mean() + 1e-3


def test_entropy_coef_without_entropy_and_opsm_without_sampler_log_probs_are_refused():
    x = torch.zeros(2, 3, dtype=D)
    n = BatchNorms(2, 6, 3)
    with pytest.raises(ValueError, match="entropy_coef"):
        policy_loss(x, x, torch.zeros(2, dtype=D), x + 1, n, entropy_coef=0.1)
    with pytest.raises(ValueError, match="sampling_logp"):
        policy_loss(x, x, torch.zeros(2, dtype=D), x + 1, n, off_policy_mask_threshold=0.5)
