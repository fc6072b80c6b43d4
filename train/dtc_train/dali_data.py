"""NVIDIA DALI input pipelines over an ImageFolder channel, sharded by rank.

One pipeline definition serves both frameworks: the channel's image files (``channel.list_images``:
labels from the sorted class-folder names, stray files left out) are read by DALI
(``fn.io.file.read`` in the trainer's order for training, ``fn.readers.file`` for evaluation),
decoded on the CPU, or on the GPU with ``device="mixed"`` (nvJPEG/nvImageCodec) when the trainer
has one, to the model's channels (grayscale or RGB: ``ImageSpec``; a file of the other kind is
converted), brought to the model's size, augmented for training when asked, and normalised to
float32. Without a GPU the pipeline is built with ``device_id=None``, which keeps DALI off CUDA
entirely (DALI ``Pipeline`` docs).

Training order (``ReadOrder``): the trainer, not DALI's shuffle buffer, owns the epochs. Each
epoch is a seeded permutation of the channel read in global batches, rank ``r`` taking the
``r``-th slice of each, so what a job has read of an epoch is always a prefix of its permutation:
a job resumed at another world size goes on from there, and no sample of the epoch is skipped or
read twice (``torch_common.restore``).

Evaluation sharding: reader shard ``i`` of ``S`` holds samples
``[floor(i*N/S), floor((i+1)*N/S))`` of the sorted file list, the formula of DALI's
``_calculate_shard_sizes`` in ``nvidia/dali/plugin/base_iterator.py``; the shards are disjoint
and cover the data set, so per-rank sums add up to exact totals. A channel whose hosts each hold
a different part (``ShardedByS3Key`` on several hosts) is sharded among the host's ranks instead
(``local_rank`` of ``local_size``), for training too (each rank permutes its own shard per epoch):
the shards of all hosts are still disjoint and cover every host's files, and every rank runs the
steps of the smallest shard (``sharded_steps``).
"""

import dataclasses
import functools
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import contract, loop
from .channel import Channel, list_images

log = logging.getLogger("dtc.train")

READER_NAME = "Reader"

# torchvision's ImageNet normalisation (the transforms of its pretrained weights), in pixel units
IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


@dataclass(frozen=True)
class ImageSpec:
    """What a model takes, and how a channel's image files become it.

    Attributes:
        channels: 1 (files decoded to grayscale) or 3 (decoded to RGB; a grayscale file gets
            three equal channels).
        size: the model's input height and width, pixels.
        mean / std: per channel, in pixel units (0-255): the model sees ``(pixel - mean) / std``.
        augment: training images get a random resized crop (8-100 % of the area, aspect ratio
            3/4 to 4/3, resized to ``size``) and a random horizontal flip (p = 0.5), the
            Inception/ResNet recipe of torchvision's reference scripts and DALI's ResNet-50
            example. Otherwise, and always for evaluation: ``eval_resize`` then the centre crop.
        eval_resize: the shorter side is resized to this many pixels before the centre
            ``size`` x ``size`` crop (``size / 0.875`` in torchvision's ImageNet recipe: 256 for
            224; ``size`` itself keeps the whole image).
    """

    channels: int
    size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    augment: bool = False
    eval_resize: int = 0

    def __post_init__(self):
        if self.channels not in (1, 3) or len(self.mean) != self.channels or len(self.std) != self.channels:
            raise ValueError(f"an ImageSpec has 1 or 3 channels with a mean and std each, got {self}")
        if self.size < 1:
            raise ValueError(f"image size must be at least 1 pixel, got {self.size}")
        if not self.eval_resize:
            object.__setattr__(self, "eval_resize", self.size)

    def shape(self, layout: str) -> tuple[int, int, int]:
        """One image's shape in ``layout`` (``"CHW"`` or ``"HWC"``)."""
        return (self.channels, self.size, self.size) if layout == "CHW" else (self.size, self.size, self.channels)


