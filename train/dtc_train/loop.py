"""The one training loop of every built-in trainer, framework-neutral: where a job resumes, when
the ranks stop together, when checkpoints are written, the learning rate of each step, what the
observers see, when training stops early, and the non-finite-loss rule.

What differs between ways of training (a PyTorch step under Horovod, DDP or FSDP2; a Keras step
under Horovod or a mirrored strategy; a step scheduled on a parameter-server worker) is one
``Backend``: its step, its sum over the ranks, its validation and its checkpoint. ``fit`` holds
every rule; a backend holds none, so a rule changes in one place for all of them, and the rules
are unit-tested with a backend of plain numbers (tests/unit/test_loop.py). Adding a way of
training is its module (one backend and a ``main``) and its record in ``dtc_train.trainers``
(docs/development.md, "Adding things").

Sums: a step returns this rank's float64 ``[loss sum, correct, samples]`` (``SUMS``); the loop
adds them up over the epoch and asks the backend for their total over the ranks at the end of
the epoch and for each mid-epoch checkpoint. A checkpoint keeps that total, so a job resumed
mid-epoch reports the same epoch metrics as an uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from . import common, lr_schedule, plateau, stop

SUMS = ("loss_sum", "correct", "samples")


@dataclass(frozen=True)
class Rules:
    """The hyperparameters the loop applies (``dtc_train.config.TrainerConfig`` has them all).

    Attributes:
        epochs: epochs of the job.
        checkpoint_every: the scheduled checkpoints (``stop.Schedule``).
        checkpoint_dir: where they go (for the log line of a stop).
        learning_rate: the per-rank rate ``eta`` (``lr_schedule``).
        warmup_epochs: epochs of gradual warmup, 0 for none.
        lr_schedule: ``constant`` or ``cosine``.
        early_stopping_patience: epochs without a lower validation loss before stopping; 0: never.
        nonfinite_loss: ``fail`` or ``continue`` (``plateau.check_loss``).
    """

    epochs: int
    checkpoint_every: stop.Schedule
    checkpoint_dir: str
    learning_rate: float
    warmup_epochs: float = 0.0
    lr_schedule: str = "constant"
    early_stopping_patience: int = 0
    nonfinite_loss: str = "fail"

    @classmethod
    def of(cls, config) -> Rules:
        """The loop's rules out of a trainer config (any object with these attributes)."""
        return cls(config.epochs, config.checkpoint_every, config.checkpoint_dir, config.learning_rate,
                   config.warmup_epochs, config.lr_schedule, config.early_stopping_patience, config.nonfinite_loss)


@dataclass(frozen=True)
class Resume:
    """Where a restarted job goes on (a checkpoint's position; ``Resume()``: from the start).

    Attributes:
        epoch: epochs done.
        step: optimizer steps of the next epoch done.
        train_sums: the ``SUMS`` of those steps, totalled over the ranks, or ``None``; rank 0
            adds them to its sums, so the epoch's total counts them once.
        plateau: the early-stopping state (``plateau.Plateau.state``), the same on every rank, or ``None``.
    """

    epoch: int = 0
    step: int = 0
    train_sums: np.ndarray | None = None
    plateau: dict | None = None


def optimizer_steps(batches_per_epoch: int, micro_batches: int, batch_size: int) -> int:
    """Optimizer steps per epoch under gradient accumulation (``--gradient-accumulation-steps``
    = ``micro_batches``) for ``batches_per_epoch`` batches per rank (the same on every rank): whole
    groups of ``micro_batches``. The batches left over are not trained in that epoch: every
    trainer starts each epoch's input anew (``dali_data.ReadOrder``'s next permutation, or the
    TensorFlow input shuffled by the epoch), so they are skipped.

    Raises:
        ValueError: fewer batches per epoch than ``micro_batches``, naming the hyperparameters.
    """
    if batches_per_epoch < micro_batches:
        raise ValueError(
            f"gradient-accumulation-steps={micro_batches} is more than the {batches_per_epoch} batches of "
            f"batch-size {batch_size} each rank reads per epoch: lower gradient-accumulation-steps or batch-size")
    return batches_per_epoch // micro_batches


def log_accumulation(micro_batches: int, batch_size: int, world_size: int, steps_per_epoch: int) -> None:
    """Rank 0's line saying how a step accumulates (nothing for ``micro_batches`` 1)."""
    if micro_batches > 1:
        common.log.info("gradient accumulation: %d micro-batches of %d per optimizer step on each rank (%d samples "
                        "per step over %d ranks), %d steps per epoch, the gradients averaged over the ranks once per "
                        "step", micro_batches, batch_size, batch_size * micro_batches * world_size, world_size,
                        steps_per_epoch)


