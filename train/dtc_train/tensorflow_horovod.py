"""Built-in trainer: TensorFlow data-parallel training with Horovod, input through NVIDIA DALI.

API choice: the Keras 2 API from ``tf-keras`` with ``TF_USE_LEGACY_KERAS=1`` and
``horovod.tensorflow.keras``. That is the API existing Horovod/Keras training code is written
against (``DistributedOptimizer``, ``BroadcastGlobalVariablesCallback``, ``MetricAverageCallback``),
and under Keras 3, which TF >= 2.16 loads by default, ``horovod.tensorflow.keras`` breaks
(horovod #4290, still open). A custom ``horovod.tensorflow`` loop would avoid Keras but would
make every user re-write ``fit``; legacy Keras keeps their code working.

Each rank reads its shard of the training channel through ``DALIDataset``; rank 0's initial
weights are broadcast; validation accuracy is summed exactly over the validation shards. Rank 0
logs one metric line per epoch, writes an atomic checkpoint each epoch (weights, optimizer state
and epoch in one file; a restarted job resumes from it), and saves the model as a
SavedModel under ``<model_dir>/1`` (the TensorFlow Serving layout SageMaker's TF serving reads).

Hyperparameters: see ``dtc_train.common.parse_args``.
"""

import os
import sys

from . import tf_env  # noqa: F401  (before TensorFlow: selects Keras 2)

import horovod  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from . import common, contract, dali_data, observe, tf_model  # noqa: E402
from .tf_model import IMAGE_SHAPE, build_model  # noqa: E402


def _use_gpu(args) -> int | None:
    """Pins this rank to its local GPU and returns its index, or returns None for CPU."""
    gpus = tf.config.list_physical_devices("GPU")
    if args.data_device == "cpu" or not gpus:
        if args.data_device == "gpu":
            raise SystemExit("--data-device gpu: no GPU is visible to TensorFlow")
        return None
    gpu = gpus[hvd.local_rank()]
    tf.config.set_visible_devices(gpu, "GPU")
    tf.config.experimental.set_memory_growth(gpu, True)
    return hvd.local_rank()


def _dataset(pipe, batch_size: int, device_id: int | None):
    from nvidia.dali.plugin.tf import DALIDataset

    with tf.device("/gpu:0" if device_id is not None else "/cpu:0"):
        return DALIDataset(pipeline=pipe, batch_size=batch_size, device_id=device_id,
                           output_shapes=((batch_size, *IMAGE_SHAPE), (batch_size, 1)),
                           output_dtypes=(tf.float32, tf.int32))


class EpochReport(keras.callbacks.Callback):
    """Exact validation over all shards, the metric line and the checkpoint, after each epoch."""

    def __init__(self, args, val_batches, shard: dali_data.Shard, observer: observe.Observer):
        super().__init__()
        self.args, self.val_batches, self.shard, self.observer = args, val_batches, shard, observer
        self.last = {}

    def on_epoch_begin(self, epoch, logs=None):
        self.observer.begin_epoch(epoch + 1)

    def on_train_batch_end(self, batch, logs=None):
        self.observer.step_done()

    def evaluate(self) -> tuple[float, float, int]:
        sums = np.zeros(3, dtype=np.float64)
        for index in range(self.shard.batches):
            images, labels = next(self.val_batches)
            real = self.shard.real_samples(index)
            logits = self.model(images[:real], training=False)
            loss_sum, correct = tf_model.sparse_metrics(logits, tf.reshape(labels[:real], [-1]))
            sums += [loss_sum, correct, real]
        loss_sum, correct, count = hvd.allreduce(tf.constant(sums), op=hvd.Sum, name="validation_sums").numpy()
        return loss_sum / count, correct / count, int(count)

    def on_epoch_end(self, epoch, logs=None):
        self.observer.end_training_steps()
        val_loss, val_accuracy, val_count = self.evaluate()
        self.last = {"val_accuracy": val_accuracy}
        self.observer.end_epoch(epoch + 1, train_loss=logs["loss"], train_accuracy=logs["accuracy"], val_loss=val_loss,
                                val_accuracy=val_accuracy, val_samples=val_count)
        if hvd.rank() != 0:
            return
        save_checkpoint(self.args.checkpoint_dir, epoch + 1, self.model)


CHECKPOINT_NAME = "checkpoint.npz"


def _optimizer_variables(optimizer) -> list:
    # tf-keras's optimizer exposes them as a property whose value is also callable (Horovod's
    # broadcast callback calls it); call it when it is, as Horovod does
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


