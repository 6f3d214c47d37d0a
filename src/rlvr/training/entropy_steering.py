"""algo.adaptive_entropy in the update: the controller's state (algo.EntropyControl, checkpointed by the trainer),
the coefficient each optimizer step applies, and the entropy it measures over the step's loss tokens."""

from __future__ import annotations

import torch

from rlvr import algo


class EntropySteering:
    """One optimizer step at a time: `applied()` before its micro-batches, `add()` per micro-batch, `steer()` after."""

    def __init__(self, cfg, device: torch.device | str):
        a = cfg.algo
        self.cfg = a
        self.state = algo.start_entropy_control(a.entropy_coef, target=a.entropy_target)
        self.window = torch.zeros(2, dtype=torch.float64, device=device)  # [sum of H x mask, tokens] of this step

    def applied(self, skipped_entropy: torch.Tensor | None) -> float:
        """The coefficient this step applies; opens its window with the entropy of the rows it skips ([2] or None)."""
        self.window.zero_()
        if skipped_entropy is not None:
            self.window += skipped_entropy
        return algo.applied_entropy_coef(self.state)

    def rests(self) -> bool:
        """The next step applies no bonus: rows with advantage 0 then have a zero gradient."""
        return algo.applied_entropy_coef(self.state) == 0

    def add(self, entropy: torch.Tensor, acting: torch.Tensor) -> None:
        """A micro-batch's entropies [n, c] over the tokens the bonus acts on [n, c] (the loss mask, narrowed by a
        top-entropy selection)."""
        acting = acting.to(torch.float64)
        self.window += torch.stack([(entropy.to(torch.float64) * acting).sum(), acting.sum()])

    def steer(self, dist) -> None:
        """The controller after the step: the mean entropy of its window over every rank."""
        total, tokens = dist.sum(*(float(x) for x in self.window), what="entropy window")
        a = self.cfg
        self.state = algo.next_entropy_control(
            self.state, total / max(tokens, 1.0), delta=a.entropy_coef_delta, coef_min=a.entropy_coef_min, coef_max=a.entropy_coef_max
        )

    def metrics(self) -> dict[str, float]:
        c = self.state
        return {"entropy_coef": c.coef, "entropy/controlled": c.last_entropy} | ({} if c.target is None else {"entropy/target": c.target})

    def resume(self, saved: dict | tuple) -> None:
        """The controller as a checkpoint left it (a tuple: written before the automatic target, (coef, last entropy))."""
        if isinstance(saved, tuple):
            saved = {"coef": saved[0], "last_entropy": saved[1], "target": self.state.target, "measured": ()}
        self.state = algo.EntropyControl(**{**saved, "measured": tuple(saved["measured"])})

    def saved(self) -> dict:
        return self.state._asdict()
