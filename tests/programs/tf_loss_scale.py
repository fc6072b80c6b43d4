"""precision=fp16's loss scaling on the TensorFlow trainers' Keras step across ranks, built as the
trainers build it (``tf_model.loss_scaled``): ``horovod`` (under mpirun, every rank: around
Horovod's ``DistributedOptimizer``, tensorflow_horovod) or ``mirrored`` (one process,
MirroredStrategy over 2 logical CPU devices, gradient-accumulation-steps=2:
tensorflow_mwms.accumulating_train_functions). Two steps on batches of 8 per rank (replica); in
the second, the last rank's (replica's) first sample is 1e5, which overflows float16 there only.
Prints one JSON line per process: the loss scale after each step, whether each step moved the
weights, and the digest of the final weights."""

import json
import sys

# isort: off
from dtc_train import tf_env  # noqa: F401

import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf
import tf_keras as keras

from dtc_train import common, tensorflow_mwms, tf_checkpoint, tf_model
# isort: on

BATCH, MICRO_BATCHES = 8, 2


def _model():
    keras.utils.set_random_seed(1)   # the same initial weights on every rank
    return tf_model.KerasChoice.from_args("digits", None, "off", "fp16").build(10)


def _batches(rank: int, ranks: int, overflowing_rank: int) -> tuple[np.ndarray, np.ndarray]:
    """Two steps' batches of BATCH for ``rank``: the second step's first sample overflows on
    ``overflowing_rank`` only."""
    images = np.random.default_rng(rank).random((2 * BATCH, *tf_model.IMAGE_SHAPE), dtype=np.float32)
    if rank == overflowing_rank:
        images[BATCH] = 1e5
    return images, np.arange(2 * BATCH, dtype=np.int32) % 10


def horovod_steps():
    hvd.init()
    model = _model()
    optimizer = tf_model.loss_scaled(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), "fp16")
    model.compile(optimizer=optimizer, loss=tf_model.training_loss(), metrics=["accuracy"])
    model.optimizer.build(model.trainable_variables)
    hvd_tf.broadcast_variables(model.variables + tf_checkpoint.optimizer_variables(model.optimizer), root_rank=0)
    images, labels = _batches(hvd.rank(), hvd.size(), hvd.size() - 1)
    steps = tf_checkpoint.KerasSteps(model, lambda epoch, first: iter(
        tf.data.Dataset.from_tensor_slices((images, labels)).batch(BATCH)), BATCH)
    return hvd.rank(), hvd.size(), model, steps


def mirrored_steps():
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = _model()
        model.compile(optimizer=tf_model.loss_scaled(keras.optimizers.SGD(0.1), "fp16"),
                      loss=tf_model.training_loss(), metrics=["accuracy"])
        model.optimizer.build(model.trainable_variables)
    # each micro-batch of 2 * BATCH: replica 0 takes its first half, replica 1 its second
    parts = [_batches(replica, 2, 1) for replica in range(2)]
    micro = BATCH // MICRO_BATCHES
    images = np.concatenate([np.concatenate([parts[0][0][i:i + micro], parts[1][0][i:i + micro]])
                             for i in range(0, 2 * BATCH, micro)])
    labels = np.concatenate([np.concatenate([parts[0][1][i:i + micro], parts[1][1][i:i + micro]])
                             for i in range(0, 2 * BATCH, micro)])
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(2 * micro)
    steps = tf_checkpoint.KerasSteps(model, lambda epoch, first: iter(strategy.experimental_distribute_dataset(
        dataset)), 2 * micro, tensorflow_mwms.accumulating_train_functions(model, strategy, MICRO_BATCHES))
    return 0, 2, model, steps


def main(mode: str) -> int:
    rank, world_size, model, steps = horovod_steps() if mode == "horovod" else mirrored_steps()
    steps.begin_epoch(1, 0)
    scales, moved = [], []
    for step in (1, 2):
        before = [w.copy() for w in model.get_weights()]
        steps.train_step(step)
        scales.append(float(model.optimizer.loss_scale))
        moved.append(any(not np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True)))
    print(json.dumps({"rank": rank, "world_size": world_size, "scales": scales, "moved": moved,
                      "digest": common.weights_digest(model.get_weights())}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
