"""Built-in trainer: TensorFlow's mirrored strategies (synchronous data parallelism, one process
per host using every local device), input through ``tf.data``.

With ``TF_CONFIG`` listing the workers (``train`` with
``sagemaker_multi_worker_mirrored_strategy_enabled`` writes it): ``MultiWorkerMirroredStrategy``.
Without it (one host, no distribution): ``MirroredStrategy`` over every visible GPU (NCCL
all-reduce), as SageMaker's TensorFlow containers expect a single-process script to do (the
seed articles' replacement for Keras's removed ``multi_gpu_model``); on a host without GPUs one
CPU replica, or ``cpu-replicas`` logical CPU devices (TensorFlow's own way to test mirrored code
without GPUs: ``tf.config.set_logical_device_configuration``).
The training channel is read into memory and auto-sharded by the strategy (``DATA`` policy:
each replica takes its part of every global batch of ``batch-size`` x replicas); gradients are
all-reduced by the strategy's collectives; each epoch every worker scores the whole validation
channel with its replica of the weights (identical on all workers, so the accuracy is exact
and the same everywhere). A ``ShardedByS3Key`` channel (each host holding its part:
``contract.host_sharded``) is read per worker instead: each worker trains on its host's part
(``distribute_datasets_from_function``, its replicas taking successive batches of
``batch-size``), every worker runs the smallest part's steps (``dali_data.rank_data``: the rest
counted in the log), labels come from every host's class folders, and a sharded validation
channel's sums are added over the workers, so the accuracy stays exact over all its files.
Worker 0 (the chief) logs one metric line per epoch, writes the
checkpoint (``tf_checkpoint``: on the ``checkpoint-every`` schedule and when the job is stopped,
after the step in which any worker got SIGTERM) and saves the SavedModel to ``<model_dir>/1``;
the others save to a scratch directory, as the strategy requires every worker to take part in
saving. A restarted job resumes at the checkpoint's step with the same global batches an
uninterrupted job would have read (each epoch shuffled by the seed and the epoch, the steps
done skipped).

Hyperparameters: see ``dtc_train.common.parse_args`` (``--batch-size`` is per replica), and
``--cpu-replicas`` (above).
"""

import argparse
import base64
import itertools
import json
import os
import pickle
import sys
import tempfile
from collections.abc import Callable

# tf_env first: it selects Keras 2 before TensorFlow is imported; the import order below is kept.
# isort: off
from . import tf_env  # noqa: F401

import numpy as np
import tensorflow as tf
import tf_keras as keras
from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
from tensorflow.python.distribute import multi_worker_util
from tensorflow.python.eager import context

from . import common, contract, dali_data, image_folder, observe, stop, tf_checkpoint, tf_model
# isort: on


class EpochReport(keras.callbacks.Callback):
    """Validation over the whole channel and the metric line, per epoch. ``sum_over_workers``:
    for a validation channel each worker holds a part of (``_worker_totals``), else ``None``."""

    def __init__(self, validation: tuple[np.ndarray, np.ndarray], observer: observe.Observer,
                 stopper: tf_checkpoint.StopAndCheckpoint,
                 sum_over_workers: Callable[[list[float]], np.ndarray] | None = None):
        super().__init__()
        self.validation, self.observer, self.stopper = validation, observer, stopper
        self.sum_over_workers = sum_over_workers
        self.val_accuracy = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self.observer.begin_epoch(epoch + 1, self.stopper.first_step)

    def on_train_batch_end(self, batch, logs=None):
        self.observer.step_done()

    def on_epoch_end(self, epoch, logs=None):
        self.observer.end_training_steps()
        images, labels = self.validation
        loss_sum, correct = tf_model.sparse_metrics(self.model(images, training=False), labels)
        count = len(labels)
        if self.sum_over_workers is not None:
            loss_sum, correct, count = self.sum_over_workers([loss_sum, correct, count])
        self.val_accuracy = float(correct / count)
        self.observer.end_epoch(epoch + 1, train_loss=logs["loss"], train_accuracy=logs["accuracy"],
                                val_loss=float(loss_sum / count), val_accuracy=self.val_accuracy,
                                val_samples=int(round(count)))


def _sum_over_workers(strategy: tf.distribute.Strategy) -> Callable[[float], float]:
    """An all-reduce of one float over the workers (the strategy's collectives, run eagerly;
    a worker with several replicas counts it once per replica, which keeps zero zero)."""

    def sum_over_workers(value: float) -> float:
        per_replica = strategy.run(lambda: tf.constant(value, tf.float32))
        return float(strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None))

    return sum_over_workers


def _sum_of_contributions(strategy: tf.distribute.Strategy, value, contributes: Callable) -> np.ndarray:
    """float64 ``value`` summed over the replicas for which ``contributes(replica id in sync)``
    holds (the others add zeros): the strategy's all-reduce, run eagerly."""
    value = np.asarray(value, dtype=np.float64)

    def contribution():
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        return tf.where(contributes(replica), tf.constant(value), tf.zeros_like(value))

    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(contribution), axis=None).numpy()


