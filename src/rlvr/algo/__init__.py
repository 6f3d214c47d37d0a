"""Pure tensor math of GRPO: advantages, policy losses and their aggregations, KL, log-probs.

No I/O, no config objects, no torch.distributed: hyperparameters arrive as keyword arguments,
and every variant is its own function in a registry, tested alone.
"""

from rlvr.algo.advantages import (
    ADVANTAGE_SCALES,
    GROUP_SIGNAL,
    REWARD_AGGREGATIONS,
    combine_rewards,
    group_advantages,
    groups_with_signal,
)
from rlvr.algo.kl import KL_ESTIMATORS, kl_estimate
from rlvr.algo.logprobs import selective_log_softmax, token_entropy
from rlvr.algo.losses import (
    IMPORTANCE_LEVELS,
    LOSS_AGGREGATIONS,
    SAMPLER_CORRECTIONS,
    BatchNorms,
    PolicyLossOutput,
    high_entropy_mask,
    mask_truncated,
    masked_mean,
    policy_loss,
    sampler_correction,
)

__all__ = [
    "ADVANTAGE_SCALES",
    "GROUP_SIGNAL",
    "REWARD_AGGREGATIONS",
    "IMPORTANCE_LEVELS",
    "KL_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "SAMPLER_CORRECTIONS",
    "BatchNorms",
    "PolicyLossOutput",
    "combine_rewards",
    "group_advantages",
    "groups_with_signal",
    "high_entropy_mask",
    "kl_estimate",
    "mask_truncated",
    "masked_mean",
    "policy_loss",
    "sampler_correction",
    "selective_log_softmax",
    "token_entropy",
]
