"""Built-in trainer: TensorFlow 2 ``ParameterServerStrategy`` with a ``ClusterCoordinator``
(asynchronous training: variables on the parameter servers, steps on the workers).

Run as the chief with ``TF_CONFIG`` naming ``chief``, ``worker`` and ``ps`` tasks (``train``
with ``sagemaker_parameter_server_enabled`` writes it and starts the servers;
``dtc_entrypoint.launch_tf``). The chief reads the training channel into memory (every host's
part of a ``ShardedByS3Key`` channel, gathered through the parameter servers: ``ps_channel``) and the
coordinator creates a per-worker ``tf.data`` pipeline from it (the data travels with the
dataset function, so workers need no files); each scheduled step takes a batch of
``--batch-size`` on one worker (``--gradient-accumulation-steps`` k: k batches on that worker, their
gradients added up and applied once). After each epoch (``ceil(samples / batch_size)`` batches in
whole steps of k,
``coordinator.join()``) the chief copies the variables into a local model and scores the whole
validation channel exactly; it logs the metric line and at the end saves the SavedModel to
``<model_dir>/1``. Checkpoints (``tf_checkpoint``: the variables read from the parameter
servers, the optimizer's, the position and the epoch's sums so far) on the ``checkpoint-every``
schedule and, when the chief is stopped (SIGTERM), once the steps it had scheduled are done; a
restarted job schedules the rest of that epoch on the batches the uninterrupted job would have
used (one seeded stream over all epochs, the done batches skipped); with one worker, which runs
the scheduled steps in order, it ends with the same weights. Only the chief writes files.

Hyperparameters: ``dtc_train.config`` (backend ``tensorflow_ps``). The learning rate is not
scaled: each worker applies its own updates. The loop's rules (stop, checkpoint, learning-rate
schedule, early stopping) are ``dtc_train.loop``'s; a stop waits for the steps scheduled so far.
"""

import dataclasses
import math
import sys
from collections.abc import Callable

# tf_env first: it selects Keras 2 before TensorFlow is imported; the import order below is kept.
# isort: off
from . import tf_env  # noqa: F401

import numpy as np
import tensorflow as tf
import tf_keras as keras

from . import common, config, contract, image_folder, loop, observe, ps_channel, stop, tf_checkpoint, tf_model
# isort: on


@dataclasses.dataclass(frozen=True)
class Chief:
    """What the parameter-server chief drives, built once by ``main``.

    Attributes:
        checkpoint_dir: where the checkpoint is written (``--checkpoint-dir``).
        coordinator: the ``ClusterCoordinator`` that schedules steps on the workers.
        model / optimizer: the model and optimizer whose variables live on the parameter servers.
        step_function: the ``tf.function`` a worker runs, given ``iterator``: one optimizer step.
        iterator: the per-worker dataset's iterator (``create_per_worker_dataset``).
        sums: the float64 variables of ``loop.SUMS`` the workers add their steps to.
        local: the chief's copy of the model for validation and saving.
        validation: (images float32 [N, S, S, C], labels int32 [N]) of the whole validation channel.
        workers: the worker tasks.
        steps_per_epoch: optimizer steps per epoch (``loop.optimizer_steps``).
    """

    checkpoint_dir: str
    coordinator: tf.distribute.coordinator.ClusterCoordinator
    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    step_function: Callable
    iterator: object
    sums: tuple[tf.Variable, ...]
    local: keras.Model
    validation: tuple[np.ndarray, np.ndarray]
    workers: int
    steps_per_epoch: int