def _from_chief(strategy: tf.distribute.Strategy, value: np.ndarray) -> np.ndarray:
    """The chief's ``value`` on every worker (only the first replica in sync, the chief's, contributes)."""
    return _sum_of_contributions(strategy, value, lambda replica: replica == 0)


def _worker_totals(strategy: tf.distribute.Strategy) -> Callable[[list[float]], np.ndarray]:
    """``values -> their float64 sums over the workers``, each worker counted once: its first
    replica contributes (MultiWorkerMirrored numbers a worker's replicas consecutively)."""
    local_replicas = len(strategy.extended.worker_devices)
    return lambda values: _sum_of_contributions(strategy, values, lambda replica: replica % local_replicas == 0)


def _allgather_object(task_id: int, workers: int) -> Callable[[object], list]:
    """``obj -> [worker 0's, worker 1's, ...]`` on every worker, through the key-value store of
    TensorFlow's coordination service (each call its own keys; a get waits for the key). For the
    few small objects ``dali_data.rank_data`` exchanges about ShardedByS3Key channels."""
    calls = itertools.count()

    def allgather(obj) -> list:
        key = f"dtc_train/allgather/{next(calls)}"
        store = context.context()
        store.set_config_key_value(f"{key}/{task_id}", base64.b64encode(pickle.dumps(obj)).decode())
        return [pickle.loads(base64.b64decode(store.get_config_key_value(f"{key}/{worker}")))
                for worker in range(workers)]

    return allgather


def _restore_on_every_worker(strategy, args, model, is_chief: bool) -> tuple[int, int]:
    """Reads the chief's checkpoint (its host's checkpoint directory) and hands its position,
    weights and optimizer state to every worker, whose own directory may hold none or an older
    one. Returns (epochs done, steps of the next epoch done)."""
    position = (tf_checkpoint.restore_checkpoint(args.checkpoint_dir, model, model.optimizer)[:2]
                if is_chief else (0, 0))
    epoch, step = (int(v) for v in _from_chief(strategy, position))
    if epoch or step:
        variables = model.weights + tf_checkpoint.optimizer_variables(model.optimizer)
        for variable in variables:
            variable.assign(_from_chief(strategy, variable.numpy()).astype(variable.dtype.as_numpy_dtype))
    return epoch, step


def _replicas(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"use a whole number of at least 1, got {text!r}")
    return int(text)


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cpu-replicas", type=_replicas, default=1,
                        help="one host without GPUs and no distribution: mirror over this many logical CPU "
                             "devices (to exercise MirroredStrategy without GPUs)")


# How long TensorFlow's coordination service waits for a task's heartbeat before it fails the job
# naming that host. TensorFlow's own default is 10 s (CoordinationServiceConfig
# heartbeat_timeout_in_ms = 0 means 10 s), and a busy host can miss that: two hosts' containers
# sharing 2 cores failed at the first step with "Task /job:worker/replica:0/task:0 heartbeat
# timeout", the leader timing out its own task (fresh-clone make test, 2026-11-24). 20 s doubles
# the margin and keeps a lost host's detection well within a minute (tests/cluster).
HEARTBEAT_TIMEOUT_S = 20


def configure_heartbeats(cluster_spec: tf.train.ClusterSpec, timeout_s: int = HEARTBEAT_TIMEOUT_S) -> None:
    """Configures TensorFlow's coordination service as ``MultiWorkerMirroredStrategy`` would
    (standalone, leader ``multi_worker_util.coordination_leader``, the chief and worker jobs
    coordinated: tensorflow/python/distribute/collective_all_reduce_strategy.py, TF 2.21) but with
    a heartbeat timeout of ``timeout_s`` seconds. The strategy keeps a service configured before
    it is built. Call before building the strategy."""
    jobs = [coordination_config_pb2.CoordinatedJob(name=job, num_tasks=cluster_spec.num_tasks(job))
            for job in ("chief", "worker") if job in cluster_spec.jobs]
    context.context().configure_coordination_service(
        service_type="standalone", service_leader=multi_worker_util.coordination_leader(cluster_spec),
        coordinated_jobs=jobs, heartbeat_timeout_in_ms=timeout_s * 1000)


