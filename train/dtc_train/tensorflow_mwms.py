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

Hyperparameters: ``dtc_train.config`` (backend ``tensorflow_mwms``; ``batch-size`` is per
replica), ``cpu-replicas`` (above) among them; ``gradient-accumulation-steps`` replaces Keras'
train function with ``accumulating_train_functions``. The loop's rules (stop, checkpoint, learning-rate
schedule, early stopping, non-finite loss) are ``dtc_train.loop``'s.
"""

import base64
import dataclasses
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

from . import common, config, contract, dali_data, image_folder, loop, observe, stop, tf_checkpoint, tf_model
# isort: on


@dataclasses.dataclass(frozen=True)
class Worker:
    """This worker of a mirrored strategy, built once by ``main``.

    Attributes:
        args: the trainer's hyperparameters (``dtc_train.config``, backend ``tensorflow_mwms``).
        strategy: ``MultiWorkerMirroredStrategy`` or ``MirroredStrategy`` (``choose_strategy``).
        model: the compiled tf-keras model, built in the strategy's scope.
        task_id: this worker's index in ``TF_CONFIG`` (0: the chief, which writes).
        workers: the worker tasks (hosts).
    """

    args: config.TrainerConfig
    strategy: tf.distribute.Strategy
    model: keras.Model
    task_id: int
    workers: int


class MirroredBackend(tf_checkpoint.KerasSteps):
    """The loop's backend (``loop.Backend``) for tf-keras under a mirrored strategy: Keras steps
    whose gradients the strategy all-reduces and whose metrics are global already (Keras reads
    its metric variables across every replica of every worker), the strategy's all-reduce for
    the stop agreement, validation of the whole channel by every worker (or of each host's part,
    summed over the workers), and the chief writing the checkpoint.

    Args:
        worker: this worker.
        epoch_input: ``tf_checkpoint.KerasSteps``'.
        batches_per_epoch: each replica's batches per epoch.
        validation: (images float32 [N, S, S, C], labels int32 [N]) of this worker's validation channel.
        sum_over_workers: sums a list of floats over the workers, each counted once, for a
            validation channel each host holds a part of (``_worker_totals``); ``None``: every
            worker holds it all.
    """

    def __init__(self, worker: Worker, epoch_input, batches_per_epoch: int, validation: tuple[np.ndarray, np.ndarray],
                 sum_over_workers: Callable[[list[float]], np.ndarray] | None):
        args, model, strategy = worker.args, worker.model, worker.strategy
        micro_batches = args.gradient_accumulation_steps
        super().__init__(model, epoch_input, args.batch_size * strategy.num_replicas_in_sync,
                         accumulating_train_functions(model, strategy, micro_batches) if micro_batches > 1 else None)
        self.args, self.strategy, self.validation, self.sum_over_workers = args, strategy, validation, sum_over_workers
        self.rank, self.world_size = worker.task_id, worker.workers
        self.steps_per_epoch = loop.optimizer_steps(batches_per_epoch, micro_batches, args.batch_size)
        self.rate_scale = strategy.num_replicas_in_sync

    def total(self, sums: np.ndarray, name: str) -> np.ndarray:
        return sums   # the metrics the steps' sums come from are every replica's already

    def sum_scalar(self, value: float, name: str) -> float:
        per_replica = self.strategy.run(lambda: tf.constant(value, tf.float32))
        return float(self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None))

    def end_training_steps(self) -> None:
        pass

    def evaluate(self) -> tuple[float, float, int]:
        images, labels = self.validation
        loss_sum, correct = tf_model.sparse_metrics(self.model(images, training=False), labels)
        count = len(labels)
        if self.sum_over_workers is not None:
            loss_sum, correct, count = self.sum_over_workers([loss_sum, correct, count])
        return float(loss_sum / count), float(correct / count), int(round(count))

    def save(self, epoch: int, step: int, train_sums: np.ndarray | None, plateau_state: dict) -> None:
        if self.rank == 0:
            tf_checkpoint.save(self.args.checkpoint_dir, self.model, self.model.optimizer,
                               loop.Resume(epoch, step, train_sums, plateau_state))


def accumulating_train_functions(model: keras.Model, strategy: tf.distribute.Strategy,
                                 micro_batches: int) -> tuple[Callable, ...]:
    """``gradient-accumulation-steps`` = ``micro_batches`` (k) under a mirrored strategy: the
    train functions of one optimizer step's ``k`` batches (``tf_checkpoint.KerasSteps``), each
    ``iterator -> logs`` like Keras' own ``model.train_function``.

    Each runs Keras' ``train_step`` on one batch (``model.compute_loss``, scaled by the strategy's
    replicas as Keras scales it, and ``model.compute_metrics``, so the logs are Keras'), but adds
    the gradients to per-replica accumulators (``ON_READ`` variables, local to each replica)
    instead of applying them; the ``k``-th then applies the accumulators divided by ``k`` with
    ``optimizer.apply_gradients``, where the strategy all-reduces them, once per step, and zeroes
    them. Two ``tf.function``s, not one with a condition: ``apply_gradients`` synchronizes the
    replicas (``merge_call``), which a branch of a replica's ``tf.cond`` cannot. tf-keras'
    optimizers have no accumulation of their own (Keras 3's ``gradient_accumulation_steps`` is
    not in tf-keras 2.21).

    Returns:
        ``k - 1`` accumulating functions (the same one) and the applying one.
    """
    variables = model.trainable_variables
    with strategy.scope():
        accumulators = [tf.Variable(tf.zeros_like(variable), trainable=False,
                                    synchronization=tf.VariableSynchronization.ON_READ,
                                    aggregation=tf.VariableAggregation.NONE) for variable in variables]

    def replica_step(data, apply: bool):
        images, labels = data
        with tf.GradientTape() as tape:
            predictions = model(images, training=True)
            loss = model.compute_loss(images, labels, predictions)
            scaled = tf_model.scaled_loss(model.optimizer, loss)   # fp16: the scale changes only when applied
        for accumulator, gradient in zip(accumulators, tape.gradient(scaled, variables), strict=True):
            accumulator.assign_add(gradient)
        if apply:
            gradients = tf_model.unscaled_gradients(model.optimizer, [accumulator / micro_batches
                                                                      for accumulator in accumulators])
            model.optimizer.apply_gradients(zip(gradients, variables, strict=True))
            for accumulator in accumulators:
                accumulator.assign(tf.zeros_like(accumulator))
        return model.compute_metrics(images, labels, predictions, None)

    def train_function(apply: bool) -> Callable:
        @tf.function
        def run(iterator):
            logs = strategy.run(replica_step, args=(next(iterator), apply))
            # Keras' metric results are global already (read across the replicas): any replica's
            return tf.nest.map_structure(lambda value: strategy.experimental_local_results(value)[0], logs)
        return run

    return (train_function(False),) * (micro_batches - 1) + (train_function(True),)


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


def _restore_on_every_worker(worker: Worker, allgather: Callable[[object], list]) -> loop.Resume:
    """Reads the chief's checkpoint (its host's checkpoint directory) and hands its position,
    sums, early-stopping state, weights and optimizer state to every worker, whose own directory
    may hold none or an older one."""
    model = worker.model
    resume = (tf_checkpoint.restore_checkpoint(worker.args.checkpoint_dir, model, model.optimizer)
              if worker.task_id == 0 else None)
    if worker.workers > 1:   # one worker (MirroredStrategy) has no coordination service to gather through
        resume = allgather(resume)[0]
    if resume.epoch or resume.step:
        variables = model.weights + tf_checkpoint.optimizer_variables(model.optimizer)
        for variable in variables:
            variable.assign(_from_chief(worker.strategy, variable.numpy()).astype(variable.dtype.as_numpy_dtype))
    return resume


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
    args = config.parse(config.TENSORFLOW_MIRRORED, argv, __doc__.split("\n\n")[0])
    choice = tf_model.KerasChoice.from_args(args.model, args.image_size, args.augment, args.precision,
                                           args.pretrained_weights)
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
    allgather = _allgather_object(task_id, workers)
    data = dali_data.rank_data(args.train_channel, args.validation_channel, args.batch_size * local_replicas,
                               place, allgather, args.corrupt_images)
    spec = choice.images
    train_images, train_labels = image_folder.read(data.train.listing, spec,
                                                   spec.eval_resize if spec.augment else spec.size)
    validation = image_folder.read(data.val.listing, spec)
    steps = data.steps_per_epoch
    common.log.info("TensorFlow %s %s: %s %d of %d workers (host %s), %d replicas on %s; "
                    "%d training images (%d steps/epoch), %d validation images", tf.__version__,
                    type(strategy).__name__, task_type, task_id, workers, contract.current_host(), replicas,
                    ", ".join(strategy.extended.worker_devices), data.train.total, steps, data.val.total)

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA

    def epoch_input(epoch: int, first_batch: int):
        # epoch's global batches, shuffled by the seed and the epoch, from first_batch on: what an
        # uninterrupted job reads
        shuffled = (tf.data.Dataset.from_tensor_slices((train_images, train_labels))
                    .shuffle(len(train_labels), seed=args.seed + epoch).repeat())
        if spec.augment:   # each sample's crop from the seed, the epoch and its position in the epoch
            shuffled = shuffled.enumerate().map(lambda index, sample: (image_folder.augment(
                sample[0], tf.stack([tf.constant(args.seed + epoch, tf.int64), index]), spec.size), sample[1]))
        if not data.train.host_sharded:
            return iter(strategy.experimental_distribute_dataset(
                shuffled.batch(global_batch, drop_remainder=True).skip(first_batch).with_options(options)))
        # this worker's part only, its replicas taking successive batches (no sharding by the strategy)
        return iter(strategy.distribute_datasets_from_function(
            lambda _context: shuffled.batch(args.batch_size, drop_remainder=True).skip(first_batch * local_replicas)))

    with strategy.scope():
        model = choice.build(len(data.classes))
        tf_model.start_from_pretrained(model, choice, task_id)
        model.compile(optimizer=tf_model.loss_scaled(keras.optimizers.SGD(learning_rate=args.learning_rate * replicas,
                                                                          momentum=args.momentum), args.precision),
                      loss=tf_model.training_loss(args.label_smoothing), metrics=["accuracy"])
        model.optimizer.build(model.trainable_variables)
    worker = Worker(args, strategy, model, task_id, workers)
    resume = _restore_on_every_worker(worker, allgather)
    backend = MirroredBackend(worker, epoch_input, steps, validation,
                              _worker_totals(strategy) if data.val.host_sharded else None)
    micro_batches = args.gradient_accumulation_steps
    observer = observe.Observer(args, task_id, workers, backend.steps_per_epoch, global_batch * micro_batches, name)
    if is_chief:
        loop.log_accumulation(micro_batches, args.batch_size, replicas, backend.steps_per_epoch)

    def finish(val_accuracy: float) -> None:
        loop.emit_digest(task_id, workers, model.get_weights())
        model_dir = args.model_dir if is_chief else tempfile.mkdtemp(prefix="dtc-mwms-worker-")
        tf_model.save(model, model_dir, choice.describe(data.classes, val_accuracy=val_accuracy, epochs=args.epochs,
                                                        world_size=workers, strategy=f"{name}_strategy"))

    return loop.run(loop.Rules.of(args), backend, observer, stop_request, resume, finish)


if __name__ == "__main__":
    sys.exit(main())