# The digits CNN's input: 8x8 grayscale, pixel / 255, no augmentation (make train's job).
DIGITS_IMAGES = ImageSpec(channels=1, size=8, mean=(0.0,), std=(255.0,))
ARCHITECTURE_IMAGE_SIZE = 224   # torchvision's and keras.applications' ImageNet input
EVAL_CROP_FRACTION = 0.875      # ImageNet evaluation: resize to 256, centre crop 224


def input_spec(digits: bool, image_size: int | None, augment: str, family: str) -> ImageSpec:
    """The input of the digits CNN (``digits``) or of an ImageNet-style architecture, from the
    hyperparameters ``image-size`` (default 224 for an architecture) and ``augment`` (``auto``:
    on for an architecture, off for the digits CNN); ``family`` names the architectures for the
    error (``a torchvision architecture (model=resnet50, ...)``).

    Raises:
        ValueError: an image size below 1, or the digits CNN at another size than 8.
    """
    if image_size is not None and image_size < 1:
        raise ValueError(f"image-size must be at least 1 pixel, got {image_size}")
    if digits:
        if image_size not in (None, DIGITS_IMAGES.size):
            raise ValueError(f"model=digits takes {DIGITS_IMAGES.size}x{DIGITS_IMAGES.size} images; leave "
                             f"image-size unset, or choose {family}")
        images = DIGITS_IMAGES
    else:
        size = image_size or ARCHITECTURE_IMAGE_SIZE
        images = ImageSpec(channels=3, size=size, mean=IMAGENET_MEAN, std=IMAGENET_STD,
                           eval_resize=round(size / EVAL_CROP_FRACTION))
    return dataclasses.replace(images, augment={"on": True, "off": False, "auto": not digits}[augment])


@dataclass(frozen=True)
class Shard:
    """This rank's part of a channel.

    Attributes:
        size: samples in the shard.
        batch_size: samples per batch.
    """

    size: int
    batch_size: int

    @property
    def batches(self) -> int:
        """Batches in one pass over the shard (the last one padded)."""
        return math.ceil(self.size / self.batch_size)

    def real_samples(self, batch_index: int) -> int:
        """Samples of batch ``batch_index`` that are not padding."""
        return min(self.batch_size, self.size - batch_index * self.batch_size)


def shard_size(total: int, shard_id: int, num_shards: int) -> int:
    """Samples in shard ``shard_id`` of ``num_shards`` over ``total`` (DALI's formula)."""
    return (total * (shard_id + 1)) // num_shards - (total * shard_id) // num_shards


