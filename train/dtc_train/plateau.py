"""Training rules judged on the metrics every rank agrees on, framework-neutral: early stopping
on a validation plateau (``early-stopping-patience``) and a non-finite training loss
(``nonfinite-loss``).

Early stopping follows Keras' ``EarlyStopping`` callback with ``monitor="val_loss"``,
``min_delta=0``, ``mode="min"`` (keras.io/api/callbacks/early_stopping): an epoch improves when
its validation loss is lower than the best so far; after ``patience`` epochs in a row without
one, training stops. Its state travels in the checkpoint, so a resumed job counts on from where
the stopped one was, and a job that stopped early is not trained further by a restart.
"""

import math
from dataclasses import dataclass

NONFINITE_LOSS_CHOICES = ("fail", "continue")


@dataclass
class Plateau:
    """The validation-loss plateau of one job (``patience`` 0: never stops).

    Attributes:
        patience: epochs in a row without a lower validation loss after which training stops.
        best_loss: the lowest validation loss so far (``inf`` before the first epoch).
        best_epoch: the epoch (1-based) that reached it, 0 before the first epoch.
        stopped_after: the epoch after which training stopped early, 0 while it goes on.
    """

    patience: int
    best_loss: float = math.inf
    best_epoch: int = 0
    stopped_after: int = 0

    def update(self, epoch: int, val_loss: float) -> bool:
        """Takes epoch ``epoch``'s validation loss; returns whether training stops after it."""
        if val_loss < self.best_loss:
            self.best_loss, self.best_epoch = val_loss, epoch
        elif self.patience and epoch - self.best_epoch >= self.patience:
            self.stopped_after = epoch
        return bool(self.stopped_after)

    def describe(self, epochs: int) -> str:
        """The log line of an early stop, e.g. ``early stopping after epoch 8 of 12: the validation
        loss has not improved on 0.1234 (epoch 5) for 3 epochs (early-stopping-patience=3)``."""
        return (f"early stopping after epoch {self.stopped_after} of {epochs}: the validation loss has not improved on "
                f"{self.best_loss:.4f} (epoch {self.best_epoch}) for {self.stopped_after - self.best_epoch} epochs "
                f"(early-stopping-patience={self.patience})")

    def state(self) -> dict:
        """What a checkpoint keeps (``from_state`` reads it back)."""
        return {"best_loss": self.best_loss, "best_epoch": self.best_epoch, "stopped_after": self.stopped_after}

    @classmethod
    def from_state(cls, patience: int, state: dict | None) -> "Plateau":
        """The plateau ``state`` (a checkpoint's, or ``None``: a new job) under this job's ``patience``."""
        return cls(patience, **(state or {}))


def check_loss(loss_sum: float, epoch: int, step: int, global_step: int, rank: int, policy: str) -> None:
    """Fails the job on a non-finite training loss under ``policy`` ``fail`` (``continue``: nothing).

    Args:
        loss_sum: this rank's summed training loss of the step (any float).
        epoch, step, global_step, rank: where it happened (1-based epoch and step).
        policy: the ``nonfinite-loss`` hyperparameter, one of ``NONFINITE_LOSS_CHOICES``.

    Raises:
        FloatingPointError: the loss is NaN or infinite and ``policy`` is ``fail``.
    """
    if policy == "fail" and not math.isfinite(loss_sum):
        raise FloatingPointError(
            f"the training loss is {loss_sum} at step {step} of epoch {epoch} (global step {global_step}) on rank "
            f"{rank}: the model diverged; lower learning-rate (or warm it up: warmup-epochs), check the training "
            "data, or set nonfinite-loss=continue to train on")
