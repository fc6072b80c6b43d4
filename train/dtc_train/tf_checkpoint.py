"""What the TensorFlow backends of the training loop (``dtc_train.loop``) share: the checkpoint,
and a tf-keras model's optimizer steps (``KerasSteps``).

One file, ``<checkpoint-dir>/checkpoint.npz``, written atomically (``common.atomic_write``:
staged outside the directory, fsync, rename): the position (epochs done, steps of the next
epoch done), the model's weights, the optimizer's variables (iteration count, momentum), the
epoch's training sums so far and the early-stopping state (``loop.Resume``). Only the chief
writes; a restarted job reads it and goes on from that step, so a checkpoint is only ever
replaced by a later one. Nothing in it names a host.

Import after ``TF_USE_LEGACY_KERAS=1`` is set (``dtc_train.tf_env``).
"""

import math
import os
from collections.abc import Callable, Iterator

import numpy as np
import tf_keras as keras

from . import common, loop

CHECKPOINT_NAME = "checkpoint.npz"


def optimizer_variables(optimizer) -> list:
    """The optimizer's variables (iteration count, slots) in a fixed order; a
    ``LossScaleOptimizer``'s (precision=fp16: ``tf_model.loss_scaled``) with its loss scale and
    its count of finite steps last, so that a resumed job scales as the uninterrupted one did."""
    # tf-keras's optimizer exposes them as a property whose value is also callable (Horovod's
    # broadcast callback calls it); call it when it is, as Horovod does
    variables = optimizer.variables
    variables = list(variables() if callable(variables) else variables)
    if isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer):
        # tf-keras 2.21 lists only the wrapped optimizer's; the scale's state has no public handle
        variables += [optimizer._loss_scale._current_loss_scale, optimizer.dynamic_counter]
    return variables


def save_checkpoint(checkpoint_dir: str, model: keras.Model, optimizer, epoch: int, step: int = 0,
                    **extra: np.ndarray) -> None:
    """One file, written atomically (``common.atomic_write``): the position (``epoch`` epochs done,
    ``step`` steps of the next one done), the model's weights and the optimizer's variables
    (iteration count, momentum) in their orders (``model.get_weights()``, ``optimizer.variables``),
    and ``extra`` arrays. Works for replicated (MultiWorkerMirrored) and parameter-server
    variables alike: it reads their values."""
    arrays = {"epoch": np.asarray(epoch), "step": np.asarray(step)}
    arrays.update({f"model_{i}": w for i, w in enumerate(model.get_weights())})
    arrays.update({f"optimizer_{i}": v.numpy() for i, v in enumerate(optimizer_variables(optimizer))})
    arrays.update({f"extra_{k}": np.asarray(v) for k, v in extra.items()})
    common.atomic_write(os.path.join(checkpoint_dir, CHECKPOINT_NAME), lambda tmp: np.savez(tmp, **arrays))


def restore_checkpoint(checkpoint_dir: str, model: keras.Model, optimizer) -> loop.Resume:
    """Loads ``save_checkpoint``'s file into ``model`` and ``optimizer`` (whose variables must
    exist: ``optimizer.build(model.trainable_variables)``). Returns where training goes on, with
    the epoch's training sums and the early-stopping state the file keeps; ``loop.Resume()`` when
    there is no readable checkpoint (an unreadable one is named in the log, and training starts over)."""
    path = os.path.join(checkpoint_dir, CHECKPOINT_NAME)
    if not os.path.exists(path):
        return loop.Resume()
    try:
        with np.load(path) as saved:
            arrays = dict(saved)
        epoch, step = int(arrays["epoch"]), int(arrays.get("step", 0))
        model.set_weights([arrays[f"model_{i}"] for i in range(len(model.get_weights()))])
        for i, variable in enumerate(optimizer_variables(optimizer)):
            variable.assign(arrays[f"optimizer_{i}"])
    except Exception as error:  # truncated, foreign or from another model: start over
        common.log.warning("ignoring checkpoint %s, which cannot be restored (%s: %s); training starts at epoch 1",
                           path, type(error).__name__, error)
        return loop.Resume()
    common.log.info("resuming from %s: epoch %d done, %d steps of epoch %d done", path, epoch, step, epoch + 1)
    sums = arrays.get("extra_train_sums")
    plateau = arrays.get("extra_plateau")
    return loop.Resume(epoch, step, None if sums is None else np.asarray(sums, dtype=np.float64),
                       None if plateau is None else dict(zip(PLATEAU_KEYS, (float(plateau[0]), int(plateau[1]),
                                                                            int(plateau[2])), strict=True)))


