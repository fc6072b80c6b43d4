"""What the PyTorch trainers share, whatever library averages their gradients: the device,
DALI batches as tensors, the training loop, exact sharded validation, checkpoints and resuming
from them, and the saved model.

Checkpoints: rank 0 writes ``<checkpoint-dir>/checkpoint.pt`` (one typed, versioned record:
``torch_checkpoint.Checkpoint``) atomically (``common.atomic_write``: staged outside the
directory, fsync, rename) on the ``checkpoint-every`` schedule (default every
epoch), at the end, and when the job is stopped (``stop.StopRequest``: within 10 steps).
One file holds everything a restart needs to go on as if it had not stopped: the position
(epochs done, steps done in the next), the model, the optimizer, rank 0's RNG, the epoch's
training sums so far, the training order's state (``TorchBackend.data_order``), every rank's DALI
pipeline position and RNG state (DALI checkpointing, gathered to rank 0), and every rank's
floating-point buffers (batch normalization's running statistics, which Horovod and FSDP2
leave per rank within an epoch: ``average_buffers``). At start rank 0
reads it and broadcasts it, so every rank, on every host, resumes at the same step with its own
data position (a managed-spot restart restores the directory from ``checkpoint_s3_uri``;
SageMaker docs, model-checkpoints). Training continues from there, so a
checkpoint is only ever replaced by a later one. An unreadable checkpoint is named in the log and
training starts over; one from a different world size goes on mid-epoch after the samples of the
epoch's order the old ranks had read (``restore``, ``dali_data.ReadOrder``). Nothing in it names a
host.

A sharded model (``StateDicts.shards``: FSDP2) keeps its model and optimizer state out of that
file: every rank writes its own part into a new directory ``<checkpoint-dir>/shards-<ns>``
(``torch.distributed.checkpoint``: one ``__<rank>_0.distcp`` file per rank and ``.metadata``),
then rank 0 replaces ``checkpoint.pt``, which names that directory, and one rank per host
removes the older ones. A job with another world size loads it resharded (DCP's load-time
resharding). Every rank must see every rank's files at restart: the same shared directory, or
SageMaker restoring the whole ``checkpoint_s3_uri`` prefix (which every host uploaded its part
to) onto every host.
"""

import contextlib
import dataclasses
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from . import common, config, contract, dali_data, loop, observe, stop, torch_checkpoint, torch_model


@dataclass(frozen=True)
class Collectives:
    """The three collectives the loop needs, from Horovod or ``torch.distributed``.

    Attributes:
        allreduce_sum: ``(tensor float64 [n], name) -> tensor`` summed over all ranks.
        broadcast_object: rank 0's picklable object on every rank.
        allgather_object: ``obj -> [obj of rank 0, obj of rank 1, ...]`` on every rank.
        world_size: the number of ranks.
    """

    allreduce_sum: Callable[[torch.Tensor, str], torch.Tensor]
    broadcast_object: Callable[[object], object]
    allgather_object: Callable[[object], list]
    world_size: int

    def sum_scalar(self, value: float, name: str) -> float:
        return float(self.allreduce_sum(torch.tensor([value], dtype=torch.float64), name)[0])

    @classmethod
    def alone(cls) -> "Collectives":
        """A world of one process: each collective returns its input (the sum over one rank, one
        rank's object, a list of one)."""
        return cls(allreduce_sum=lambda tensor, _name: tensor, broadcast_object=lambda obj: obj,
                   allgather_object=lambda obj: [obj], world_size=1)


@dataclass(frozen=True)
class ShardedCheckpoints:
    """How a sharded model's checkpoint state is written and read, each rank its own part.

    Attributes:
        save: ``(model, optimizer, directory) -> None``, collective: every rank writes its part
            of the model's and optimizer's state into ``directory`` (created; new for each save).
        load: ``(model, optimizer, directory) -> None``, collective: every rank reads its part,
            at this job's world size, of the state saved there at any world size.
        prunes: this rank removes the older shard directories once a checkpoint is written (one
            rank per host: its local rank 0).
    """

    save: Callable[[torch.nn.Module, object, str], None]
    load: Callable[[torch.nn.Module, object, str], None]
    prunes: bool


@dataclass(frozen=True)
class StateDicts:
    """How the loop reads and loads the model's and the optimizer's state.

    Attributes:
        get: ``(model, optimizer or None) -> (model state, optimizer state or None)``, the whole
            state (checkpoints of a model every rank holds, ``model.pth``), called by every rank
            (a collective for a sharded model).
        load: ``(model, optimizer, model state, optimizer state) -> None`` on every rank: the
            whole state into the model (``None`` when checkpoints are sharded).
        shards: checkpoints written shard by shard, or ``None`` (the whole state in
            ``checkpoint.pt``).
    """

    get: Callable[[torch.nn.Module, object], tuple[dict, dict | None]]
    load: Callable[[torch.nn.Module, object, dict, dict], None] | None
    shards: ShardedCheckpoints | None = None


def _load_plain(model, optimizer, model_state: dict, optimizer_state: dict) -> None:
    model.load_state_dict(model_state)
    optimizer.load_state_dict(optimizer_state)