class ParameterServerBackend:
    """The loop's backend (``loop.Backend``) for the parameter-server chief (``Chief``): a step is
    scheduled on whichever worker is free (``ClusterCoordinator.schedule``, asynchronous), its
    sums kept in variables on the parameter servers, read once the scheduled steps are done
    (``coordinator.join``); validation and the checkpoint on the chief. One process drives the
    job, so a sum over the ranks is the value itself.
    """

    rank, rate_scale = 0, 1   # each worker applies its own updates: the rate is not scaled

    def __init__(self, chief: Chief):
        self.chief = chief
        self.world_size, self.steps_per_epoch = chief.workers, chief.steps_per_epoch

    def begin_epoch(self, epoch: int, first_step: int) -> None:
        self.chief.coordinator.join()
        for variable in self.chief.sums:
            variable.assign(0.0)

    def set_learning_rate(self, rate: float) -> None:
        self.chief.optimizer.learning_rate.assign(rate)

    def train_step(self, global_step: int) -> np.ndarray:
        self.chief.coordinator.schedule(self.chief.step_function, args=(self.chief.iterator,))
        return np.zeros(len(loop.SUMS))   # counted in chief.sums when the step has run

    def total(self, sums: np.ndarray, name: str) -> np.ndarray:
        self.chief.coordinator.join()   # every step scheduled so far is done
        return sums + np.array([float(variable.numpy()) for variable in self.chief.sums])

    def sum_scalar(self, value: float, name: str) -> float:
        return value

    def end_training_steps(self) -> None:
        self.chief.coordinator.join()

    def evaluate(self) -> tuple[float, float, int]:
        chief = self.chief
        chief.local.set_weights(chief.model.get_weights())
        images, labels = chief.validation
        loss_sum, correct = tf_model.sparse_metrics(chief.local(images, training=False), labels)
        return loss_sum / len(labels), correct / len(labels), len(labels)

    def save(self, epoch: int, step: int, train_sums: np.ndarray | None, plateau_state: dict) -> None:
        self.chief.coordinator.join()
        tf_checkpoint.save(self.chief.checkpoint_dir, self.chief.model, self.chief.optimizer,
                           loop.Resume(epoch, step, train_sums, plateau_state))


