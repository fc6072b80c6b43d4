"""Built-in trainer: TensorFlow 2 ``ParameterServerStrategy`` with a ``ClusterCoordinator``
(asynchronous training: variables on the parameter servers, steps on the workers).

Run as the chief with ``TF_CONFIG`` naming ``chief``, ``worker`` and ``ps`` tasks (``train``
with ``sagemaker_parameter_server_enabled`` writes it and starts the servers;
``dtc_entrypoint.launch_tf``). The chief reads the training channel into memory and the
coordinator creates a per-worker ``tf.data`` pipeline from it (the data travels with the
dataset function, so workers need no files); each scheduled step takes a batch of
``--batch-size`` on one worker. After each epoch (``ceil(samples / batch_size)`` steps,
``coordinator.join()``) the chief copies the variables into a local model and scores the whole
validation channel exactly; it logs the metric line and at the end saves the SavedModel to
``<model_dir>/1``. Checkpoints (``tf_checkpoint``: the variables read from the parameter
servers, the optimizer's, the position and the epoch's sums so far) on the ``checkpoint-every``
schedule and, when the chief is stopped (SIGTERM), once the steps it had scheduled are done; a
restarted job schedules the rest of that epoch on the batches the uninterrupted job would have
used (one seeded stream over all epochs, the done batches skipped); with one worker, which runs
the scheduled steps in order, it ends with the same weights. Only the chief writes files.

Hyperparameters: see ``dtc_train.common.parse_args``. The learning rate is not scaled: each
worker applies its own updates.
"""

import math
import sys

# tf_env first: it selects Keras 2 before TensorFlow is imported; the import order below is kept.
# isort: off
from . import tf_env  # noqa: F401

import tensorflow as tf
import tf_keras as keras

from . import common, contract, image_folder, observe, stop, tf_checkpoint, tf_model
# isort: on