# Every rank holds the whole model (DDP, Horovod): the modules' and optimizers' own state dicts.
PLAIN_STATE = StateDicts(lambda model, optimizer: (model.state_dict(), optimizer and optimizer.state_dict()),
                         _load_plain)


# --precision: the autocast dtype of each choice (None: no autocast)
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def model_choice(args) -> torch_model.ModelChoice:
    """The model hyperparameters of the config (``dtc_train.config``), checked (``torch_model.ModelChoice.from_args``).

    Raises:
        ValueError: an unknown architecture, torchvision missing, or an image size that does not fit.
    """
    return torch_model.ModelChoice.from_args(args.model, args.image_size, args.augment, args.pretrained_weights)


def memory_format(device: torch.device, data_parallel: str) -> torch.memory_format:
    """How the model's 4-D weights and the input images are laid out: ``channels_last`` for DDP
    on a GPU (cuDNN's NHWC convolution kernels, which tensor cores under autocast want; PyTorch's
    "Channels Last Memory Format" tutorial. The DDP trainer's ResNet-50 in bf16 on an H100 went
    from 1,994 to 3,323 images/s: the GPU suite's B5, docs/performance.md); the default
    contiguous layout on a CPU, under Horovod (0.28.1's collectives refuse a tensor that is not
    contiguous: "Tensor is required to be contiguous") and for FSDP2, whose ``fully_shard``
    splits parameters along their first dimension. One process on a GPU (``single``, no
    collectives) takes DDP's layout.

    Args:
        device: where the model trains.
        data_parallel: ``ddp``, ``fsdp``, ``horovod`` or ``single``.
    """
    channels_last = device.type == "cuda" and data_parallel in ("ddp", "single")
    return torch.channels_last if channels_last else torch.contiguous_format


@dataclass(frozen=True)
class RankSetup:
    """What every PyTorch backend sets up alike on a rank before its data-parallel wrapper
    (``set_up_rank``).

    Attributes:
        data: this rank's share of the channels (``dali_data.RankData``).
        dali_device_id: the GPU DALI decodes on (the local rank's), or ``None`` on a CPU.
        layout: the memory format of the model's 4-D weights and the batches (``memory_format``).
        module: the untrained model (``build_model``), on the rank's device, not wrapped.
    """

    data: dali_data.RankData
    dali_device_id: int | None
    layout: torch.memory_format
    module: torch.nn.Module


def set_up_rank(args, choice: torch_model.ModelChoice, place: dali_data.Place, device: torch.device,
                allgather_object: Callable[[object], list], data_parallel: str, runtime: str) -> RankSetup:
    """Seeds ``torch`` (``args.seed``: every rank builds the same weights), sets the intra-op
    threads for the host's ranks (``set_threads_per_rank``), reads this rank's share of the
    channels (``dali_data.rank_data``, ``allgather_object`` comparing the ranks' files), logs the
    start-up line (``PyTorch <version><runtime> on <device> (host <host>); <data>; DALI decodes on
    <gpu|cpu>``, e.g. ``runtime`` ``", Horovod 0.28.1: rank 0/2"``) and builds the model in the
    layout of ``data_parallel`` (``memory_format``: ``ddp``, ``fsdp``, ``horovod`` or ``single``).

    Raises:
        FileNotFoundError, ValueError: the channels' (``dali_data.rank_data``).
    """
    torch.manual_seed(args.seed)
    dali_device_id = place.local_rank if device.type == "cuda" else None
    set_threads_per_rank(place.local_size)
    data = dali_data.rank_data(args.train_channel, args.validation_channel, args.batch_size, place, allgather_object,
                               args.corrupt_images)
    common.log.info("PyTorch %s%s on %s (host %s); %s; DALI decodes on %s", torch.__version__, runtime, device,
                    place.host, data.describe(), "gpu" if dali_device_id is not None else "cpu")
    layout = memory_format(device, data_parallel)
    module = build_model(choice, data.classes, place.rank, device, layout)
    if args.compile == "on":   # in place: the state dict keeps its keys (nn.Module.compile)
        module.compile()
        common.log.info("torch.compile on: the first steps compile the model")
    return RankSetup(data, dali_device_id, layout, module)


def build_model(choice: torch_model.ModelChoice, classes: tuple[str, ...], rank: int, device: torch.device,
                layout: torch.memory_format = torch.contiguous_format) -> torch.nn.Module:
    """The untrained model for ``classes`` (seed ``torch`` first: every rank builds the same
    weights), started from ``choice.pretrained_weights`` when given (rank 0 logs what was loaded
    and what was left at its initial values), on ``device`` with its 4-D weights in ``layout``
    (``memory_format``)."""
    module = choice.build(len(classes))
    if choice.pretrained_weights:
        path = contract.pretrained_weights_file(choice.pretrained_weights, torch_model.WEIGHT_SUFFIXES)
        loaded, left = torch_model.load_pretrained(module, path)
        if rank == 0:
            common.log.info("pretrained weights %s: %d tensors loaded; left at their initial values: %s", path,
                            len(loaded), "; ".join(left) or "none")
    return module.to(device, memory_format=layout)