def main(argv: list[str] | None = None) -> int:
    args = config.parse(config.TENSORFLOW_PS, argv, __doc__.split("\n\n")[0])
    choice = tf_model.KerasChoice.from_args(args.model, args.image_size, args.augment, args.precision,
                                           args.pretrained_weights)
    stop_request = stop.StopRequest()
    common.configure_logging(0)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type != "chief":
        raise SystemExit(f"TF_CONFIG names task {resolver.task_type!r}: this trainer runs as the chief; "
                         "workers and parameter servers run dtc_entrypoint.tf_server")
    tf.keras.utils.set_random_seed(args.seed)
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    stop_request.install()   # back from TensorFlow's own SIGTERM handler (StopRequest.install)
    cluster = resolver.cluster_spec().as_dict()
    workers, servers = len(cluster.get("worker", [])), len(cluster.get("ps", []))

    spec = choice.images
    training, train_contents = ps_channel.read_channel(args.train_channel, args.corrupt_images, cluster)
    validation, val_contents = ps_channel.read_channel(args.validation_channel, args.corrupt_images, cluster)
    for listing in (training, validation):
        listing.log_ignored(common.log)
    train_images, train_labels = image_folder.read(training, spec, spec.eval_resize if spec.augment else spec.size,
                                                   train_contents)
    val_images, val_labels = image_folder.read(validation, spec, contents=val_contents)
    del train_contents, val_contents
    micro_batches = args.gradient_accumulation_steps
    steps = loop.optimizer_steps(math.ceil(len(train_labels) / args.batch_size), micro_batches, args.batch_size)
    common.log.info("TensorFlow %s ParameterServerStrategy: chief on %s, %d workers, %d parameter servers; "
                    "%d training images (%d steps/epoch), %d validation images", tf.__version__,
                    contract.current_host(), workers, servers, len(train_labels), steps, len(val_labels))
    if micro_batches > 1:
        common.log.info("gradient accumulation: %d micro-batches of %d per optimizer step, all on the worker the "
                        "step is scheduled on (%d samples per step), %d steps per epoch", micro_batches,
                        args.batch_size, micro_batches * args.batch_size, steps)

    def dataset_fn(batches_done: int):
        # one stream over every epoch (reshuffled each pass, from the seed); a resumed job skips
        # the batches the checkpoint's steps took, so its steps see the batches they would have
        stream = (tf.data.Dataset.from_tensor_slices((train_images, train_labels))
                  .shuffle(len(train_labels), seed=args.seed).repeat())
        if spec.augment:   # each sample's crop from the seed and its position in the stream
            stream = stream.enumerate().map(lambda index, sample: (image_folder.augment(
                sample[0], tf.stack([tf.constant(args.seed, tf.int64), index]), spec.size), sample[1]))
        return (stream.batch(args.batch_size, drop_remainder=True).skip(batches_done).prefetch(2))

    with strategy.scope():
        model = choice.build(len(training.classes))
        tf_model.start_from_pretrained(model, choice, 0)   # the coordinator (chief) assigns the PS variables
        optimizer = keras.optimizers.SGD(learning_rate=args.learning_rate, momentum=args.momentum)
        sums = tuple(tf.Variable(0.0, dtype=tf.float64, trainable=False, aggregation=tf.VariableAggregation.SUM)
                     for _ in loop.SUMS)
        optimizer.build(model.trainable_variables)   # its variables exist before a checkpoint is restored
    loss_fn = tf_model.training_loss(args.label_smoothing, reduction=keras.losses.Reduction.NONE)
    loss_sum, correct, seen = sums

    @tf.function
    def train_step(iterator):
        # one optimizer step on micro_batches batches, all on the worker this step runs on: each
        # batch's mean loss over micro_batches, the gradients added up, applied once (the mean over
        # the k equal batches: a k-times-larger batch's step)
        def replica_fn(batches):
            gradients = None
            for images, labels in batches:
                with tf.GradientTape() as tape:
                    logits = model(images, training=True)
                    loss = tf.reduce_mean(loss_fn(labels, logits))   # one worker's batch: its own mean
                    share = loss / micro_batches
                batch_gradients = tape.gradient(share, model.trainable_variables)
                gradients = batch_gradients if gradients is None else [
                    total + gradient for total, gradient in zip(gradients, batch_gradients, strict=True)]
                batch = tf.cast(tf.shape(labels)[0], tf.float64)
                loss_sum.assign_add(tf.cast(loss, tf.float64) * batch)
                correct.assign_add(tf.reduce_sum(tf.cast(
                    tf.argmax(logits, 1, output_type=tf.int32) == labels, tf.float64)))
                seen.assign_add(batch)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))

        strategy.run(replica_fn, args=([next(iterator) for _ in range(micro_batches)],))

    resume = tf_checkpoint.restore_checkpoint(args.checkpoint_dir, model, optimizer)
    iterator = iter(coordinator.create_per_worker_dataset(
        lambda: dataset_fn((resume.epoch * steps + resume.step) * micro_batches)))
    local = choice.build(len(training.classes))   # the chief's copy for validation and saving
    backend = ParameterServerBackend(Chief(args.checkpoint_dir, coordinator, model, optimizer, train_step, iterator,
                                           sums, local, (val_images, val_labels), workers, steps))
    # steps are scheduled asynchronously on the workers: no progress lines within an epoch
    observer = observe.Observer(dataclasses.replace(args, progress_seconds=0), 0, workers, steps,
                                args.batch_size * micro_batches, "parameter_server")

    def finish(val_accuracy: float) -> None:
        loop.emit_digest(0, workers, local.get_weights())
        tf_model.save(local, args.model_dir, choice.describe(training.classes, val_accuracy=val_accuracy,
                                                             epochs=args.epochs, world_size=workers,
                                                             strategy="parameter_server"))

    return loop.run(loop.Rules.of(args), backend, observer, stop_request, resume, finish)


if __name__ == "__main__":
    sys.exit(main())
