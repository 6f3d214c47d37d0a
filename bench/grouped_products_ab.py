"""fp32 decode products of small weights: as before packed_linears' groups (weights under FP32_MIN_WEIGHT on F.linear,
q/k/v and gate/up fused only for grouped-query models) against now (q/k/v and gate/up up to GROUP_MAX_IN wide decide
their way together, measured as they run, and run as one native product where that is the faster; small weights may
take the native kernel alone too), in one process (bench/generation_ab.py: one Trainer on a bench/floor.py config, one
training step, then the same generation `reps` times per way, alternating). The native kernel sums in another order
than F.linear: tokens may differ (reported, with the largest log-prob gap where they are the same).

    cd bench && python grouped_products_ab.py H B L F --reps 8 --out results/grouped_products_amd.md && cd ..
"""

from __future__ import annotations

import rlvr.rollout.engines.hf.lean_decode as lean_decode
from generation_ab import closeness_cli
from rlvr.models import packed_linears
from rlvr.rollout.engines.hf import layer_products

CHOICES: dict[bool, dict] = {True: {}, False: {}}
NOW = {"groups": packed_linears.GROUPS, "fp32_way": packed_linears.fp32_way, "fuses": layer_products.fuses}


def _before_fp32_way(in_features: int, out_features, rows: int) -> str:
    small = in_features * out_features < packed_linears.FP32_MIN_WEIGHT  # before: no group reaches here
    return packed_linears.PLAIN if small else NOW["fp32_way"](in_features, out_features, rows)  # type: ignore[operator]


def _before_fuses(config) -> frozenset[str]:  # before: grouped-query models only
    grouped = (getattr(config, "num_key_value_heads", None) or config.num_attention_heads) < config.num_attention_heads
    return NOW["fuses"](config) if grouped else frozenset()  # type: ignore[operator]


def _switch(before: bool) -> None:
    packed_linears.GROUPS = () if before else NOW["groups"]  # type: ignore[assignment]
    packed_linears.fp32_way = _before_fp32_way if before else NOW["fp32_way"]  # type: ignore[assignment]
    lean_decode.fuses = _before_fuses if before else NOW["fuses"]  # type: ignore[assignment]
    packed_linears._FP32_CHOICES = CHOICES[before]  # each way's choices per shape, read from packing.json once


WAYS = {"before": lambda: _switch(True), "grouped": lambda: _switch(False)}


def main() -> None:
    title = "fp32 decode products: small weights on F.linear and q/k/v, gate/up apart vs decided and run as groups"
    closeness_cli(__doc__, "grouped_products_ab.py", WAYS, title, "grouped / before (medians)", configs=["H", "B"], reps=8)


if __name__ == "__main__":
    main()