@functools.lru_cache(maxsize=2)
def _permutation(seed: int, epoch: int, samples: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(samples)


@dataclass(frozen=True)
class ReadOrder:
    """Which training samples a rank reads at each batch: the trainer's own epochs.

    Epoch ``e`` is a permutation ``P_e`` of the samples (numpy's ``default_rng([seed, e])``,
    the same on every rank). Its batches read ``P_e`` from the start in global strides of
    ``lanes * batch_size``: batch ``b`` of lane ``l`` is ``P_e[o_b + l * batch_size + j]`` for
    ``j < batch_size``, with ``o_b = b * lanes * batch_size`` (indices past the end wrap to its
    start: the last batch of an epoch that does not divide evenly repeats a few). So after any
    batch, what the job has read of the epoch is a prefix of ``P_e``, whatever the world size:
    a job resumed with another one goes on from that prefix's end (``resumed_start``) and reads
    every sample of the epoch once.

    Attributes:
        samples: how many samples are permuted: the channel's (every rank reading it, ``lanes``
            = world size, ``lane`` = rank), or this rank's shard of its host's part of a
            ``ShardedByS3Key`` channel (``lanes`` 1).
        first: the listing index of sample 0 (the shard's first file).
        batch_size: samples per batch on each rank.
        lane / lanes: this reader's place in a global batch, and the readers sharing one.
        batches_per_epoch: batches each rank reads per epoch (those the training loop takes;
            samples of the permutation beyond them are not read in that epoch).
        seed: the permutations' seed.
        start: ``(epoch, batch, offset)`` of the pipeline's first batch: the batch it is, and
            the position in ``P_epoch`` where it starts (``b * lanes * batch_size`` unless the
            epoch was begun by a job of another world size).
    """

    samples: int
    batch_size: int
    lane: int
    lanes: int
    batches_per_epoch: int
    seed: int
    first: int = 0
    start: tuple[int, int, int] = (0, 0, 0)

    @property
    def stride(self) -> int:
        """Samples one batch of all lanes reads."""
        return self.lanes * self.batch_size

    def locate(self, iteration: int) -> tuple[int, int]:
        """(epoch, offset in its permutation) of the pipeline's batch number ``iteration``."""
        epoch, batch, offset = self.start
        left = self.batches_per_epoch - batch
        if iteration < left:
            return epoch, offset + iteration * self.stride
        done = iteration - left
        return epoch + 1 + done // self.batches_per_epoch, (done % self.batches_per_epoch) * self.stride

    def offset(self, epoch: int, batch: int) -> int:
        """Samples of ``P_epoch`` read by the whole job before batch ``batch`` of ``epoch``."""
        start_epoch, start_batch, start_offset = self.start
        if epoch == start_epoch:
            return start_offset + (batch - start_batch) * self.stride
        return batch * self.stride

    def indices(self, iteration: int) -> np.ndarray:
        """Listing indices (int64 [batch_size]) of the pipeline's batch number ``iteration``."""
        epoch, offset = self.locate(iteration)
        positions = (offset + self.lane * self.batch_size + np.arange(self.batch_size)) % self.samples
        return self.first + _permutation(self.seed, epoch, self.samples)[positions]

    def resumed_start(self, epoch: int, offset: int, micro_batches: int = 1) -> tuple[int, int, int]:
        """The ``start`` that goes on with ``P_epoch`` after its first ``offset`` samples (read by
        a job of any world size), at a batch that begins an optimizer step of ``micro_batches``:
        the epoch's remaining steps are as many as its unread samples need (at least one), so
        the batch is ``batches_per_epoch`` less that many steps' batches."""
        unread = self.batches_per_epoch * self.stride - offset
        steps = max(1, math.ceil(unread / (self.stride * micro_batches)))
        return epoch, max(0, self.batches_per_epoch - steps * micro_batches), offset


class _BatchSource:
    """DALI ``external_source`` callback for batch ``BatchInfo.iteration`` of ``order``
    (``ReadOrder.indices``): each sample's file path, encoded and zero-padded to the listing's
    longest (uint8 [B, L]), its length (int32 [B, 1]) and its label (int32 [B, 1]). Three dense
    arrays built by numpy from the listing's names (one fixed-width bytes array: about 30 bytes a
    file), so the training loop's thread, which runs this, spends microseconds a batch (a list of
    B ragged paths cost it ~20 us a sample). DALI keeps the iteration in its checkpoints, so a
    restored pipeline asks on from where it was."""

    def __init__(self, listing: Channel, order: ReadOrder):
        self.root = os.path.join(listing.root, "").encode()
        self.names = np.array([name.encode() for name in listing.files])
        self.width = len(self.root) + self.names.dtype.itemsize
        self.lengths = (len(self.root) + np.char.str_len(self.names)).astype(np.int32).reshape(-1, 1)
        self.labels = np.asarray(listing.labels, dtype=np.int32).reshape(-1, 1)
        self.order = order

    def __call__(self, info) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        indices = self.order.indices(info.iteration)
        paths = np.char.add(self.root, self.names[indices]).astype(f"S{self.width}")
        padded = np.frombuffer(paths.tobytes(), dtype=np.uint8).reshape(len(indices), self.width)
        return padded, self.lengths[indices], self.labels[indices]


def steps_per_epoch(total: int, batch_size: int, world_size: int) -> int:
    """Training steps per epoch, the same on every rank: one pass over the data set in
    global batches of ``batch_size * world_size`` (the last one wrapping around)."""
    return math.ceil(total / (batch_size * world_size))


@dataclass(frozen=True)
class Decoding:
    """Where and how a pipeline decodes its images, the same for a rank's training and
    validation pipelines.

    Attributes:
        device_id: the GPU for decoding and outputs, or ``None`` for CPU only.
        layout: ``"CHW"`` (PyTorch) or ``"HWC"`` (TensorFlow).
        spec: the model's input (channels, size, normalisation) and the training augmentation.
        num_threads: DALI's CPU threads per pipeline (``--dali-threads``).
    """

    device_id: int | None
    layout: str
    spec: ImageSpec = DIGITS_IMAGES
    num_threads: int = 2


def training_pipeline(listing: Channel, batch_size: int, decoding: Decoding, order: ReadOrder, *, seed: int = 0,
                      position: str | None = None, one_epoch: bool = False):
    """The DALI pipeline of one rank's training batches: the samples of each batch of ``order``
    (``ReadOrder``; endless), augmented when ``decoding.spec`` asks. Their paths come from a DALI
    ``external_source`` (PyTorch's iterator), or, with ``one_epoch``, the first epoch of ``order``
    is listed for ``fn.readers.file`` (DALI's TensorFlow dataset takes no Python source; that
    pipeline is built per epoch and wraps around after it).

    Args:
        listing: the channel's image files (``channel.list_images``).
        batch_size: samples per batch on this rank.
        seed: the pipeline's random seed (augmentation).
        position: a checkpoint of this pipeline (DALI checkpointing, enabled on every pipeline
            built here): its batch count and RNG go on from it, so a restarted job reads and
            augments the same samples as if it had not stopped. DALI requires the same
            operators and arguments (``order`` included) as the pipeline that wrote it.

    Returns:
        a built ``nvidia.dali.Pipeline`` (``_build``'s outputs).
    """
    from nvidia.dali import fn, types  # noqa: PLC0415  (DALI only when a pipeline is built)

    def read():
        if one_epoch:
            indices = np.concatenate([order.indices(i) for i in range(order.batches_per_epoch - order.start[1])])
            return fn.readers.file(file_root=listing.root, files=[listing.files[i] for i in indices],
                                   labels=[listing.labels[i] for i in indices], name=READER_NAME)
        # the trainer's order: paths and labels, the files read by DALI's threads
        padded, lengths, labels = fn.external_source(source=_BatchSource(listing, order), num_outputs=3, batch=True,
                                                     batch_info=True, dtype=[types.UINT8, types.INT32, types.INT32])
        # plain reads: mmap made small files' reads 30 % slower than fn.readers.file's (measured
        # 2026-11-26 on 8 x 8 PNGs: 0.95 against 0.73 ms per batch of 32; 0.70 without mmap)
        return fn.io.file.read(fn.slice(padded, start=[0], shape=lengths, axes=[0]), dont_use_mmap=True), labels

    return _build(read, batch_size, decoding, training=True, seed=seed, position=position)


def evaluation_pipeline(listing: Channel, batch_size: int, decoding: Decoding, shard: tuple[int, int] = (0, 1)):
    """The DALI pipeline of one rank's validation batches: shard ``(shard_id, num_shards)`` of
    ``listing`` read in order by ``fn.readers.file``, the last batch padded with its last sample,
    starting over at the shard's beginning; resized and centre-cropped (``decoding.spec``)."""
    from nvidia.dali import fn  # noqa: PLC0415  (DALI only when a pipeline is built)

    def read():
        return fn.readers.file(file_root=listing.root, files=list(listing.files), labels=list(listing.labels),
                               shard_id=shard[0], num_shards=shard[1], pad_last_batch=True, stick_to_shard=True,
                               name=READER_NAME)

    return _build(read, batch_size, decoding, training=False)


def _build(read: Callable, batch_size: int, decoding: Decoding, *, training: bool, seed: int = 0,
           position: str | None = None):
    """Builds a pipeline whose files and labels ``read()`` gives (DALI data nodes), decoded and
    normalised as ``decoding`` says, with DALI checkpointing on (restored at ``position``).

    Returns:
        a built ``nvidia.dali.Pipeline`` with outputs (images float32 [B, C, S, S] or
        [B, S, S, C], ``decoding.spec.shape(decoding.layout)``; labels int32 [B, 1]).
    """
    from nvidia.dali import fn, pipeline_def, types  # noqa: PLC0415  (DALI only when a pipeline is built)

    spec, device_id = decoding.spec, decoding.device_id

    @pipeline_def(batch_size=batch_size, num_threads=decoding.num_threads, device_id=device_id, seed=seed,
                  prefetch_queue_depth=2, enable_checkpointing=True)
    def pipeline():
        encoded, labels = read()
        decoder = dict(device="mixed" if device_id is not None else "cpu",
                       output_type=types.GRAY if spec.channels == 1 else types.RGB)
        mirror = 0
        if training and spec.augment:
            images = fn.decoders.image_random_crop(encoded, random_area=[0.08, 1.0],
                                                   random_aspect_ratio=[0.75, 4.0 / 3.0], **decoder)
            images = fn.resize(images, resize_x=spec.size, resize_y=spec.size)
            mirror = fn.random.coin_flip(probability=0.5)
        else:
            images = fn.resize(fn.decoders.image(encoded, **decoder), resize_shorter=spec.eval_resize)
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout=decoding.layout,
                                          crop=(spec.size, spec.size), mirror=mirror, mean=list(spec.mean),
                                          std=list(spec.std))
        if device_id is not None:
            labels = labels.gpu()
        return images, labels

    pipe = pipeline(checkpoint=position) if position else pipeline()
    pipe.build()
    return pipe


