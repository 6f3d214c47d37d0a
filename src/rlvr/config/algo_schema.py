"""The `algo` section of the configuration schema (rlvr.config.schema): the GRPO objective's settings, every field
with a docstring (shown by `rlvr train --help-config`; docs/algorithms.md has the formulas)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AlgoConfig:
    loss_type: str = "dapo"
    """The loss, as TRL's loss_type: the clipped objective aggregated as dapo (token mean over the batch), grpo,
    bnpo or dr_grpo; or cispo, sapo, vespo, luspo (each with TRL's aggregation). See docs/algorithms.md."""
    epsilon: float = 0.2
    """Clip range, low side (and high side unless epsilon_high is set)."""
    epsilon_high: float | None = None
    """Clip range, high side (DAPO clip-higher, e.g. 0.28). With loss_type=cispo: the cap of the importance weight itself (e.g. 5.0)."""
    delta: float | None = None
    """Optional upper bound on the ratio before the min (two-sided clipping, e.g. 4.0)."""
    importance_sampling_level: str = "token"
    """`token` ratios, or `sequence` (GSPO: one ratio per completion)."""
    num_iterations: int = 1
    """mu: optimisation passes over each batch of completions."""
    beta: float = 0.0
    """KL penalty coefficient; 0 loads no reference model at all."""
    ref_sync_steps: int = 0
    """Every N optimizer steps the reference moves toward the policy, ref = alpha x policy + (1 - alpha) x ref
    (TR-DPO's soft update; TRL's sync_ref_model with ref_model_sync_steps); saved with each checkpoint. 0: the
    reference stays the initial policy. Full fine-tunes only (with LoRA the reference is the base model itself)."""
    ref_sync_alpha: float = 0.6
    """alpha of that update (TRL's ref_model_mixup_alpha); 1 copies the policy."""
    kl_estimator: str = "k3"
    """KL estimator: k1, k2 or k3."""
    kl_bias_correction: bool = False
    """Multiply the KL term by the importance ratio (with its gradient): the unbiased gradient of KL(policy || ref)
    (DeepSeek-V3.2; TRL's use_bias_correction_kl, on there by default). Off: DeepSeekMath's plain k3 term."""
    scale_rewards: str = "group"
    """Advantage scaling: group (divide by the group's std), batch, or none."""
    std_ddof: int = 0
    """Degrees of freedom of that std: 0 (population, the seeds' table) or 1 (TRL's torch.std)."""
    std_eps: float = 1e-8
    """Added to that std before dividing: the seeds' 1e-8 (TRL adds 1e-4)."""
    reward_aggregation: str = "sum_then_normalize"
    """Several rewards: sum_then_normalize (weighted sum, then normalise) or normalize_then_sum."""
    mask_truncated_completions: bool = False
    """Leave completions that hit max_new_tokens without EOS out of the loss."""
    top_entropy_quantile: float = 1.0
    """Train only on this top share of tokens by entropy (1.0 = all tokens)."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose rewards are all equal and sample fresh prompts. `reward` and
    `frac_reward_zero_std` then count every group generated; the kept ones' are `sampling/kept_*`."""
    max_resample_rounds: int = 4
    """Dynamic sampling: most extra generation rounds per step before training on what there is."""
    sampler_correction: str = "auto"
    """Importance weights for the sampler and trainer computing slightly different probabilities, w = p_trainer /
    p_sampler: token_truncate (TIS: each token's w clamped to [min, cap]), token_mask (MIS: w outside [min, cap] set
    to 0), sequence_truncate / sequence_mask (the same with one weight per completion, the product of its tokens' w:
    TRL's default mode), none, or auto (token_truncate with the vllm engine, servers or rollout.max_staleness > 0;
    none with the in-process hf engine, whose sampler is the trained model itself)."""
    sampler_correction_cap: float = 3.0
    """The upper bound of those importance weights (TRL's vllm_importance_sampling_clip_max; .inf: none)."""
    sampler_correction_min: float | None = None
    """Their lower bound (TRL's vllm_importance_sampling_clip_min); null: none."""
    sapo_temperature_pos: float = 1.0
    """loss_type=sapo: temperature of the soft gate for completions with positive advantage."""
    sapo_temperature_neg: float = 1.05
    """loss_type=sapo: temperature of the soft gate for the others (higher: negative updates fade faster off-policy)."""
    vespo_k_pos: float = 2.0
    """loss_type=vespo: power k of the gamma weight w^k e^(-lambda w) for advantages >= 0 (down-weights w < 1)."""
    vespo_lambda_pos: float = 3.0
    """loss_type=vespo: decay lambda of the gamma weight for advantages >= 0 (down-weights w > 1)."""
    vespo_k_neg: float = 3.0
    """loss_type=vespo: power k for negative advantages."""
    vespo_lambda_neg: float = 2.0
    """loss_type=vespo: decay lambda for negative advantages."""
    entropy_coef: float = 0.0
    """Entropy bonus: subtract entropy_coef x the mean entropy of the batch's loss tokens (with its gradient; 0 = off)."""
    clip_cov_ratio: float = 0.02
    """Clip-Cov (Cui et al. 2025): each step, detach the policy gradient of this share of the loss tokens (at least
    one), drawn among those whose covariance of log-probability and advantage lies in (clip_cov_lb, clip_cov_ub);
    0 = off, TRL's loss (the paper: 2e-4). The default, 2 %, kept SmolLM2 exploring where the plain loss collapsed, at
    no measured cost in held-out accuracy (bench/results/exploration_smollm2_clipcov_skip.md). The tokens and
    covariances are those of the rows trained: with the zero-advantage skip
    (optim.skip_zero_advantage) the rows that carry a signal, as in verl's DAPO recipe, whose dynamic sampling drops
    the all-equal groups before the update (a zero-advantage row has no gradient to detach)."""
    clip_cov_lb: float = 1.0
    """Clip-Cov: the covariance's lower bound (excluded)."""
    clip_cov_ub: float = 5.0
    """Clip-Cov: the covariance's upper bound (excluded)."""
    kl_cov_ratio: float = 0.0
    """KL-Cov (Cui et al. 2025): each step, add kl_cov_coef x |log p_new - log p_old| to the loss of this share of the
    loss tokens (at least one) with the highest covariance of log-probability and advantage; 0 = off (the paper: 2e-4)."""
    kl_cov_coef: float = 1.0
    """KL-Cov: the penalty's coefficient."""
    adaptive_entropy: bool = False
    """Adaptive entropy control (Skywork-OR1; TRL's use_adaptive_entropy): entropy_coef is the starting coefficient,
    raised by entropy_coef_delta after each optimizer step whose trained tokens' mean entropy is at or below
    entropy_target and lowered otherwise; the bonus applies while the last measured entropy is at or below the target."""
    entropy_target: float | None = None
    """adaptive_entropy: the mean token entropy (nats) below which the bonus pushes back; null = half the mean
    entropy of the run's first 5 optimizer steps (the coefficient waits until then; TRL's default is 0.2)."""
    entropy_coef_delta: float = 0.005
    """adaptive_entropy: the coefficient's change per optimizer step."""
    entropy_coef_min: float = 0.0
    """adaptive_entropy: the coefficient's lower bound."""
    entropy_coef_max: float = 0.2
    """adaptive_entropy: the coefficient's upper bound (TRL's default is 1.0: under an entropy that has collapsed, whose
    gradient is then near 0, the coefficient winds up, and at about 0.7 it broke tiny-tools' policy; bench/results/exploration.md)."""
    off_policy_mask_threshold: float | None = None
    """Off-policy sequence masking (DeepSeek-V3.2): drop completions with negative advantage whose mean
    log p_sampler - log p_policy over their tokens exceeds this (e.g. 0.5); null = off."""