def rank_buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """This rank's floating-point buffers (batch normalization's running mean and variance), on the CPU."""
    return {name: buffer.detach().cpu().clone() for name, buffer in model.named_buffers() if buffer.is_floating_point()}


def average_buffers(model: torch.nn.Module, collectives: Collectives) -> None:
    """Replaces every rank's floating-point buffers with their mean over the ranks (one float64
    allreduce). For wrappers that leave them per rank (Horovod's ``DistributedOptimizer``,
    FSDP2): batch normalization's running statistics then describe every rank's data, and the
    ranks save identical models. DDP broadcasts rank 0's buffers at each forward instead.
    Identical buffers stay bit-identical (a float32 summed over a few ranks is exact in float64)."""
    buffers = [buffer for buffer in model.buffers() if buffer.is_floating_point()]
    if not buffers:
        return
    total = collectives.allreduce_sum(torch.cat([b.detach().double().cpu().reshape(-1) for b in buffers]), "buffers")
    mean, offset = total / collectives.world_size, 0
    with torch.no_grad():
        for buffer in buffers:
            buffer.copy_(mean[offset:offset + buffer.numel()].view_as(buffer))
            offset += buffer.numel()


@dataclass(frozen=True)
class Precision:
    """How a step computes (``--precision``; PyTorch's automatic mixed precision recipe,
    docs.pytorch.org/docs/stable/notes/amp_examples.html).

    Attributes:
        name: ``fp32``, ``bf16`` or ``fp16``.
        dtype: the autocast dtype of the forward pass and loss (``None``: fp32, no autocast).
        scaler: fp16's dynamic loss scaling (``torch.amp.GradScaler``), else ``None``.
        horovod: the optimizer is Horovod's ``DistributedOptimizer``, whose gradient allreduce
            must finish before they are unscaled (Horovod's AMP recipe: ``synchronize()``, then
            ``unscale_``, then ``step`` under ``skip_synchronize()``).
    """

    name: str = "fp32"
    dtype: torch.dtype | None = None
    scaler: "torch.amp.GradScaler | None" = None
    horovod: bool = False

    @classmethod
    def build(cls, name: str, device: torch.device, horovod: bool = False) -> "Precision":
        """The ``--precision`` choice ``name`` for steps on ``device``."""
        scaler = torch.amp.GradScaler(device.type) if name == "fp16" else None
        return cls(name, PRECISIONS[name], scaler, horovod)

    def autocast(self, device_type: str):
        """The context of a step's forward pass and loss: ``torch.autocast`` to ``dtype`` on
        ``device_type`` (``cpu``, ``cuda``), or none in fp32."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward pass of ``loss`` (loss-scaled under fp16), adding to the parameters' gradients."""
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def step(self, optimizer) -> None:
        """One optimizer step on the gradients of the ``backward`` passes since ``zero_grad``
        (under fp16 unscaled first: a step whose gradients hold inf or NaN is skipped and the scale
        halved, GradScaler's rule)."""
        if self.scaler is None:
            optimizer.step()
            return
        if self.horovod:
            optimizer.synchronize()
            self.scaler.unscale_(optimizer)
            with optimizer.skip_synchronize():
                self.scaler.step(optimizer)
        else:
            self.scaler.step(optimizer)
        self.scaler.update()


FP32 = Precision()


@dataclass(frozen=True)
class Accumulation:
    """Gradient accumulation (``--gradient-accumulation-steps``): each optimizer step takes
    ``micro_batches`` batches of ``batch-size``, their gradients added up locally and averaged over
    the ranks once, in the last one's backward pass. Each micro-batch's loss is divided by
    ``micro_batches``, so with batches of equal size a step's gradient is the mean over all its
    samples: the step a ``micro_batches`` times larger ``batch-size`` would take, with a
    ``micro_batches`` times smaller peak of activation memory.

    Attributes:
        micro_batches: batches per optimizer step (1: no accumulation).
        local: a context manager factory under which a micro-batch's forward and backward
            leave the gradients local, no allreduce: DDP's ``no_sync``; FSDP2's
            ``set_requires_gradient_sync(False)`` (``fsdp_local_gradients``); Horovod's
            ``DistributedOptimizer(backward_passes_per_step=k)`` counts the backward passes
            itself (``contextlib.nullcontext``).
    """

    micro_batches: int = 1
    local: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext

    def optimizer_steps(self, batches_per_epoch: int, batch_size: int) -> int:
        """``loop.optimizer_steps`` for ``micro_batches``. Raises its ValueError."""
        return loop.optimizer_steps(batches_per_epoch, self.micro_batches, batch_size)


NO_ACCUMULATION = Accumulation()


