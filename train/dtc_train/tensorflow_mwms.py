"""Built-in trainer: TensorFlow ``MultiWorkerMirroredStrategy`` (synchronous data parallelism,
one process per host using its local devices), input through ``tf.data``.

Run with ``TF_CONFIG`` listing the workers (``train`` with
``sagemaker_multi_worker_mirrored_strategy_enabled`` writes it); without it, one worker.
The training channel is read into memory and auto-sharded by the strategy (``DATA`` policy:
each worker takes its part of every global batch); gradients are
all-reduced by the strategy's collectives; each epoch every worker scores the whole validation
channel with its replica of the weights (identical on all workers, so the accuracy is exact
and the same everywhere). Worker 0 (the chief) logs one metric line per epoch, writes an atomic
checkpoint each epoch and saves the SavedModel to ``<model_dir>/1``; the others save to a
scratch directory, as the strategy requires every worker to take part in saving.

Hyperparameters: see ``dtc_train.common.parse_args`` (``--batch-size`` is per worker).
"""

import json
import math
import os
import sys
import tempfile

from . import tf_env  # noqa: F401  (before TensorFlow: selects Keras 2)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from . import common, contract, image_folder, observe, tf_model  # noqa: E402


class EpochReport(keras.callbacks.Callback):
    """Validation over the whole channel, the metric line and the chief's checkpoint, per epoch."""

    def __init__(self, args, validation: tuple[np.ndarray, np.ndarray], is_chief: bool, observer: observe.Observer):
        super().__init__()
        self.args, self.validation, self.is_chief, self.observer = args, validation, is_chief, observer
        self.val_accuracy = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self.observer.begin_epoch(epoch + 1)

    def on_train_batch_end(self, batch, logs=None):
        self.observer.step_done()

    def on_epoch_end(self, epoch, logs=None):
        self.observer.end_training_steps()
        images, labels = self.validation
        loss_sum, correct = tf_model.sparse_metrics(self.model(images, training=False), labels)
        self.val_accuracy = correct / len(labels)
        self.observer.end_epoch(epoch + 1, train_loss=logs["loss"], train_accuracy=logs["accuracy"],
                                val_loss=loss_sum / len(labels), val_accuracy=self.val_accuracy, val_samples=len(labels))
        if not self.is_chief:
            return
        common.atomic_write(os.path.join(self.args.checkpoint_dir, "checkpoint.weights.h5"), self.model.save_weights)
        common.write_json(os.path.join(self.args.checkpoint_dir, "checkpoint.json"), {"epoch": epoch + 1})


def main(argv: list[str] | None = None) -> int:
    args = common.parse_args(__doc__.split("\n\n")[0], argv)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    resolver = strategy.cluster_resolver
    task_type, task_id = resolver.task_type or "worker", resolver.task_id or 0
    workers = len(json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {}).get("worker", [None]))
    is_chief = task_id == 0
    common.configure_logging(task_id)
    tf.keras.utils.set_random_seed(args.seed)

    shown = common.log if is_chief else None   # ignored files named once
    train_images, train_labels = image_folder.load(contract.channel_dir(args.train_channel), shown, args.corrupt_images)
    validation = image_folder.load(contract.channel_dir(args.validation_channel), shown, args.corrupt_images)
    replicas = strategy.num_replicas_in_sync
    global_batch = args.batch_size * replicas
    steps = math.ceil(len(train_labels) / global_batch)
    common.log.info("TensorFlow %s MultiWorkerMirroredStrategy: %s %d of %d workers (host %s), %d replicas on %s; "
                    "%d training images (%d steps/epoch), %d validation images", tf.__version__, task_type, task_id,
                    workers, contract.current_host(), replicas, ", ".join(strategy.extended.worker_devices),
                    len(train_labels), steps, len(validation[1]))

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = (tf.data.Dataset.from_tensor_slices((train_images, train_labels))
               .shuffle(len(train_labels), seed=args.seed, reshuffle_each_iteration=True)
               .repeat().batch(global_batch, drop_remainder=True).with_options(options))

    with strategy.scope():
        model = tf_model.build_model()
        model.compile(optimizer=keras.optimizers.SGD(learning_rate=args.learning_rate * replicas, momentum=args.momentum),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    observer = observe.Observer(args, task_id, workers, steps, global_batch, "multi_worker_mirrored")
    report = EpochReport(args, validation, is_chief, observer)
    model.fit(dataset, epochs=args.epochs, steps_per_epoch=steps, verbose=0, callbacks=[report])

    common.emit(f"rank={task_id} world_size={workers} final_weights_sha256={common.weights_digest(model.get_weights())}")
    model_dir = args.model_dir if is_chief else tempfile.mkdtemp(prefix="dtc-mwms-worker-")
    tf_model.save(model, model_dir, val_accuracy=report.val_accuracy, epochs=args.epochs, world_size=workers,
                  strategy="multi_worker_mirrored_strategy")
    observer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