@dataclass(frozen=True)
class Place:
    """Where this rank runs.

    Attributes:
        rank / size: the global rank and the world size.
        local_rank / local_size: the rank on this host and the host's ranks (processes per host).
        host: this host's name (``contract.current_host``: ``algo-N``).
    """

    rank: int
    size: int
    local_rank: int
    local_size: int
    host: str


@dataclass(frozen=True)
class HostPart:
    """One rank's report of its host's part of a ``ShardedByS3Key`` channel (gathered from all).

    Attributes:
        host: the rank's host.
        files: image files on that host.
        shard: samples of this rank's shard of them.
        classes: the host's class folders, sorted.
    """

    host: str
    files: int
    shard: int
    classes: tuple[str, ...]


def check_host_parts(name: str, parts: list[HostPart], instances: int) -> None:
    """Refuses a ``ShardedByS3Key`` channel on which a host received no image file, or fewer
    files than its ranks (a rank with an empty shard could run no step, and every rank runs as
    many steps as the smallest shard allows).

    Raises:
        ValueError: naming the channel, the hosts, the instance count and what to change.
    """
    empty = sorted({part.host for part in parts if part.files == 0})
    if empty:
        raise ValueError(
            f"channel {name!r} is ShardedByS3Key over {instances} instances and host(s) {', '.join(empty)} received "
            f"no image files: give the channel at least {instances} S3 objects (one per instance, SageMaker "
            "splits the objects, not the images), run fewer instances, or set its S3DataDistributionType to "
            "FullyReplicated")
    short = sorted({(part.host, part.files) for part in parts if part.shard == 0})
    if short:
        host, files = short[0]
        raise ValueError(
            f"channel {name!r} is ShardedByS3Key over {instances} instances and host {host} received {files} image "
            f"files for its {sum(p.host == host for p in parts)} processes: every rank needs one; run fewer "
            "processes per host or give the channel more files")