def save_checkpoint(checkpoint_dir: str, epoch: int, model) -> None:
    """One file, written atomically: the epochs done, the model's weights and the optimizer's
    variables (iteration count, momentum), in their orders (``model.get_weights()``,
    ``optimizer.variables``)."""
    arrays = {"epoch": np.asarray(epoch)}
    arrays.update({f"model_{i}": w for i, w in enumerate(model.get_weights())})
    arrays.update({f"optimizer_{i}": v.numpy() for i, v in enumerate(_optimizer_variables(model.optimizer))})
    common.atomic_write(os.path.join(checkpoint_dir, CHECKPOINT_NAME), lambda tmp: np.savez(tmp, **arrays))


def restore_checkpoint(checkpoint_dir: str, model) -> int:
    """Loads ``save_checkpoint``'s file into ``model`` and its optimizer (rank 0 calls it; the
    broadcast callback hands the state to the other ranks). Returns the epochs done, 0 when there
    is no readable checkpoint (an unreadable one is named in the log)."""
    path = os.path.join(checkpoint_dir, CHECKPOINT_NAME)
    if not os.path.exists(path):
        return 0
    try:
        with np.load(path) as saved:
            arrays = dict(saved)
        epoch = int(arrays["epoch"])
        weights = [arrays[f"model_{i}"] for i in range(len(model.get_weights()))]
        model.set_weights(weights)
        for i, variable in enumerate(_optimizer_variables(model.optimizer)):
            variable.assign(arrays[f"optimizer_{i}"])
    except Exception as error:  # truncated, foreign or from another model: start over
        common.log.warning("ignoring checkpoint %s, which cannot be restored (%s: %s); training starts at epoch 1",
                           path, type(error).__name__, error)
        return 0
    common.log.info("resuming from %s: epoch %d done", path, epoch)
    return epoch


def main(argv: list[str] | None = None) -> int:
    args = common.parse_args(__doc__.split("\n\n")[0], argv)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    common.configure_logging(rank)
    tf.keras.utils.set_random_seed(args.seed)
    device_id = _use_gpu(args)

    data = dali_data.rank_data(contract.channel_dir(args.train_channel), contract.channel_dir(args.validation_channel),
                               args.batch_size, rank, size, args.corrupt_images)
    common.log.info("TensorFlow %s (tf-keras %s), Horovod %s: rank %d/%d (host %s); %s; DALI decodes on %s",
                    tf.__version__, keras.__version__, horovod.__version__, rank, size, contract.current_host(),
                    data.describe(),
                    "gpu" if device_id is not None else "cpu")
    train_pipe, val_pipe = data.pipelines(args.batch_size, rank, size, device_id=device_id, layout="HWC",
                                          seed=args.seed, num_threads=args.dali_threads)
    train_ds, val_ds = (_dataset(p, args.batch_size, device_id) for p in (train_pipe, val_pipe))

    model = build_model()
    optimizer = hvd.DistributedOptimizer(
        keras.optimizers.SGD(learning_rate=args.learning_rate * size, momentum=args.momentum))
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    observer = observe.Observer(args, rank, size, data.steps_per_epoch, args.batch_size * size, "horovod")
    report = EpochReport(args, iter(val_ds), data.val_shard, observer)
    # every rank creates the optimizer's variables now, with the same names, so that the broadcast
    # callback pairs rank 0's restored ones with the others' (created lazily they are named apart)
    model.optimizer.build(model.trainable_variables)
    done = restore_checkpoint(args.checkpoint_dir, model) if rank == 0 else 0
    done = int(hvd.allreduce(tf.constant(done, tf.int64), op=hvd.Sum, name="checkpoint_epoch"))   # rank 0's
    if done >= args.epochs:
        common.log.info("the checkpoint has done all %d epochs: nothing left to train", args.epochs)
    model.fit(train_ds, steps_per_epoch=data.steps_per_epoch, epochs=args.epochs, initial_epoch=min(done, args.epochs),
              verbose=0, callbacks=[
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        report,
    ])

    digest = common.weights_digest(model.get_weights())
    common.emit(f"rank={rank} world_size={size} final_weights_sha256={digest}")
    if rank == 0:
        tf_model.save(model, args.model_dir, val_accuracy=report.last.get("val_accuracy"), epochs=args.epochs,
                      world_size=size, strategy="horovod")
    observer.close()
    hvd.allreduce(tf.constant(0.0), name="finished")   # every rank leaves after rank 0 has saved
    return 0


if __name__ == "__main__":
    sys.exit(main())
