"""The learning rate at each optimizer step: the linear scaling rule, gradual warmup and cosine
decay (hyperparameters ``learning-rate``, ``warmup-epochs`` and ``lr-schedule``).

Formula (Goyal et al. 2017, "Accurate, Large Minibatch SGD", sections 2.1-2.2; Loshchilov and
Hutter 2017, "SGDR", eq. 5 without restarts), with ``eta`` the per-rank ``learning-rate``, ``k``
the world size, ``W`` the warmup steps and ``T`` the job's steps, for the optimizer step that
follows ``s`` steps done (0-based):

- warmup, ``s < W``: ``eta + (k * eta - eta) * s / W``, from the one-rank rate up to the scaled one;
- then ``constant``: ``k * eta``; ``cosine``: ``k * eta * (1 + cos(pi * (s - W) / (T - W))) / 2``,
  which would reach 0 after the last step.

The rate depends on the step alone, so a resumed job follows the same curve as an uninterrupted
one.
"""

import math
from dataclasses import dataclass

DECAYS = ("constant", "cosine")


@dataclass(frozen=True)
class LearningRate:
    """The rate per step.

    Attributes:
        per_rank: ``eta``, the ``learning-rate`` hyperparameter.
        world_size: ``k``.
        warmup_steps: ``W``, 0 for none.
        total_steps: ``T``, the job's optimizer steps (epochs x steps per epoch).
        decay: ``constant`` or ``cosine``.
    """

    per_rank: float
    world_size: int
    warmup_steps: int = 0
    total_steps: int = 1
    decay: str = "constant"

    def __post_init__(self):
        if self.decay not in DECAYS:
            raise ValueError(f"lr-schedule must be one of {', '.join(DECAYS)}, got {self.decay!r}")

    @classmethod
    def for_job(cls, per_rank: float, world_size: int, warmup_epochs: float, epochs: int, steps_per_epoch: int,
                decay: str) -> "LearningRate":
        """The schedule of a job of ``epochs`` epochs of ``steps_per_epoch`` steps (warmup rounded to whole steps)."""
        return cls(per_rank, world_size, round(warmup_epochs * steps_per_epoch), epochs * steps_per_epoch, decay)

    @property
    def peak(self) -> float:
        """``k * eta``: the linear scaling rule's rate for the global batch."""
        return self.per_rank * self.world_size

    def describe(self) -> str:
        """One log line: the rates and the steps."""
        warmup = (f", warmup over {self.warmup_steps} steps from {self.per_rank:g}" if self.warmup_steps else "")
        decay = f", then cosine decay to 0 at step {self.total_steps}" if self.decay == "cosine" else ", constant"
        return f"learning rate {self.per_rank:g} per rank x {self.world_size} ranks = {self.peak:g}{warmup}{decay}"

    def rate(self, steps_done: int) -> float:
        """The rate of the step that follows ``steps_done`` steps (formula above)."""
        if steps_done < self.warmup_steps:
            return self.per_rank + (self.peak - self.per_rank) * steps_done / self.warmup_steps
        if self.decay == "constant":
            return self.peak
        span = max(1, self.total_steps - self.warmup_steps)
        return self.peak * (1 + math.cos(math.pi * min(steps_done - self.warmup_steps, span) / span)) / 2