def sharded_steps(shards: list[int], batch_size: int) -> tuple[int, int]:
    """Steps per epoch on a host-sharded training channel, and the samples left unread per epoch.

    Every rank must run the same number of steps (each step is a collective), so it is the
    smallest over ranks of ``ceil(shard / batch_size)``; a larger shard reads ``steps *
    batch_size`` of its samples per epoch (``ReadOrder``: the first of that epoch's permutation
    of the shard), and the rest are not read in that epoch.

    Args:
        shards: samples of every rank's shard (all positive: ``check_host_parts``).
        batch_size: samples per batch on each rank.

    Returns:
        (steps per epoch, samples over all ranks not read in an epoch).
    """
    steps = min(math.ceil(shard / batch_size) for shard in shards)
    return steps, sum(max(0, shard - steps * batch_size) for shard in shards)


@dataclass(frozen=True)
class ChannelShard:
    """This rank's part of one channel.

    Attributes:
        listing: the image files this rank's reader chooses from (the host's part of a
            host-sharded channel, else the whole channel).
        shard_id / num_shards: the reader's shard of ``listing``: the rank among the host's
            ranks for a host-sharded channel, else the global rank among all ranks.
        total: the channel's images over every host.
        host_sharded: each host holds a different part (``contract.host_sharded``).
    """

    listing: Channel
    shard_id: int
    num_shards: int
    total: int
    host_sharded: bool = False

    @property
    def shard(self) -> int:
        """Samples in this rank's shard."""
        return shard_size(len(self.listing), self.shard_id, self.num_shards)