PLATEAU_KEYS = ("best_loss", "best_epoch", "stopped_after")   # plateau.Plateau.state's, as one array


def save(checkpoint_dir: str, model: keras.Model, optimizer, position: loop.Resume) -> None:
    """``save_checkpoint`` of what ``loop.Backend.save`` is given, as ``restore_checkpoint`` reads
    it back: the position, the epoch's training sums so far over every rank (``None`` at an
    epoch's end) and the early-stopping state (``position.plateau``)."""
    extra = {"plateau": np.array([position.plateau[key] for key in PLATEAU_KEYS], dtype=np.float64)}
    if position.train_sums is not None:
        extra["train_sums"] = np.asarray(position.train_sums, dtype=np.float64)
    save_checkpoint(checkpoint_dir, model, optimizer, position.epoch, position.step, **extra)


class KerasSteps:
    """The optimizer steps of a compiled tf-keras model, one ``model.train_function`` call each:
    exactly the step ``model.fit`` takes (under the model's distribution strategy: its replicas'
    gradients all-reduced; under Horovod: its ``DistributedOptimizer``'s allreduce), so training
    goes through the loop's rules instead of Keras callbacks; or, under gradient accumulation,
    ``k`` calls of the given train functions, one batch each. The part of ``loop.Backend`` every
    TensorFlow backend with a Keras step shares; each adds ``total``, ``sum_scalar``,
    ``evaluate`` and ``save``.

    Args:
        model: compiled with ``loss`` and the ``accuracy`` metric.
        epoch_input: ``(epoch, first_batch) -> iterator`` of epoch ``epoch``'s (0-based) batches
            from its batch ``first_batch`` on, as the train function takes them (a distributed
            iterator under a strategy).
        batch_samples: the samples one call of the train function takes and its ``loss`` and
            ``accuracy`` average over (per rank under Horovod; every replica's under a mirrored
            strategy, whose metrics are global).
        train_functions: one per batch of a step, in order, each ``iterator -> logs`` (the model's
            metrics, as ``model.train_function`` returns them) under ``gradient-accumulation-steps``
            = ``k``: Keras' own ``k`` times under Horovod, whose
            ``DistributedOptimizer(backward_passes_per_step=k)`` adds up the first ``k - 1``
            batches' gradients locally and applies their mean with the ``k``-th's, after one
            allreduce; ``tensorflow_mwms.accumulating_train_functions`` under a strategy. Default:
            Keras' ``model.make_train_function()`` alone.
    """

    def __init__(self, model: keras.Model, epoch_input: Callable[[int, int], Iterator], batch_samples: int,
                 train_functions: tuple[Callable, ...] | None = None):
        self.model, self.epoch_input, self.batch_samples = model, epoch_input, batch_samples
        self.train_functions = train_functions or (model.make_train_function(),)
        self.batches_per_step = len(self.train_functions)
        self.iterator: Iterator | None = None
        self.batches, self.done = 0, np.zeros(len(loop.SUMS))

    def begin_epoch(self, epoch: int, first_step: int) -> None:
        self.model.reset_metrics()   # as fit does per epoch: the metrics' means start over
        self.iterator = self.epoch_input(epoch - 1, first_step * self.batches_per_step)
        self.batches, self.done = 0, np.zeros(len(loop.SUMS))

    def set_learning_rate(self, rate: float) -> None:
        self.model.optimizer.learning_rate.assign(rate)

    def train_step(self, global_step: int) -> np.ndarray:
        """One step (``batches_per_step`` batches); its ``loop.SUMS`` from the change in the
        metrics' running means (Keras' loss tracker weighs each batch by its samples; the correct
        count is a whole number)."""
        for train_function in self.train_functions:
            logs = train_function(self.iterator)
        self.batches += self.batches_per_step
        samples = self.batches * self.batch_samples
        loss, accuracy = float(logs["loss"]), float(logs["accuracy"])
        correct = round(accuracy * samples) if math.isfinite(accuracy) else accuracy
        running = np.array([loss * samples, correct, samples], dtype=np.float64)
        sums, self.done = running - self.done, running
        return sums


