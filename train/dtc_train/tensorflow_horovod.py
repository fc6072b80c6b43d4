"""Built-in trainer: TensorFlow data-parallel training with Horovod, input through NVIDIA DALI.

API choice: the Keras 2 API from ``tf-keras`` with ``TF_USE_LEGACY_KERAS=1`` and
``horovod.tensorflow.keras``. That is the API existing Horovod/Keras training code is written
against (``DistributedOptimizer``, ``BroadcastGlobalVariablesCallback``, ``MetricAverageCallback``),
and under Keras 3, which TF >= 2.16 loads by default, ``horovod.tensorflow.keras`` breaks
(horovod #4290, still open). A custom ``horovod.tensorflow`` loop would avoid Keras but would
make every user re-write ``fit``; legacy Keras keeps their code working.

Each rank reads its shard of the training channel through ``DALIDataset``; rank 0's initial
weights are broadcast; validation accuracy is summed exactly over the validation shards. Rank 0
logs one metric line per epoch, writes the checkpoint (``tf_checkpoint``: weights, optimizer
state, position, the epoch's sums and the early-stopping state in one file, on the
``checkpoint-every`` schedule and when the job is stopped; a restarted job resumes at its step
reading what an uninterrupted run would: a DALI pipeline per epoch seeded by the epoch, the
steps done skipped), and saves the
model as a SavedModel under ``<model_dir>/1`` (the TensorFlow Serving layout SageMaker's TF
serving reads).

Hyperparameters: ``dtc_train.config`` (backend ``tensorflow_horovod``). The loop's rules (stop,
checkpoint, learning-rate schedule, early stopping, non-finite loss) are ``dtc_train.loop``'s.
"""

# tf_env first: it selects Keras 2 before TensorFlow is imported; the import order below is kept.
# isort: off
from . import tf_env  # noqa: F401

import horovod
import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf
import tf_keras as keras

from . import common, config, contract, dali_data, loop, observe, stop, tf_checkpoint, tf_model
# isort: on


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


def _dataset(pipe, batch_size: int, device_id: int | None, shape: tuple[int, int, int]):
    from nvidia.dali.plugin.tf import DALIDataset  # noqa: PLC0415  (loads DALI's TF ops: only for a DALI input)

    with tf.device("/gpu:0" if device_id is not None else "/cpu:0"):
        return DALIDataset(pipeline=pipe, batch_size=batch_size, device_id=device_id,
                           output_shapes=((batch_size, *shape), (batch_size, 1)),
                           output_dtypes=(tf.float32, tf.int32))


class HorovodBackend(tf_checkpoint.KerasSteps):
    """The loop's backend (``loop.Backend``) for tf-keras under Horovod: Keras steps through
    Horovod's ``DistributedOptimizer``, Horovod's allreduce for the sums, exact validation over
    every rank's DALI shard, and rank 0 writing the checkpoint."""

    def __init__(self, args, model: keras.Model, epoch_input, data: dali_data.RankData, val_batches):
        micro_batches = args.gradient_accumulation_steps
        super().__init__(model, epoch_input, args.batch_size, (model.make_train_function(),) * micro_batches)
        self.args, self.data, self.val_batches = args, data, val_batches
        self.rank, self.world_size = hvd.rank(), hvd.size()
        self.rate_scale = self.world_size
        self.steps_per_epoch = loop.optimizer_steps(data.steps_per_epoch, micro_batches, args.batch_size)

    def total(self, sums: np.ndarray, name: str) -> np.ndarray:
        return hvd.allreduce(tf.constant(sums, tf.float64), op=hvd.Sum, name=name).numpy()

    def sum_scalar(self, value: float, name: str) -> float:
        return float(self.total(np.array([value]), name)[0])

    def end_training_steps(self) -> None:
        pass

    def evaluate(self) -> tuple[float, float, int]:
        sums = np.zeros(3, dtype=np.float64)
        for index in range(self.data.val_shard.batches):
            images, labels = next(self.val_batches)
            real = self.data.val_shard.real_samples(index)
            logits = self.model(images[:real], training=False)
            loss_sum, correct = tf_model.sparse_metrics(logits, tf.reshape(labels[:real], [-1]))
            sums += [loss_sum, correct, real]
        loss_sum, correct, count = self.total(sums, "validation_sums")
        return loss_sum / count, correct / count, int(count)

    def save(self, epoch: int, step: int, train_sums: np.ndarray | None, plateau_state: dict) -> None:
        if self.rank == 0:
            tf_checkpoint.save(self.args.checkpoint_dir, self.model, self.model.optimizer,
                               loop.Resume(epoch, step, train_sums, plateau_state))


EPOCH_SEED_STRIDE = 1_000_003   # DALI seed offset per epoch (seeds stay distinct across ranks and epochs)