@dataclass(frozen=True)
class RankData:
    """This rank's view of the training and validation channels, and their pipelines' settings.

    Attributes:
        train / val: this rank's part of each channel.
        steps_per_epoch: training steps per epoch, equal on all ranks.
        val_shard: this rank's validation shard.
        rank: the global rank (its training pipeline augments with seed ``seed + rank``).
        unread_per_epoch: training samples, over all ranks, not read in an epoch (host-sharded
            training channels whose hosts' shards differ: ``sharded_steps``).
    """

    train: ChannelShard
    val: ChannelShard
    steps_per_epoch: int
    val_shard: Shard
    rank: int
    unread_per_epoch: int = 0

    def describe(self) -> str:
        sharded = " (ShardedByS3Key: this host's part)"
        return (f"{self.train.total} training images{sharded if self.train.host_sharded else ''} "
                f"({self.steps_per_epoch} steps/epoch), {self.val.total} validation images"
                f"{sharded if self.val.host_sharded else ''} ({self.val_shard.size} on this rank)")

    @property
    def classes(self) -> tuple[str, ...]:
        """The class folder names, sorted; label ``i`` is ``classes[i]`` in both channels."""
        return self.train.listing.classes

    def read_order(self, batch_size: int, seed: int, micro_batches: int = 1,
                   start: tuple[int, int, int] = (0, 0, 0)) -> ReadOrder:
        """This rank's training order (``ReadOrder``) from ``start``: every rank a lane of the
        channel's epochs, or, on a host-sharded channel, the rank's own shard of its host's part.
        An epoch is the loop's: whole optimizer steps of ``micro_batches`` batches
        (``loop.optimizer_steps``)."""
        batches = loop.optimizer_steps(self.steps_per_epoch, micro_batches, batch_size) * micro_batches
        train = self.train
        if train.host_sharded:
            first = len(train.listing) * train.shard_id // train.num_shards
            return ReadOrder(train.shard, batch_size, 0, 1, batches, seed, first, start)
        return ReadOrder(len(train.listing), batch_size, train.shard_id, train.num_shards, batches, seed, 0, start)

    def pipelines(self, batch_size: int, decoding: Decoding, *, order: ReadOrder, seed: int,
                  train_position: str | None = None):
        """(training, validation) pipelines for this rank, the training one reading ``order``
        (``read_order``) and restored at ``train_position`` when given; see ``train_pipeline``."""
        return (self.train_pipeline(batch_size, decoding, order=order, seed=seed, position=train_position),
                self.val_pipeline(batch_size, decoding))

    def train_pipeline(self, batch_size: int, decoding: Decoding, *, order: ReadOrder, seed: int,
                       position: str | None = None, one_epoch: bool = False):
        """This rank's training pipeline over ``order`` (augmented with seed ``seed + rank``); see
        ``training_pipeline``."""
        return training_pipeline(self.train.listing, batch_size, decoding, order, seed=seed + self.rank,
                                 position=position, one_epoch=one_epoch)

    def val_pipeline(self, batch_size: int, decoding: Decoding):
        """This rank's validation pipeline, its shard in order; see ``evaluation_pipeline``."""
        return evaluation_pipeline(self.val.listing, batch_size, decoding, (self.val.shard_id, self.val.num_shards))


