"""Multi-turn episodes: a step's sampled tokens and its tool results' chunks as one forward of their tokens side by
side, none padded (rlvr.rollout.engines.hf.episode_cache.RAGGED), against two forwards (the one-token rows, then the
chunks right-padded to the longest), in one process (bench/generation_ab.py: one Trainer on a bench/floor.py config,
one training step, then the same generation `reps` times per way, alternating). Each token is the same query over
the same slots either way; the products run at other row counts, so log-probs may differ by rounding (reported).

    cd bench && python episode_ragged_ab.py H --reps 12 --out results/episode_ragged_amd.md && cd ..
"""

from __future__ import annotations

import rlvr.rollout.engines.hf.episode_cache as episode_cache
from generation_ab import closeness_cli

WAYS = {"two forwards": lambda: setattr(episode_cache, "RAGGED", False), "one ragged": lambda: setattr(episode_cache, "RAGGED", True)}


def main() -> None:
    title = "Episode forwards: a step's sampled tokens and tool-result chunks in one ragged forward vs two"
    closeness_cli(__doc__, "episode_ragged_ab.py", WAYS, title, "ragged / two (medians)", configs=["H"], reps=12)


if __name__ == "__main__":
    main()
