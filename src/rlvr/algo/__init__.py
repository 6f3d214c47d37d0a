"""Pure tensor math of GRPO: advantages, policy objectives and loss aggregations, KL, log-probs.

No I/O, no config objects, no torch.distributed: only torch. Hyperparameters arrive as keyword
arguments, and every variant is its own function in a registry keyed by its config value, tested
alone. Registry entries declare their own properties (Objective.zero_gradient_at_zero_advantage,
Aggregation.normalises_per_micro_batch), which the trainer's fast paths query through
zero_advantage_rows_have_zero_gradient and rows_can_be_regrouped. Adding an objective is one
function, one OBJECTIVES entry, one LOSS_TYPES entry naming it (with an aggregation) and one test.

    advantages.py     group advantages, reward aggregation, dynamic-sampling signal
    objectives.py     per-token objectives (OBJECTIVES: clip, cispo, sapo, vespo; IMPORTANCE_LEVELS: token, sequence)
    aggregations.py   per-token losses -> batch loss (LOSS_AGGREGATIONS, BatchNorms)
    token_weights.py  top-entropy mask, sampler correction, truncated-completion mask, off-policy sequence mask
    losses.py         LOSS_TYPES (objective + aggregation), policy_loss and the fast-path queries
    exploration.py    adaptive entropy control (Skywork-OR1), Clip-Cov and KL-Cov (the entropy mechanism)
    kl.py             KL estimators
    logprobs.py       log-probs and entropy from logits
"""

from rlvr.algo.advantages import (
    ADVANTAGE_SCALES,
    GROUP_SIGNAL,
    REWARD_AGGREGATIONS,
    combine_rewards,
    group_advantages,
    groups_with_signal,
)
from rlvr.algo.aggregations import LOSS_AGGREGATIONS, Aggregation, BatchNorms
from rlvr.algo.exploration import (
    EntropyControl,
    applied_entropy_coef,
    clip_cov_weights,
    kl_cov_penalty,
    kl_cov_selection,
    next_entropy_control,
    start_entropy_control,
    token_covariance,
)
from rlvr.algo.kl import KL_ESTIMATORS, kl_estimate
from rlvr.algo.logprobs import exp_flushed, selective_log_softmax, token_entropy, token_entropy_with_grad, token_logprobs
from rlvr.algo.losses import (
    LOSS_TYPES,
    LossType,
    PolicyLossOutput,
    masked_mean,
    policy_loss,
    rows_can_be_regrouped,
    zero_advantage_rows_have_zero_gradient,
)
from rlvr.algo.objectives import IMPORTANCE_LEVELS, OBJECTIVES, Objective, ObjectiveOutput
from rlvr.algo.token_weights import (
    SAMPLER_CORRECTIONS,
    high_entropy_mask,
    mask_truncated,
    off_policy_sequence_mask,
    sampler_correction,
)

__all__ = [
    "ADVANTAGE_SCALES",
    "GROUP_SIGNAL",
    "REWARD_AGGREGATIONS",
    "IMPORTANCE_LEVELS",
    "KL_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "LOSS_TYPES",
    "OBJECTIVES",
    "SAMPLER_CORRECTIONS",
    "Aggregation",
    "BatchNorms",
    "EntropyControl",
    "applied_entropy_coef",
    "clip_cov_weights",
    "kl_cov_penalty",
    "kl_cov_selection",
    "next_entropy_control",
    "start_entropy_control",
    "token_covariance",
    "LossType",
    "Objective",
    "ObjectiveOutput",
    "PolicyLossOutput",
    "combine_rewards",
    "exp_flushed",
    "group_advantages",
    "groups_with_signal",
    "high_entropy_mask",
    "kl_estimate",
    "mask_truncated",
    "masked_mean",
    "off_policy_sequence_mask",
    "policy_loss",
    "rows_can_be_regrouped",
    "sampler_correction",
    "selective_log_softmax",
    "token_entropy",
    "token_entropy_with_grad",
    "token_logprobs",
    "zero_advantage_rows_have_zero_gradient",
]