def choose_strategy(cpu_replicas: int) -> tuple[tf.distribute.Strategy, str]:
    """``MultiWorkerMirroredStrategy`` under ``TF_CONFIG``, else ``MirroredStrategy`` over every
    visible GPU, or over ``cpu_replicas`` logical CPU devices on a host without GPUs. Returns the
    strategy and its name for logs and ``model.json``. Must run before TensorFlow initializes its
    devices (logical devices cannot be configured after).

    Raises:
        ValueError: ``cpu_replicas`` above 1 under ``TF_CONFIG`` or on a host with GPUs.
    """
    gpus = tf.config.list_physical_devices("GPU")
    if cpu_replicas > 1 and (os.environ.get("TF_CONFIG") or gpus):
        raise ValueError(f"cpu-replicas={cpu_replicas} applies to one host without GPUs and no distribution; this job "
                         + ("has TF_CONFIG (multi_worker_mirrored_strategy)" if os.environ.get("TF_CONFIG")
                            else f"sees {len(gpus)} GPUs, which MirroredStrategy uses") + ": remove cpu-replicas")
    if os.environ.get("TF_CONFIG"):
        configure_heartbeats(tf.distribute.cluster_resolver.TFConfigClusterResolver().cluster_spec())
        return tf.distribute.MultiWorkerMirroredStrategy(), "multi_worker_mirrored"
    if gpus:
        return tf.distribute.MirroredStrategy(), "mirrored"
    if cpu_replicas > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * cpu_replicas)
    return tf.distribute.MirroredStrategy([f"/cpu:{index}" for index in range(cpu_replicas)]), "mirrored"


def main(argv: list[str] | None = None) -> int:
    args = common.parse_args(__doc__.split("\n\n")[0], argv, _add_arguments)
    stop_request = stop.StopRequest()
    strategy, name = choose_strategy(args.cpu_replicas)
    stop_request.install()   # back from TensorFlow's own SIGTERM handler (StopRequest.install)
    resolver = strategy.cluster_resolver
    task_type, task_id = (resolver.task_type or "worker", resolver.task_id or 0) if resolver else ("worker", 0)
    workers = len(json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {}).get("worker", [None]))
    is_chief = task_id == 0
    common.configure_logging(task_id)
    tf.keras.utils.set_random_seed(args.seed)

    replicas, local_replicas = strategy.num_replicas_in_sync, len(strategy.extended.worker_devices)
    global_batch = args.batch_size * replicas
    # a worker is a host: its replicas read batch-size each per step (rank_data's batch)
    place = dali_data.Place(task_id, workers, 0, 1, contract.current_host())
    data = dali_data.rank_data(args.train_channel, args.validation_channel, args.batch_size * local_replicas,
                               place, _allgather_object(task_id, workers), args.corrupt_images)
    train_images, train_labels = image_folder.read(data.train.listing)
    validation = image_folder.read(data.val.listing)
    steps = data.steps_per_epoch
    common.log.info("TensorFlow %s %s: %s %d of %d workers (host %s), %d replicas on %s; "
                    "%d training images (%d steps/epoch), %d validation images", tf.__version__,
                    type(strategy).__name__, task_type, task_id, workers, contract.current_host(), replicas,
                    ", ".join(strategy.extended.worker_devices), data.train.total, steps, data.val.total)

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA

    def epoch_input(epoch: int, first_step: int):
        # epoch's global batches, shuffled by the seed and the epoch, from first_step on: what an
        # uninterrupted job reads
        shuffled = (tf.data.Dataset.from_tensor_slices((train_images, train_labels))
                    .shuffle(len(train_labels), seed=args.seed + epoch).repeat())
        if not data.train.host_sharded:
            return shuffled.batch(global_batch, drop_remainder=True).skip(first_step).with_options(options)
        # this worker's part only, its replicas taking successive batches (no sharding by the strategy)
        return strategy.distribute_datasets_from_function(
            lambda _context: shuffled.batch(args.batch_size, drop_remainder=True).skip(first_step * local_replicas))

    with strategy.scope():
        model = tf_model.build_model()
        model.compile(optimizer=keras.optimizers.SGD(learning_rate=args.learning_rate * replicas,
                                                     momentum=args.momentum),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        model.optimizer.build(model.trainable_variables)
    epoch, step = _restore_on_every_worker(strategy, args, model, is_chief)
    observer = observe.Observer(args, task_id, workers, steps, global_batch, name)
    stopper = tf_checkpoint.StopAndCheckpoint(args, stop_request, _sum_over_workers(strategy), is_chief, steps)
    report = EpochReport(validation, observer, stopper, _worker_totals(strategy) if data.val.host_sharded else None)
    try:
        tf_checkpoint.fit_from(model, epoch_input, epoch=epoch, step=step, epochs=args.epochs, steps_per_epoch=steps,
                               callbacks=[report, stopper], stopper=stopper)
    except stop.Stopped as stopped:
        observer.close()
        return stopped.exit_code

    digest = common.weights_digest(model.get_weights())
    common.emit(f"rank={task_id} world_size={workers} final_weights_sha256={digest}")
    model_dir = args.model_dir if is_chief else tempfile.mkdtemp(prefix="dtc-mwms-worker-")
    tf_model.save(model, model_dir, val_accuracy=report.val_accuracy, epochs=args.epochs, world_size=workers,
                  strategy=f"{name}_strategy")
    observer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