def main(argv: list[str] | None = None) -> int:
    args = config.parse(config.TENSORFLOW_HOROVOD, argv, __doc__.split("\n\n")[0])
    choice = tf_model.KerasChoice.from_args(args.model, args.image_size, args.augment, args.precision,
                                           args.pretrained_weights)
    stop_request = stop.StopRequest()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    common.configure_logging(rank)
    tf.keras.utils.set_random_seed(args.seed)
    device_id = _use_gpu(args)

    place = dali_data.Place(rank, size, hvd.local_rank(), hvd.local_size(), contract.current_host())
    data = dali_data.rank_data(args.train_channel, args.validation_channel, args.batch_size, place,
                               lambda obj: hvd_tf.allgather_object(obj, name="channel_shards"), args.corrupt_images)
    common.log.info("TensorFlow %s (tf-keras %s), Horovod %s: rank %d/%d (host %s); %s; DALI decodes on %s",
                    tf.__version__, keras.__version__, horovod.__version__, rank, size, contract.current_host(),
                    data.describe(),
                    "gpu" if device_id is not None else "cpu")
    decoding = dali_data.Decoding(device_id, "HWC", choice.images, args.dali_threads)
    shape = choice.images.shape("HWC")
    val_pipe = data.val_pipeline(args.batch_size, decoding)

    def epoch_input(epoch: int, first_batch: int):
        # one pipeline per epoch (dali_data.ReadOrder from the epoch's start), its augmentation
        # seeded by the epoch; a resumed epoch skips the batches it had done (DALI's TensorFlow
        # dataset cannot be restored from a DALI checkpoint)
        order = data.read_order(args.batch_size, args.seed, micro_batches, start=(epoch, 0, 0))
        pipe = data.train_pipeline(args.batch_size, decoding, order=order, seed=args.seed + EPOCH_SEED_STRIDE * epoch,
                                   one_epoch=True)
        return _dataset(pipe, args.batch_size, device_id, shape).skip(first_batch)

    model = choice.build(len(data.classes))
    tf_model.start_from_pretrained(model, choice, rank)   # every rank: rank 0's are broadcast below anyway
    micro_batches = args.gradient_accumulation_steps
    # backward_passes_per_step: each rank adds up k batches' gradients, then one allreduce of
    # their sum, divided by k (average_aggregated_gradients), and one optimizer step
    optimizer = tf_model.loss_scaled(hvd.DistributedOptimizer(
        keras.optimizers.SGD(learning_rate=args.learning_rate * size, momentum=args.momentum),
        backward_passes_per_step=micro_batches, average_aggregated_gradients=True), args.precision)
    model.compile(optimizer=optimizer, loss=tf_model.training_loss(args.label_smoothing), metrics=["accuracy"])
    backend = HorovodBackend(args, model, lambda epoch, first_batch: iter(epoch_input(epoch, first_batch)), data,
                             iter(_dataset(val_pipe, args.batch_size, device_id, shape)))
    observer = observe.Observer(args, rank, size, backend.steps_per_epoch, args.batch_size * micro_batches * size,
                                "horovod")
    if rank == 0:
        loop.log_accumulation(micro_batches, args.batch_size, size, backend.steps_per_epoch)
    # every rank creates the optimizer's variables now, in the same order, so that the broadcast
    # below pairs rank 0's restored ones with the others' (created lazily they are named apart)
    model.optimizer.build(model.trainable_variables)
    resume = tf_checkpoint.restore_checkpoint(args.checkpoint_dir, model, model.optimizer) if rank == 0 else None
    # rank 0's weights and optimizer state on every rank before the first step (Horovod's
    # broadcast callback does it only after the first batch, whose averaged gradient would then
    # mix in gradients taken at the other ranks' fresh weights)
    hvd_tf.broadcast_variables(model.variables + tf_checkpoint.optimizer_variables(model.optimizer), root_rank=0)
    resume = hvd_tf.broadcast_object(resume, root_rank=0, name="checkpoint_position")

    def finish(val_accuracy: float) -> None:
        loop.emit_digest(rank, size, model.get_weights())
        if rank == 0:
            tf_model.save(model, args.model_dir, choice.describe(
                data.classes, val_accuracy=val_accuracy, epochs=args.epochs, world_size=size, strategy="horovod"))

    code = loop.run(loop.Rules.of(args), backend, observer, stop_request, resume, finish)
    if code == 0:
        hvd.allreduce(tf.constant(0.0), name="finished")   # every rank leaves after rank 0 has saved
    return code


if __name__ == "__main__":
    exit_code = main()
    hvd.shutdown()   # what its exit handler would do; MPI is finalized
    common.leave(exit_code)