class Backend(Protocol):
    """One way of training, as the loop drives it. Every method is called by every rank at the
    same point (those marked collective run collectives).

    Attributes:
        rank: this process's rank (0 reports and writes).
        world_size: the ranks (or the workers a parameter-server chief drives).
        steps_per_epoch: optimizer steps per epoch, equal on every rank.
        rate_scale: ``k`` of the linear scaling rule (the ranks or replicas whose gradients are
            averaged in a step; 1 for asynchronous parameter-server steps).
    """

    rank: int
    world_size: int
    steps_per_epoch: int
    rate_scale: int

    def begin_epoch(self, epoch: int, first_step: int) -> None:
        """Epoch ``epoch`` (1-based) starts after ``first_step`` steps done (its input from there)."""

    def set_learning_rate(self, rate: float) -> None:
        """The optimizer's rate from the next step on (called when it changes)."""

    def train_step(self, global_step: int) -> np.ndarray:
        """One optimizer step, the job's ``global_step``-th (1-based). Returns this rank's float64
        ``SUMS`` of the step (zeros where the step runs elsewhere and ``total`` counts it), or
        what gives them when read with ``np.asarray`` (a GPU's copy still under way:
        ``torch_common.PendingSums``); the loop reads them after starting the next step."""

    def total(self, sums: np.ndarray, name: str) -> np.ndarray:
        """Collective: the epoch's ``SUMS`` so far over every rank, from this rank's ``sums``."""

    def sum_scalar(self, value: float, name: str) -> float:
        """Collective: ``value`` summed over the ranks."""

    def end_training_steps(self) -> None:
        """Collective: the epoch's steps are done (wait for them; align what ranks keep apart)."""

    def evaluate(self) -> tuple[float, float, int]:
        """Collective: validation over the whole channel: (loss, accuracy, samples), equal on every rank."""

    def save(self, epoch: int, step: int, train_sums: np.ndarray | None, plateau_state: dict) -> None:
        """Collective: the checkpoint of ``epoch`` epochs and ``step`` steps of the next done, with
        the steps' ``SUMS`` totalled over the ranks (``None`` at an epoch's end) and the
        early-stopping state; rank 0 writes it."""


