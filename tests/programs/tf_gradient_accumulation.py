"""Gradient accumulation on the TensorFlow trainers' Keras step (dtc_train.tf_checkpoint.KerasSteps)
as the trainers build it: ``horovod`` (under mpirun, every rank: Horovod's
``DistributedOptimizer(backward_passes_per_step=k)``, tensorflow_horovod) or ``mirrored`` (one
process, MirroredStrategy over 2 logical CPU devices: tensorflow_mwms.accumulating_train_functions).
3 steps of 4 batches of 8 per rank (replica) against 3 steps of one batch of 32 holding the same
samples, from the same weights. Prints one JSON line per process: the largest weight difference
between the two, the largest change from the start, each run's summed samples, and (mirrored)
whether the weights moved only on a step's last batch. Horovod's allreduces are counted by the
test from Horovod's timeline (HOROVOD_TIMELINE)."""

import functools
import json
import sys

# isort: off
from dtc_train import tf_env  # noqa: F401

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf
import tf_keras as keras

from dtc_train import tensorflow_mwms, tf_checkpoint, tf_model
# isort: on

STEPS, SAMPLES, MICRO_BATCHES = 3, 32, 4


def horovod_run(micro_batches: int, images: np.ndarray, labels: np.ndarray):
    keras.utils.set_random_seed(1)   # the same initial weights on every rank and in both runs
    model = tf_model.build_model()
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9),
                                         backward_passes_per_step=micro_batches, average_aggregated_gradients=True)
    model.compile(optimizer=optimizer, loss=tf_model.training_loss(), metrics=["accuracy"])
    batch = SAMPLES // micro_batches

    def epoch_input(epoch, first_batch):
        return iter(tf.data.Dataset.from_tensor_slices((images, labels)).batch(batch).skip(first_batch))

    steps = tf_checkpoint.KerasSteps(model, epoch_input, batch, (model.make_train_function(),) * micro_batches)
    return model, steps


def mirrored_run(strategy: tf.distribute.Strategy, micro_batches: int, images: np.ndarray, labels: np.ndarray):
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = tf_model.build_model()
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss=tf_model.training_loss(),
                      metrics=["accuracy"])
        model.optimizer.build(model.trainable_variables)
    batch = SAMPLES // micro_batches   # global: both replicas' halves

    def epoch_input(epoch, first_batch):
        dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(batch).skip(first_batch)
        return iter(strategy.experimental_distribute_dataset(dataset))

    functions = (tensorflow_mwms.accumulating_train_functions(model, strategy, micro_batches)
                 if micro_batches > 1 else None)
    return model, tf_checkpoint.KerasSteps(model, epoch_input, batch, functions)


def weights_move_only_on_a_steps_last_batch(strategy: tf.distribute.Strategy, images: np.ndarray,
                                            labels: np.ndarray) -> bool:
    """Mirrored: the accumulating functions one by one: the first k - 1 leave the weights as they
    were (nothing applied, so nothing all-reduced), the k-th changes them."""
    model, steps = mirrored_run(strategy, MICRO_BATCHES, images, labels)
    steps.begin_epoch(1, 0)
    start = [w.copy() for w in model.get_weights()]
    for function in steps.train_functions[:-1]:
        function(steps.iterator)
        if not all(np.array_equal(a, b) for a, b in zip(start, model.get_weights(), strict=True)):
            return False
    steps.train_functions[-1](steps.iterator)
    return not all(np.array_equal(a, b) for a, b in zip(start, model.get_weights(), strict=True))


def main(mode: str) -> int:
    if mode == "horovod":
        hvd.init()
        rank, world_size, run = hvd.rank(), hvd.size(), horovod_run
    else:
        strategy, _ = tensorflow_mwms.choose_strategy(2)
        rank, world_size = 0, strategy.num_replicas_in_sync
        run = functools.partial(mirrored_run, strategy)
    rng = np.random.default_rng(rank)   # each rank its own samples
    images = rng.standard_normal((STEPS * SAMPLES, *tf_model.IMAGE_SHAPE)).astype(np.float32)
    labels = rng.integers(0, 10, STEPS * SAMPLES).astype(np.int32)
    results = {}
    for micro_batches in (1, MICRO_BATCHES):
        model, steps = run(micro_batches, images, labels)
        start = [w.copy() for w in model.get_weights()]
        steps.begin_epoch(1, 0)
        sums = sum(steps.train_step(step) for step in range(1, STEPS + 1))
        results[micro_batches] = (start, model.get_weights(), sums)
    (start, whole, whole_sums), (_, accumulated, accumulated_sums) = results[1], results[MICRO_BATCHES]
    result = {
        "rank": rank, "world_size": world_size,
        "max_weight_difference": max(float(np.abs(a - b).max()) for a, b in zip(whole, accumulated, strict=True)),
        "max_weight_change": max(float(np.abs(a - b).max()) for a, b in zip(start, whole, strict=True)),
        "samples": [float(whole_sums[2]), float(accumulated_sums[2])],
    }
    if mode == "mirrored":
        result["moved_only_on_last_batch"] = weights_move_only_on_a_steps_last_batch(strategy, images, labels)
    sys.stdout.write(json.dumps(result) + "\n")   # one write: every rank prints one
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "horovod"))
