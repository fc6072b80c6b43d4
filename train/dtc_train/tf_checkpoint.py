"""The TensorFlow trainers' checkpoint, and the Keras callback that writes it on a schedule and
when the job is stopped.

One file, ``<checkpoint-dir>/checkpoint.npz``, written atomically (``common.atomic_write``:
staged outside the directory, fsync, rename): the position (epochs done, steps of the next
epoch done), the model's weights, the optimizer's variables (iteration count, momentum) and any
extra arrays a trainer keeps (the parameter-server chief's epoch sums). Only the chief writes;
a restarted job reads it and goes on from that step, so a checkpoint is only ever replaced by a
later one. Nothing in it names a host.

Import after ``TF_USE_LEGACY_KERAS=1`` is set (``dtc_train.tf_env``).
"""

import os
from collections.abc import Callable

import numpy as np
import tf_keras as keras

from . import common, stop

CHECKPOINT_NAME = "checkpoint.npz"


def optimizer_variables(optimizer) -> list:
    """The optimizer's variables (iteration count, slots) in a fixed order."""
    # tf-keras's optimizer exposes them as a property whose value is also callable (Horovod's
    # broadcast callback calls it); call it when it is, as Horovod does
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


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


def restore_checkpoint(checkpoint_dir: str, model: keras.Model, optimizer) -> tuple[int, int, dict]:
    """Loads ``save_checkpoint``'s file into ``model`` and ``optimizer`` (whose variables must
    exist: ``optimizer.build(model.trainable_variables)``). Returns (epochs done, steps of the next
    epoch done, extra arrays); (0, 0, {}) when there is no readable checkpoint (an unreadable one is
    named in the log, and training starts over)."""
    path = os.path.join(checkpoint_dir, CHECKPOINT_NAME)
    if not os.path.exists(path):
        return 0, 0, {}
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
        return 0, 0, {}
    common.log.info("resuming from %s: epoch %d done, %d steps of epoch %d done", path, epoch, step, epoch + 1)
    return epoch, step, {k[len("extra_"):]: v for k, v in arrays.items() if k.startswith("extra_")}


class StopAndCheckpoint(keras.callbacks.Callback):
    """Writes the checkpoint (the chief only) on the ``checkpoint-every`` schedule and after the
    last epoch, and after the step in which any worker was asked to stop, then raises
    ``stop.Stopped`` out of ``fit`` on every worker (they all agree at the same step).

    Args:
        args: the parsed hyperparameters (``checkpoint_dir``, ``checkpoint_every``, ``epochs``).
        stop_request: this process's ``stop.StopRequest``.
        sum_over_workers: sums a float over all workers (an all-reduce; called by every worker
            at the same steps, ``stop.StopRequest.agreed``).
        is_chief: whether this worker writes.
        steps_per_epoch: optimizer steps per epoch.
        first_step: steps of the first epoch of this ``fit`` done before a restart
            (``fit_from`` sets it).
    """

    def __init__(self, args, stop_request: stop.StopRequest, sum_over_workers: Callable[[float], float],
                 is_chief: bool, steps_per_epoch: int, first_step: int = 0):
        super().__init__()
        self.args, self.stop_request, self.sum_over_workers = args, stop_request, sum_over_workers
        self.is_chief, self.steps_per_epoch, self.first_step = is_chief, steps_per_epoch, first_step
        self.epoch = 0

    def save(self, epoch: int, step: int) -> None:
        if self.is_chief:
            save_checkpoint(self.args.checkpoint_dir, self.model, self.model.optimizer, epoch, step)

    def on_train_begin(self, logs=None):
        self.stop_request.training_begins()

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        step = self.first_step + batch + 1
        global_step = self.epoch * self.steps_per_epoch + step
        signum = self.stop_request.agreed(global_step, self.sum_over_workers)
        if signum or self.args.checkpoint_every.due_after_step(global_step):
            self.save(self.epoch, step)
        if signum:
            raise stop.Stopped.after_checkpoint(signum, self.epoch + 1, step, self.args.checkpoint_dir,
                                                announce=self.is_chief)

    def on_epoch_end(self, epoch, logs=None):
        self.first_step = 0
        if self.args.checkpoint_every.due_after_epoch(epoch + 1) or epoch + 1 == self.args.epochs:
            self.save(epoch + 1, 0)


def fit_from(model: keras.Model, epoch_input: Callable[[int, int], object], *, epoch: int, step: int, epochs: int,
             steps_per_epoch: int, callbacks: list, stopper: StopAndCheckpoint) -> None:
    """``model.fit`` from a checkpoint's position (``epoch`` done, ``step`` steps of the next done),
    one ``fit`` per epoch: ``epoch_input(e, first_step)`` returns epoch ``e``'s input (0-based)
    from its step ``first_step`` on, so a resumed job reads exactly what an uninterrupted one
    would (each epoch's order derived from the seed and the epoch, the steps already done
    skipped: at most one epoch's batches are read again). Raises ``stop.Stopped`` when stopped
    (``StopAndCheckpoint``)."""
    if step >= steps_per_epoch:   # stopped after an epoch's last step, before its validation
        epoch, step = epoch + 1, 0
    for current in range(epoch, epochs):
        first_step = step if current == epoch else 0
        stopper.first_step = first_step
        model.fit(epoch_input(current, first_step), initial_epoch=current, epochs=current + 1,
                  steps_per_epoch=steps_per_epoch - first_step, verbose=0, callbacks=callbacks)