def main(argv: list[str] | None = None) -> int:
    args = common.parse_args(__doc__.split("\n\n")[0], argv)
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

    for channel_name in (args.train_channel, args.validation_channel):
        contract.refuse_host_sharded(channel_name, "parameter_server")
    train_images, train_labels = image_folder.load(contract.channel_dir(args.train_channel), common.log,
                                                   args.corrupt_images)
    val_images, val_labels = image_folder.load(contract.channel_dir(args.validation_channel), common.log,
                                               args.corrupt_images)
    steps = math.ceil(len(train_labels) / args.batch_size)
    common.log.info("TensorFlow %s ParameterServerStrategy: chief on %s, %d workers, %d parameter servers; "
                    "%d training images (%d steps/epoch), %d validation images", tf.__version__,
                    contract.current_host(), workers, servers, len(train_labels), steps, len(val_labels))

    def dataset_fn(batches_done: int):
        # one stream over every epoch (reshuffled each pass, from the seed); a resumed job skips
        # the batches the checkpoint's steps took, so its steps see the batches they would have
        return (tf.data.Dataset.from_tensor_slices((train_images, train_labels))
                .shuffle(len(train_labels), seed=args.seed).repeat()
                .batch(args.batch_size, drop_remainder=True).skip(batches_done).prefetch(2))

    with strategy.scope():
        model = tf_model.build_model()
        optimizer = keras.optimizers.SGD(learning_rate=args.learning_rate, momentum=args.momentum)
        loss_sum = tf.Variable(0.0, dtype=tf.float64, trainable=False, aggregation=tf.VariableAggregation.SUM)
        correct = tf.Variable(0.0, dtype=tf.float64, trainable=False, aggregation=tf.VariableAggregation.SUM)
        seen = tf.Variable(0.0, dtype=tf.float64, trainable=False, aggregation=tf.VariableAggregation.SUM)
        optimizer.build(model.trainable_variables)   # its variables exist before a checkpoint is restored
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=keras.losses.Reduction.NONE)

    @tf.function
    def train_step(iterator):
        def replica_fn(images, labels):
            with tf.GradientTape() as tape:
                logits = model(images, training=True)
                loss = tf.reduce_mean(loss_fn(labels, logits))   # one worker's batch: its own mean
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables,
                                          strict=True))
            batch = tf.cast(tf.shape(labels)[0], tf.float64)
            loss_sum.assign_add(tf.cast(loss, tf.float64) * batch)
            correct.assign_add(tf.reduce_sum(tf.cast(
                tf.argmax(logits, 1, output_type=tf.int32) == labels, tf.float64)))
            seen.assign_add(batch)

        images, labels = next(iterator)
        strategy.run(replica_fn, args=(images, labels))

    local = tf_model.build_model()   # the chief's copy for validation and saving
    sums = (loss_sum, correct, seen)
    epoch, step, extra = tf_checkpoint.restore_checkpoint(args.checkpoint_dir, model, optimizer)
    iterator = iter(coordinator.create_per_worker_dataset(lambda: dataset_fn(epoch * steps + step)))
    if step >= steps:   # stopped after an epoch's last step, before its validation
        epoch, step = epoch + 1, 0
    if step:
        for variable, value in zip(sums, extra.get("train_sums", (0.0, 0.0, 0.0)), strict=True):
            variable.assign(float(value))

    def save(epochs_done: int, steps_done: int) -> None:
        tf_checkpoint.save_checkpoint(args.checkpoint_dir, model, optimizer, epochs_done, steps_done,
                                      train_sums=[float(v.numpy()) for v in sums])

    # Steps are scheduled asynchronously on the workers: no progress lines within an epoch.
    observer = observe.Observer(args, 0, workers, steps, args.batch_size, "parameter_server")
    val_accuracy = 0.0
    stop_request.training_begins()
    try:
        for epoch_number in range(epoch + 1, args.epochs + 1):
            first_step = step if epoch_number == epoch + 1 else 0
            observer.begin_epoch(epoch_number, first_step)
            if not first_step:
                for variable in sums:
                    variable.assign(0.0)
            for step_number in range(first_step + 1, steps + 1):
                coordinator.schedule(train_step, args=(iterator,))
                due = args.checkpoint_every.due_after_step((epoch_number - 1) * steps + step_number)
                if stop_request.signum or due:
                    coordinator.join()   # every step scheduled so far is done
                    save(epoch_number - 1, step_number)
                if stop_request.signum:
                    raise stop.Stopped.after_checkpoint(stop_request.signum, epoch_number, step_number,
                                                        args.checkpoint_dir, announce=True)
            coordinator.join()
            observer.end_training_steps()
            local.set_weights(model.get_weights())
            val_loss_sum, val_correct = tf_model.sparse_metrics(local(val_images, training=False), val_labels)
            val_accuracy = val_correct / len(val_labels)
            count = float(seen.numpy())
            observer.end_epoch(epoch_number, train_loss=float(loss_sum.numpy()) / count,
                               train_accuracy=float(correct.numpy()) / count, val_loss=val_loss_sum / len(val_labels),
                               val_accuracy=val_accuracy, val_samples=len(val_labels))
            if args.checkpoint_every.due_after_epoch(epoch_number) or epoch_number == args.epochs:
                save(epoch_number, 0)
    except stop.Stopped as stopped:
        observer.close()
        return stopped.exit_code
    if epoch >= args.epochs:
        common.log.info("the checkpoint has done all %d epochs: nothing left to train", args.epochs)
        local.set_weights(model.get_weights())
        val_accuracy = tf_model.sparse_metrics(local(val_images, training=False), val_labels)[1] / len(val_labels)

    common.emit(f"rank=0 world_size={workers} final_weights_sha256={common.weights_digest(local.get_weights())}")
    tf_model.save(local, args.model_dir, val_accuracy=val_accuracy, epochs=args.epochs, world_size=workers,
                  strategy="parameter_server")
    observer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