@contextlib.contextmanager
def fsdp_local_gradients(model):
    """FSDP2 (``fully_shard``) without its reduce-scatter: the backward passes inside accumulate
    unsharded gradients on each rank; the next backward outside reduces them all."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def _dcp_failure() -> type[BaseException]:
    """``torch.distributed.checkpoint``'s ``CheckpointException`` (a ``BaseException``, caught by
    name), imported only once a load has failed: an ``except`` clause's class is looked up when an
    exception reaches it, and the module (with ``torch.distributed.tensor``) took about 0.5 s of
    every PyTorch rank's start-up, where only FSDP's sharded checkpoints use it (2026-12-03)."""
    from torch.distributed.checkpoint.api import CheckpointException  # noqa: PLC0415

    return CheckpointException


def _load_state(checkpoint_dir: str, state: torch_checkpoint.Checkpoint, model, optimizer, states: StateDicts
                ) -> None:
    """Loads the checkpoint ``state`` (``torch_checkpoint.read``) into ``model`` and ``optimizer``.

    Raises:
        ValueError: the checkpoint holds a sharded state and this job's model is whole, or back;
            or its state does not load into ``model`` and ``optimizer``; or a sharded state's
            files cannot be read.
    """
    path = os.path.join(checkpoint_dir, torch_checkpoint.NAME)
    advice = "restart with the setting that wrote it, or give the job an empty checkpoint directory"
    shards = state.sharded_state
    if bool(shards) != (states.shards is not None):
        raise ValueError(
            f"checkpoint {path} does not fit this model: it holds "
            + ("a sharded model's state (data-parallel=fsdp) and this job's ranks each hold the whole model"
               if shards else "a whole model's state and this job shards the model (data-parallel=fsdp)")
            + f" (data-parallel=ddp and fsdp checkpoints differ); {advice}")
    try:
        if shards:
            states.shards.load(model, optimizer, os.path.join(checkpoint_dir, shards))
        else:
            states.load(model, optimizer, state.model, state.optimizer)
    except _dcp_failure() as error:   # every rank's failures, gathered by DCP
        failure = next(iter(error.failures.values()))[0]
        raise ValueError(
            f"checkpoint {path}: its sharded state {os.path.join(checkpoint_dir, shards)} cannot be read "
            f"({type(failure).__name__}: {str(failure).strip().splitlines()[0] if str(failure).strip() else ''}): "
            "every rank's files must be there (SageMaker restores checkpoint_s3_uri's whole prefix to every host); "
            "give the job an empty checkpoint directory to start over") from None
    except (RuntimeError, KeyError, ValueError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(
            f"checkpoint {path} does not fit this model ({type(error).__name__}: {first_line}): it was written by "
            f"another model or data-parallel setting (data-parallel=ddp and fsdp checkpoints differ); {advice}"
        ) from error


@dataclass(frozen=True)
class TorchRank:
    """One rank of a PyTorch trainer as its ``main`` builds it, passed whole to ``restore``,
    ``train``, ``TorchBackend``, ``save_checkpoint`` and ``finish``.

    Attributes:
        args: the trainer's configuration (``config.TrainerConfig``).
        choice: the model (``torch_model.ModelChoice``).
        setup: what ``set_up_rank`` made: this rank's data, DALI's GPU, the layout, the unwrapped
            model (``RankSetup.module``: what ``finish`` saves).
        device: where the model trains.
        rank: this rank (0 reports and writes).
        collectives: Horovod's or ``torch.distributed``'s (``world_size`` ranks).
        model: the model as wrapped for training (DDP, FSDP2; the module itself under Horovod or
            alone).
        optimizer: its optimizer (Horovod's ``DistributedOptimizer`` under Horovod).
        strategy: the name the observer reports (``horovod``, ``ddp``, ``fsdp``, ``single``).
        states: how the model's and optimizer's state are read and loaded (``StateDicts``).
        precision: the autocast dtype and loss scaling (``Precision``).
        accumulation: micro-batches per optimizer step (``Accumulation``).
        buffers_synced: the wrapper keeps floating-point buffers equal on every rank (DDP);
            otherwise they are averaged after each epoch's steps (``average_buffers``).
    """

    args: config.TrainerConfig
    choice: torch_model.ModelChoice
    setup: RankSetup
    device: torch.device
    rank: int
    collectives: Collectives
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    strategy: str
    states: StateDicts = PLAIN_STATE
    precision: Precision = FP32
    accumulation: Accumulation = NO_ACCUMULATION
    buffers_synced: bool = True

    @property
    def size(self) -> int:
        return self.collectives.world_size

    @property
    def data(self) -> dali_data.RankData:
        return self.setup.data

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps per epoch (``Accumulation.optimizer_steps``)."""
        return self.accumulation.optimizer_steps(self.data.steps_per_epoch, self.args.batch_size)


def restore(job: TorchRank) -> tuple[loop.Resume, dali_data.ReadOrder, str | None]:
    """Loads rank 0's checkpoint (if any) into ``job.model`` and ``job.optimizer`` on every rank
    (``job.states``), and fp16's loss scale into ``job.precision.scaler``. Returns where training
    goes on, this rank's training order from there (``RankData.read_order``, with its ``start``)
    and its DALI position (``None``: a fresh pipeline). Call before building the training
    pipeline (``dali_data.RankData.pipelines``).

    A checkpoint of this world size and epoch length resumes exactly: the writer's order and DALI
    position (augmentation included). One written mid-epoch by another world size, or another
    batch size or gradient-accumulation setting, over the same training samples, goes on after the
    part of the epoch's permutation the old job had read, at the step that leaves the new job as
    many steps as the rest of the epoch needs (``ReadOrder.resumed_start``): no sample of the epoch
    is skipped or read twice (the last step's batches may run past the epoch's samples, as a
    fresh epoch's last step does). A ``ShardedByS3Key`` training channel, whose hosts' parts change
    with the instance count, or a channel of another size starts the epoch again.

    Raises:
        ValueError: the checkpoint's state does not load into the model and optimizer, or its
            version is newer than this image's (``torch_checkpoint.read``).
    """
    args, rank, size, micro_batches = job.args, job.rank, job.size, job.accumulation.micro_batches
    order = job.data.read_order(args.batch_size, args.seed, micro_batches)
    host_sharded = job.data.train.host_sharded
    found: torch_checkpoint.Checkpoint | str | None = None
    if rank == 0:
        try:
            found = torch_checkpoint.read(args.checkpoint_dir)
        except ValueError as error:   # raised on every rank below, not on rank 0 alone
            found = str(error)
    state = job.collectives.broadcast_object(found)
    if isinstance(state, str):
        raise ValueError(state)
    if state is None:
        return loop.Resume(), order, None
    _load_state(args.checkpoint_dir, state, job.model, job.optimizer, job.states)
    if job.precision.scaler is not None and state.grad_scaler:
        job.precision.scaler.load_state_dict(state.grad_scaler)
    epoch, step = state.epoch, state.step
    steps_per_epoch = order.batches_per_epoch // micro_batches
    positions = state.data_positions or []
    saved = state.data_order or {}
    same_layout = (len(positions) == size and state.steps_per_epoch == steps_per_epoch
                   and saved.get("batch_size") == order.batch_size and saved.get("samples") == order.samples)
    mapped = step and saved.get("samples") == order.samples and not saved.get("host_sharded") and not host_sharded
    position = None
    if same_layout:
        order = dataclasses.replace(order, start=tuple(saved["start"]))
        position = positions[rank]
    elif mapped:
        order = dataclasses.replace(order, start=order.resumed_start(epoch, saved["offset"], micro_batches))
        if rank == 0:
            common.log.info("the checkpoint was written by %d ranks with %s steps per epoch, this job has %d with %d: "
                            "epoch %d goes on after the %d samples of its order read so far, at step %d",
                            len(positions), state.steps_per_epoch, size, steps_per_epoch, epoch + 1,
                            saved["offset"], order.start[1] // micro_batches)
        step = order.start[1] // micro_batches
    else:
        if step and rank == 0:
            common.log.warning("the checkpoint was written by %d ranks with %s steps per epoch over %s training "
                               "samples, this job has %d with %d over %d%s: its data positions do not apply, so "
                               "epoch %d starts again at its first step", len(positions),
                               state.steps_per_epoch, saved.get("samples"), size, steps_per_epoch,
                               order.samples, " (ShardedByS3Key)" if host_sharded or saved.get("host_sharded") else "",
                               epoch + 1)
        step = 0
        order = dataclasses.replace(order, start=(epoch, 0, 0))
    if rank == 0:
        torch.set_rng_state(state.rng)
        common.log.info("resuming from %s: epoch %d of %d done, %d of %d steps of epoch %d done",
                        os.path.join(args.checkpoint_dir, torch_checkpoint.NAME), epoch, args.epochs, step,
                        steps_per_epoch, epoch + 1)
    buffers = state.rank_buffers or []
    if len(buffers) == size:   # this rank's own running statistics, as an uninterrupted job has them
        own = dict(job.model.named_buffers())
        with torch.no_grad():
            for name, value in buffers[rank].items():
                own[name].copy_(value)
    sums = state.train_sums if step else None
    resume = loop.Resume(epoch, step, None if sums is None else np.asarray(sums, dtype=np.float64), state.plateau)
    return resume, order, position


def save_checkpoint(job: TorchRank, train_batches: "Batches", position: tuple[int, int], total: np.ndarray | None,
                    plateau_state: dict | None, data_order: dict | None) -> None:
    """Writes the checkpoint (``torch_checkpoint.Checkpoint``) of ``position`` (epochs done, steps
    of the next done), with the epoch's training sums so far over every rank (``total``,
    ``loop.SUMS``), the early-stopping state ``plateau_state`` and the training order's state
    ``data_order`` (``TorchBackend.data_order``). Collective: every rank calls it at the same step
    (its data position is gathered, and a sharded model's state); rank 0 writes."""
    collectives, states, checkpoint_dir = job.collectives, job.states, job.args.checkpoint_dir
    positions = collectives.allgather_object(train_batches.position())
    buffers = collectives.allgather_object(rank_buffers(job.model))
    model_state = optimizer_state = shards = None
    if states.shards is not None:
        shards = collectives.broadcast_object(
            f"{torch_checkpoint.SHARDS_PREFIX}{time.time_ns()}" if job.rank == 0 else None)
        states.shards.save(job.model, job.optimizer, os.path.join(checkpoint_dir, shards))
    else:
        model_state, optimizer_state = states.get(job.model, job.optimizer)
    if job.rank == 0:
        torch_checkpoint.write(checkpoint_dir, torch_checkpoint.Checkpoint(
            epoch=position[0], step=position[1],
            steps_per_epoch=job.steps_per_epoch,
            rng=torch.get_rng_state(),
            train_sums=None if total is None else torch.from_numpy(np.asarray(total, dtype=np.float64)),
            data_positions=positions, data_order=data_order, rank_buffers=buffers if any(buffers) else None,
            grad_scaler=job.precision.scaler.state_dict() if job.precision.scaler is not None else None,
            plateau=plateau_state, model=model_state, optimizer=optimizer_state, sharded_state=shards))
    if states.shards is not None:
        collectives.sum_scalar(0.0, "checkpoint_written")   # checkpoint.pt names the new shards on every host
        if states.shards.prunes:
            remove_older_shards(checkpoint_dir, keep=shards)


def remove_older_shards(checkpoint_dir: str, keep: str) -> None:
    """Removes the shard directories (``shards-*``) in ``checkpoint_dir`` other than ``keep``; one
    already gone (another host's rank removing it from a shared directory) is skipped."""
    for entry in os.scandir(checkpoint_dir):
        if entry.name.startswith(torch_checkpoint.SHARDS_PREFIX) and entry.name != keep and entry.is_dir():
            shutil.rmtree(entry.path, ignore_errors=True)


def device_for(data_device: str, local_rank: int) -> torch.device:
    """``cuda:<local_rank>`` when a GPU is wanted and visible (``--data-device``), else CPU."""
    if data_device == "gpu" or (data_device == "auto" and torch.cuda.is_available()):
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def set_threads_per_rank(local_size: int) -> int:
    """Gives each of the host's ``local_size`` ranks an equal share of the CPUs this process may run
    on (its affinity: a container's cpuset or a pinned rank sees fewer than ``os.cpu_count()``) as
    PyTorch intra-op threads. Returns the thread count."""
    threads = max(1, len(os.sched_getaffinity(0)) // local_size)
    torch.set_num_threads(threads)
    return threads


class Batches:
    """Endless (images float32 [B, C, S, S] in ``layout``, labels int64 [B]) batches from a built
    DALI pipeline (``DALIGenericIterator``), and the pipeline's position after the last batch
    handed out."""

    def __init__(self, pipe, device: torch.device, layout: torch.memory_format = torch.contiguous_format):
        from nvidia.dali.plugin.pytorch import DALIGenericIterator  # noqa: PLC0415  (DALI's torch plugin: only with a pipeline)

        self.device = device
        self.layout = layout
        self.iterator = DALIGenericIterator([pipe], ["images", "labels"], size=-1, auto_reset=True)

    def __iter__(self):
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        data = next(self.iterator)[0]
        return (data["images"].to(self.device).contiguous(memory_format=self.layout),
                data["labels"].to(self.device).view(-1).long())

    def position(self) -> str:
        """DALI's checkpoint of the reader and RNG states as of the last batch returned (the
        iterator accounts for the batches it has prefetched); ``data_position`` restores it."""
        return self.iterator.checkpoints()[0]


class PendingSums:
    """A GPU step's float64 [loss sum, correct, samples] on their way to the host: a copy into
    pinned host memory queued behind the step, and a CUDA event after it. Reading them
    (``np.asarray``) waits for that step alone, not for the steps queued since: a ``.item()``
    per step instead makes the host wait for the GPU to drain before it prepares the next step,
    which cost the trainers 7-11 % of ResNet-50's speed on an H200 against a loop without it
    (the GPU suite's B5, docs/performance.md; PyTorch's "Performance Tuning Guide": avoid
    unnecessary CPU-GPU synchronization)."""

    def __init__(self, device_sums: torch.Tensor, samples: float):
        """``device_sums``: float64 [loss sum, correct] on the GPU; ``samples``: the step's."""
        self.host = torch.empty(device_sums.shape, dtype=torch.float64, pin_memory=True)
        self.host.copy_(device_sums, non_blocking=True)
        self.copied = torch.cuda.Event()
        self.copied.record()
        self.samples = samples

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        self.copied.synchronize()
        return np.array([*self.host.tolist(), self.samples], dtype=dtype or np.float64)


def train_step(model, optimizer, train_batches, precision: Precision = FP32, label_smoothing: float = 0.0,
               accumulation: Accumulation = NO_ACCUMULATION) -> "np.ndarray | PendingSums":
    """One optimizer step on the next ``accumulation.micro_batches`` (images, labels) of
    ``train_batches``: for each, the forward pass and loss (cross-entropy, with
    ``label_smoothing``) in ``precision`` and the backward pass of the loss over
    ``micro_batches``, all but the last under ``accumulation.local`` (no allreduce); then the
    step. Returns this rank's float64 [loss sum, correct, samples] over the micro-batches: an
    array on a CPU; on a GPU, ``PendingSums`` (the step is only queued when this returns), which
    ``np.asarray`` reads the same way."""
    # per step, only what the step needs: no autocast context in fp32, no division by 1 (each an
    # op of its own, forward and backward: about 2 % of a digits step on one core, A8)
    micro_batches = accumulation.micro_batches
    optimizer.zero_grad()
    loss_sum = correct = samples = 0.0
    on_gpu = None
    for index in range(micro_batches):
        images, labels = next(train_batches)
        last = index == micro_batches - 1
        with contextlib.nullcontext() if last else accumulation.local():
            with precision.autocast(images.device.type):
                logits = model(images)
                loss = F.cross_entropy(logits, labels, label_smoothing=label_smoothing)
            precision.backward(loss if micro_batches == 1 else loss / micro_batches)
        if images.device.type == "cuda":   # stays on the GPU: no synchronization
            sums = torch.stack([loss.detach().double() * len(labels), (logits.argmax(1) == labels).sum().double()])
            on_gpu = sums if on_gpu is None else on_gpu + sums
        else:
            loss_sum += loss.item() * len(labels)
            correct += (logits.argmax(1) == labels).sum().item()
        samples += len(labels)
    precision.step(optimizer)
    if on_gpu is not None:
        return PendingSums(on_gpu, samples)   # the samples are known here: no copy to the GPU and back
    return np.array([loss_sum, correct, samples], dtype=np.float64)


def evaluate(model, val_batches: Batches, shard: dali_data.Shard, collectives: Collectives) -> tuple[float, float, int]:
    """Loss and accuracy over the whole validation set: each rank scores its shard (dropping
    the padding of its last batch) and the sums are all-reduced. Returns (loss, accuracy, n)."""
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64)
    with torch.no_grad():
        for index in range(shard.batches):
            images, labels = next(val_batches)
            real = shard.real_samples(index)
            logits = model(images[:real])
            sums += torch.tensor([
                F.cross_entropy(logits, labels[:real], reduction="sum").item(),
                (logits.argmax(1) == labels[:real]).sum().item(), real], dtype=torch.float64)
    loss_sum, correct, count = collectives.allreduce_sum(sums, "validation_sums").tolist()
    model.train()
    return loss_sum / count, correct / count, int(count)


class StepProfiler:
    """``--profile-steps A:B`` on rank 0: ``torch.profiler`` records the CPU (and CUDA, where
    there is a GPU) activity of global optimizer steps ``A`` to ``B``, each marked as
    ``ProfilerStep#<global step>``, and writes a Chrome trace into ``directory`` when step ``B``
    ends (``tensorboard_trace_handler``: ``<host>_rank0.<ms>.pt.trace.json``, read by
    TensorBoard's PyTorch profiler view, chrome://tracing and Perfetto). A job stopped within
    the range writes none, and its resumed job records from the step it resumes at.

    Args:
        steps: ``(A, B)``, or ``None``: nothing is recorded.
        total_steps: the job's optimizer steps (epochs x steps per epoch).
        directory: where the trace goes (``tensorboard-dir``).
        rank: only rank 0 records.

    Raises:
        ValueError: ``B`` is past the job's last step.
    """

    def __init__(self, steps: tuple[int, int] | None, total_steps: int, directory: str, rank: int):
        if steps and steps[1] > total_steps:
            raise ValueError(f"profile-steps={steps[0]}:{steps[1]} ends past the job's last step, {total_steps} "
                             "(epochs x optimizer steps per epoch): choose steps within it")
        self.steps = steps if rank == 0 else None
        self.directory, self.profiler, self.first = directory, None, 0

    def before_step(self, global_step: int) -> None:
        if self.steps and self.profiler is None and self.steps[0] <= global_step <= self.steps[1]:
            from torch.profiler import ProfilerAction, ProfilerActivity, profile, tensorboard_trace_handler  # noqa: PLC0415

            last = self.steps[1]

            def schedule(step: int) -> ProfilerAction:   # called with the job's global step (step_num below)
                if step > last:
                    return ProfilerAction.NONE
                return ProfilerAction.RECORD_AND_SAVE if step == last else ProfilerAction.RECORD

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
            handler = tensorboard_trace_handler(self.directory, worker_name=f"{os.uname().nodename}_rank0")
            self.profiler = profile(activities=activities, schedule=schedule, on_trace_ready=handler)
            self.profiler.step_num = self.first = global_step   # ProfilerStep#<the job's step>
            self.profiler.start()

    def after_step(self, global_step: int) -> None:
        if self.profiler is None:
            return
        self.profiler.step()   # after the last step: the trace is written
        if global_step < self.steps[1]:
            return
        self.profiler.stop()
        self.profiler = None
        common.log.info("profile of steps %d to %d written to %s", self.first, global_step, self.directory)


class TorchBackend:
    """The loop's backend (``loop.Backend``) for a PyTorch model on every rank: Horovod's
    ``DistributedOptimizer``, DDP or FSDP2 average the gradients inside ``train_step``; the
    ``collectives`` total the sums and gather the checkpoint's data positions.

    Args:
        job: the rank (``TorchRank``: its config, model, optimizer, collectives, state dicts,
            precision, accumulation).
        order: the training pipeline's order (``dali_data.ReadOrder``, from ``restore``).
        train_batches, val_batches: this rank's DALI batches (``Batches``).
    """

    def __init__(self, job: TorchRank, order: dali_data.ReadOrder, train_batches: "Batches",
                 val_batches: "Batches"):
        self.job, self.order, self.train_batches, self.val_batches = job, order, train_batches, val_batches
        self.rank = job.rank
        self.world_size = self.rate_scale = job.size
        self.steps_per_epoch = job.steps_per_epoch
        self.profiler = StepProfiler(job.args.profile_steps, job.args.epochs * self.steps_per_epoch,
                                     job.args.tensorboard_dir, job.rank)

    def begin_epoch(self, epoch: int, first_step: int) -> None:
        pass   # the training pipeline is endless, its epochs those of self.order

    def data_order(self, epoch: int, step: int) -> dict:
        """What a job of any world size needs to go on with the training order after ``step``
        steps of epoch ``epoch`` (``restore``): the order's ``start`` (this world size's exact
        resume), the samples of the epoch's permutation read by then, the order's size and batch."""
        return {"start": list(self.order.start), "samples": self.order.samples, "batch_size": self.order.batch_size,
                "offset": self.order.offset(epoch, step * self.job.accumulation.micro_batches),
                "host_sharded": self.job.data.train.host_sharded}

    def set_learning_rate(self, rate: float) -> None:
        for group in self.job.optimizer.param_groups:
            group["lr"] = rate

    def train_step(self, global_step: int) -> "np.ndarray | PendingSums":
        self.profiler.before_step(global_step)
        sums = train_step(self.job.model, self.job.optimizer, self.train_batches, self.job.precision,
                          self.job.args.label_smoothing, self.job.accumulation)
        self.profiler.after_step(global_step)
        return sums

    def total(self, sums: np.ndarray, name: str) -> np.ndarray:
        return self.job.collectives.allreduce_sum(torch.from_numpy(sums), name).numpy()

    def sum_scalar(self, value: float, name: str) -> float:
        return self.job.collectives.sum_scalar(value, name)

    def end_training_steps(self) -> None:
        if not self.job.buffers_synced:
            average_buffers(self.job.model, self.job.collectives)

    def evaluate(self) -> tuple[float, float, int]:
        return evaluate(self.job.model, self.val_batches, self.job.data.val_shard, self.job.collectives)

    def save(self, epoch: int, step: int, train_sums: np.ndarray | None, plateau_state: dict) -> None:
        save_checkpoint(self.job, self.train_batches, (epoch, step), train_sums, plateau_state,
                        self.data_order(epoch, step))


def train(job: TorchRank, stop_request: stop.StopRequest,
          resume: tuple[loop.Resume, dali_data.ReadOrder, str | None]) -> int:
    """Builds this rank's pipelines for ``job.choice``'s input (the training one at ``resume``'s
    data position: ``restore``; batches in the model's layout), trains (``loop.fit`` with a
    ``TorchBackend``), saves the model (``finish``, from ``job.setup.module``: the model without
    its data-parallel wrapper) and writes the report. Returns 0, or ``128 + N`` when stopped by
    signal N (the checkpoint written, the report too)."""
    args, setup, rank, size = job.args, job.setup, job.rank, job.size
    position, order, data_position = resume
    decoding = dali_data.Decoding(setup.dali_device_id, "CHW", job.choice.images, args.dali_threads)
    train_pipe, val_pipe = setup.data.pipelines(args.batch_size, decoding, order=order, seed=args.seed,
                                                train_position=data_position)
    backend = TorchBackend(job, order, Batches(train_pipe, job.device, setup.layout),
                           Batches(val_pipe, job.device, setup.layout))
    observer = observe.Observer(args, rank, size, backend.steps_per_epoch,
                                args.batch_size * job.accumulation.micro_batches * size, job.strategy)
    if rank == 0 and job.precision.dtype is not None:
        common.log.info("precision %s: forward pass and loss under torch.autocast(%s, %s)%s", job.precision.name,
                        job.device.type, job.precision.dtype,
                        ", loss scaling (GradScaler)" if job.precision.scaler else "")
    if rank == 0:
        loop.log_accumulation(job.accumulation.micro_batches, args.batch_size, size, backend.steps_per_epoch)
    return loop.run(loop.Rules.of(args), backend, observer, stop_request, position,
                    lambda val_accuracy: finish(job, val_accuracy))


def finish(job: TorchRank, val_accuracy: float) -> None:
    """Every rank prints its weights' digest (of the whole model: ``job.states``); rank 0 saves
    ``model.pth`` (state dict) and ``model.json`` (``ModelChoice.describe``: what rebuilds it,
    its input and its classes) to the model directory."""
    model_state, _ = job.states.get(job.setup.module, None)
    loop.emit_digest(job.rank, job.size, (v.detach().cpu().numpy() for v in model_state.values()))
    if job.rank != 0:
        return
    state = {k: v.detach().cpu() for k, v in model_state.items()}
    model_dir = job.args.model_dir
    common.atomic_write(os.path.join(model_dir, "model.pth"), lambda tmp: torch.save(state, tmp))
    common.write_json(os.path.join(model_dir, "model.json"), job.choice.describe(
        job.data.classes, val_accuracy=val_accuracy, epochs=job.args.epochs, world_size=job.size,
        precision=job.precision.name))
    common.log.info("saved %s", os.path.join(model_dir, "model.pth"))
