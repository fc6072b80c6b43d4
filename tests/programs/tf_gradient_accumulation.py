"""Gradient accumulation on the TensorFlow Horovod trainer's step (dtc_train.tf_checkpoint.KerasSteps
with Horovod's ``DistributedOptimizer(backward_passes_per_step=k)``, as tensorflow_horovod builds it),
under mpirun on every rank: 3 steps of 4 micro-batches of 8 against 3 steps of one batch of 32
holding the same samples, from the same weights. Prints one JSON line: the largest weight
difference between the two, the largest change from the start, each run's summed samples, and
the allreduces each run made (Horovod's timeline, HOROVOD_TIMELINE, counted by the test)."""

import json
import sys

# isort: off
from dtc_train import tf_env  # noqa: F401

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf
import tf_keras as keras

from dtc_train import tf_checkpoint, tf_model
# isort: on

STEPS, SAMPLES = 3, 32


def run(micro_batches: int, images: np.ndarray, labels: np.ndarray):
    keras.utils.set_random_seed(1)   # the same initial weights on every rank and in both runs
    model = tf_model.build_model()
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9),
                                         backward_passes_per_step=micro_batches, average_aggregated_gradients=True)
    model.compile(optimizer=optimizer, loss=tf_model.training_loss(), metrics=["accuracy"])
    batch = SAMPLES // micro_batches

    def epoch_input(epoch, first_batch):
        return iter(tf.data.Dataset.from_tensor_slices((images, labels)).batch(batch).skip(first_batch))

    steps = tf_checkpoint.KerasSteps(model, epoch_input, batch, batches_per_step=micro_batches)
    start = [w.copy() for w in model.get_weights()]
    steps.begin_epoch(1, 0)
    sums = sum(steps.train_step(step) for step in range(1, STEPS + 1))
    return start, model.get_weights(), sums


def main() -> int:
    hvd.init()
    rng = np.random.default_rng(hvd.rank())   # each rank its own samples
    images = rng.standard_normal((STEPS * SAMPLES, *tf_model.IMAGE_SHAPE)).astype(np.float32)
    labels = rng.integers(0, 10, STEPS * SAMPLES).astype(np.int32)
    start, whole, whole_sums = run(1, images, labels)
    _, accumulated, accumulated_sums = run(4, images, labels)
    print(json.dumps({
        "rank": hvd.rank(), "world_size": hvd.size(),
        "max_weight_difference": max(float(np.abs(a - b).max()) for a, b in zip(whole, accumulated, strict=True)),
        "max_weight_change": max(float(np.abs(a - b).max()) for a, b in zip(start, whole, strict=True)),
        "samples": [float(whole_sums[2]), float(accumulated_sums[2])],
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