def _channel_shard(name: str, place: Place, allgather_object, corrupt_images: str) -> ChannelShard:
    """Lists channel ``name`` and places this rank's reader in it. A host-sharded channel
    (``contract.host_sharded``) is split among the host's ranks, its classes are the union of
    every host's class folders (a host's part may lack one), and every rank checks every host's
    part together (``check_host_parts``), so all fail alike instead of some waiting in a
    collective for one that failed."""
    root = contract.channel_dir(name)
    if not contract.host_sharded(name):
        listing = list_images(root, corrupt_images)
        return ChannelShard(listing, place.rank, place.size, len(listing))
    listing = list_images(root, corrupt_images, allow_empty=True)
    own = HostPart(place.host, len(listing), shard_size(len(listing), place.local_rank, place.local_size),
                   listing.classes)
    parts = allgather_object(own)
    check_host_parts(name, parts, contract.instance_count())
    classes = tuple(sorted({folder for part in parts for folder in part.classes}))
    total = sum({part.host: part.files for part in parts}.values())
    return ChannelShard(listing.with_classes(classes), place.local_rank, place.local_size, total, host_sharded=True)


def rank_data(train_channel: str, val_channel: str, batch_size: int, place: Place, allgather_object,
              corrupt_images: str = "fail") -> RankData:
    """Lists both channels (rank 0 logs what it ignores) and derives this rank's readers, the
    steps per epoch and the validation shard.

    Args:
        train_channel / val_channel: channel names (``contract.channel_dir``).
        batch_size: samples per batch on each rank.
        place: this rank's place in the job.
        allgather_object: ``obj -> [obj of rank 0, obj of rank 1, ...]`` on every rank (the
            trainer's collective; called only for host-sharded channels).
        corrupt_images: ``channel.list_images``.

    Raises:
        FileNotFoundError: a channel is missing or has no images (``channel.list_images``).
        ValueError: corrupt image files and ``corrupt_images="fail"`` (``channel.list_images``);
            a host-sharded channel with a host or a rank left without images (``check_host_parts``);
            a channel in Pipe mode (``contract.channel_dir``); a validation class folder that the
            training channel lacks (labels follow the training channel's sorted class folders).
    """
    train = _channel_shard(train_channel, place, allgather_object, corrupt_images)
    val = _channel_shard(val_channel, place, allgather_object, corrupt_images)
    unknown = sorted(set(val.listing.classes) - set(train.listing.classes))
    if unknown:
        raise ValueError(
            f"channel {val_channel!r} has class folders {unknown} that channel {train_channel!r} lacks: labels follow "
            f"the training channel's class folders ({len(train.listing.classes)}: "
            f"{', '.join(train.listing.classes[:10])}{' ...' if len(train.listing.classes) > 10 else ''}); give both "
            "channels the same class folders")
    val = dataclasses.replace(val, listing=val.listing.with_classes(train.listing.classes))
    if place.rank == 0:
        train.listing.log_ignored(log)
        val.listing.log_ignored(log)
    unread = 0
    if train.host_sharded:
        shards = allgather_object(train.shard)
        steps, unread = sharded_steps(shards, batch_size)
        if place.rank == 0:
            log.info("channel %s is ShardedByS3Key over %d instances: %d training images, rank shards of %d to %d; "
                     "%d steps per epoch on every rank (the smallest shard's), %d samples per epoch left for later "
                     "epochs", train_channel, contract.instance_count(), train.total, min(shards), max(shards), steps,
                     unread)
    else:
        steps = steps_per_epoch(train.total, batch_size, place.size)
    return RankData(train, val, steps, Shard(val.shard, batch_size), place.rank, unread)