def fit(rules: Rules, backend: Backend, observer, stop_request: stop.StopRequest, resume: Resume = Resume()) -> float:
    """Trains from ``resume`` to ``rules.epochs`` epochs. Returns the last validation accuracy.

    Per step: the learning rate (``lr_schedule``, by the job's step, so a resumed job follows the
    uninterrupted curve), the backend's step, the previous step's sums read and the
    non-finite-loss rule on its loss (``plateau.check_loss``, naming that step: a step's sums
    are read once the next is under way, so that a GPU's queue never waits on the host; before a
    checkpoint and at the epoch's end, the last step's are read too), ``observer.step_done()``,
    the stop agreement
    (``stop.StopRequest.agreed``: every rank stops after the same step), and a checkpoint when
    the ``checkpoint-every`` schedule or a stop asks. A stop raises ``stop.Stopped`` on every rank
    once its checkpoint is written. Per epoch: the sums totalled over the ranks, validation, the
    metric line (``observer.end_epoch``), the early-stopping rule (``plateau.Plateau``, its state
    kept in every checkpoint), and a checkpoint when scheduled, after the last epoch or on an
    early stop. A job whose checkpoint is already done (every epoch, or stopped early) is only
    validated.

    Raises:
        stop.Stopped: a stop signal, after its checkpoint.
        FloatingPointError: a NaN or infinite training loss under ``nonfinite-loss=fail``.
    """
    steps = backend.steps_per_epoch
    rates = lr_schedule.LearningRate.for_job(rules.learning_rate, backend.rate_scale, rules.warmup_epochs,
                                             rules.epochs, steps, rules.lr_schedule)
    reporting = backend.rank == 0
    if reporting:
        common.log.info(rates.describe())
    rule = plateau.Plateau.from_state(rules.early_stopping_patience, resume.plateau)
    epoch, first_step = resume.epoch, resume.step   # stopped after an epoch's last step: validated on resuming
    if epoch >= rules.epochs or rule.stopped_after:
        if reporting:
            common.log.info("the checkpoint has %s: nothing left to train",
                            f"stopped early after epoch {rule.stopped_after} (early-stopping-patience)"
                            if rule.stopped_after else f"done all {rules.epochs} epochs")
        return backend.evaluate()[1]

    val_accuracy, rate = 0.0, None
    stop_request.training_begins()
    for epoch_number in range(epoch + 1, rules.epochs + 1):
        start = first_step if epoch_number == epoch + 1 else 0
        backend.begin_epoch(epoch_number, start)
        observer.begin_epoch(epoch_number, start)
        sums = np.zeros(len(SUMS), dtype=np.float64)
        if start and resume.train_sums is not None and reporting:
            sums += resume.train_sums
        unread = None   # the last step whose sums are not read yet: (step, global_step, its sums)
        for step in range(start + 1, steps + 1):
            global_step = (epoch_number - 1) * steps + step
            if rates.rate(global_step - 1) != rate:
                rate = rates.rate(global_step - 1)
                backend.set_learning_rate(rate)
            started = (step, global_step, backend.train_step(global_step))
            if unread:
                sums += read_step_sums(unread, epoch_number, backend.rank, rules.nonfinite_loss)
            unread = started
            observer.step_done()
            signum = stop_request.agreed(global_step, lambda flag: backend.sum_scalar(flag, "stop_requested"))
            if signum or rules.checkpoint_every.due_after_step(global_step):
                sums += read_step_sums(unread, epoch_number, backend.rank, rules.nonfinite_loss)
                unread = None
                backend.save(epoch_number - 1, step, backend.total(sums, "checkpoint_train_sums"), rule.state())
            if signum:
                raise stop.Stopped.after_checkpoint(signum, epoch_number, step, rules.checkpoint_dir,
                                                    announce=reporting)
        if unread:
            sums += read_step_sums(unread, epoch_number, backend.rank, rules.nonfinite_loss)
        backend.end_training_steps()
        loss_sum, correct, count = backend.total(sums, "train_sums")
        observer.end_training_steps()
        val_loss, val_accuracy, val_count = backend.evaluate()
        observer.end_epoch(epoch_number, train_loss=loss_sum / count, train_accuracy=correct / count,
                           val_loss=val_loss, val_accuracy=val_accuracy, val_samples=val_count)
        stopping = rule.update(epoch_number, val_loss)   # every rank: the validation loss is the same everywhere
        if rules.checkpoint_every.due_after_epoch(epoch_number) or epoch_number == rules.epochs or stopping:
            backend.save(epoch_number, 0, None, rule.state())
        if stopping:
            if reporting:
                common.log.info(rule.describe(rules.epochs))
            break
    return val_accuracy


def read_step_sums(unread: tuple[int, int, object], epoch: int, rank: int, nonfinite_loss: str) -> np.ndarray:
    """The float64 ``SUMS`` of a step started before, as ``(step, global_step, sums)``: read
    (``np.asarray``, which for a GPU's copy waits for that step alone) and checked by the
    non-finite-loss rule under ``nonfinite_loss`` (``plateau.check_loss``, naming that step).

    Raises:
        FloatingPointError: as ``plateau.check_loss``.
    """
    step, global_step, sums = unread
    sums = np.asarray(sums, dtype=np.float64)
    plateau.check_loss(float(sums[0]), epoch, step, global_step, rank, nonfinite_loss)
    return sums


def run(rules: Rules, backend: Backend, observer, stop_request: stop.StopRequest, resume: Resume,
        finish: Callable[[float], None]) -> int:
    """``fit``, then ``finish(val_accuracy)`` (the backend's digest line and model save), then the
    observer's report (``observer.close()``), which a stop writes too.

    Returns:
        the trainer's exit code: 0, or ``128 + N`` when stopped by signal N (``stop.Stopped``,
        after its checkpoint).

    Raises:
        FloatingPointError: as ``fit``; the report is not written then.
    """
    try:
        val_accuracy = fit(rules, backend, observer, stop_request, resume)
    except stop.Stopped as stopped:
        observer.close()
        return stopped.exit_code
    finish(val_accuracy)
    observer.close()
    return 0


def emit_digest(rank: int, world_size: int, arrays) -> None:
    """Prints this rank's ``rank=<r> world_size=<n> final_weights_sha256=<hex>`` line: the
    SHA-256 of its final weights (numpy arrays, in order: ``common.weights_digest``), equal on
    every rank exactly when all hold bit-identical weights."""
    common.emit(f"rank={rank} world_size={world_size} final_weights_sha256={common.weights_digest(arrays)}")
