"""Multi-turn episodes: a tool result's chunk forward reading every row's KV buffer in place from the one-token share of
the rows (a quarter) against from a share that grows with the chunk's length (rlvr.rollout.engines.hf.episode_cache.
read_in_place_share), in one process (bench/generation_ab.py: one Trainer on a bench/floor.py config, one training
step, then the same generation `reps` times per way, alternating). The two ways read the same keys and values through
other batch sizes: the same tokens, log-probs to rounding (reported).

    cd bench && python episode_chunks_in_place_ab.py H --reps 12 --out results/episode_chunks_in_place_intel.md && cd ..
"""

from __future__ import annotations

import rlvr.rollout.engines.hf.episode_cache as episode_cache
from generation_ab import closeness_cli

# the chunks through the explicit products (NATIVE_CHUNKS off): through the C kernel (the default where it builds and is
# timed faster) a chunk reads each row's buffer in place whatever the share (bench/episode_c_passes_ab.py)
WAYS = {
    "one-token share": lambda: [setattr(episode_cache, "CHUNKS_BY_LENGTH", False), setattr(episode_cache, "NATIVE_CHUNKS", False)],
    "share by chunk length": lambda: [setattr(episode_cache, "CHUNKS_BY_LENGTH", True), setattr(episode_cache, "NATIVE_CHUNKS", False)],
}


def main() -> None:
    title = "Episode chunk forwards: in place from a quarter of the rows vs from a share growing with the chunk's length"
    closeness_cli(__doc__, "episode_chunks_in_place_ab.py", WAYS, title, "by length / one-token (medians)", configs=["H"], reps=12)


if __name__ == "__main__":
    main()
