"""NVIDIA DALI input pipelines over an ImageFolder channel, sharded by rank.

One pipeline definition serves both frameworks: the channel's image files (``channel.list_images``:
labels from the sorted class-folder names, stray files left out) are read by ``fn.readers.file``,
decoded to grayscale on the CPU, or on the GPU with ``device="mixed"`` (nvJPEG/nvImageCodec) when
the trainer has one, and normalised to float32 in [0, 1]. Without a GPU the pipeline is built with
``device_id=None``, which keeps DALI off CUDA entirely (DALI ``Pipeline`` docs).

Sharding: reader shard ``i`` of ``S`` holds samples
``[floor(i*N/S), floor((i+1)*N/S))`` of the sorted file list, the formula of DALI's
``_calculate_shard_sizes`` in ``nvidia/dali/plugin/base_iterator.py``; the shards are disjoint
and cover the data set, so per-rank sums add up to exact totals.
"""

import logging
import math
from dataclasses import dataclass

from .channel import Channel, list_images

log = logging.getLogger("dtc.train")

READER_NAME = "Reader"


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


def steps_per_epoch(total: int, batch_size: int, world_size: int) -> int:
    """Training steps per epoch, the same on every rank: one pass over the data set in
    global batches of ``batch_size * world_size`` (the last one wrapping around)."""
    return math.ceil(total / (batch_size * world_size))


def image_pipeline(listing: Channel, batch_size: int, shard_id: int, num_shards: int, *,
                   training: bool, device_id: int | None, layout: str, seed: int = 0,
                   num_threads: int = 2, position: str | None = None):
    """Builds the DALI pipeline for one channel.

    Args:
        listing: the channel's image files (``channel.list_images``).
        batch_size: samples per batch on this rank.
        shard_id / num_shards: this rank and the world size.
        training: shuffle and wrap around forever; otherwise read the shard in order, padding
            the last batch with its last sample, and start over at the shard's beginning.
        device_id: the GPU for decoding and outputs, or ``None`` for CPU only.
        layout: ``"CHW"`` (PyTorch) or ``"HWC"`` (TensorFlow).
        position: a checkpoint of this pipeline (DALI checkpointing, enabled on every pipeline
            built here): the reader and RNG go on from it, so a restarted job reads the same
            samples in the same order as if it had not stopped. DALI requires the same
            operators and arguments as the pipeline that wrote it.

    Returns:
        a built ``nvidia.dali.Pipeline`` with outputs (images float32 [B, 1, 8, 8] or
        [B, 8, 8, 1] in [0, 1]; labels int32 [B, 1]).
    """
    from nvidia.dali import fn, pipeline_def, types  # noqa: PLC0415  (DALI only when a pipeline is built)

    @pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=device_id, seed=seed,
                  prefetch_queue_depth=2, enable_checkpointing=True)
    def pipeline():
        encoded, labels = fn.readers.file(
            file_root=listing.root, files=list(listing.files), labels=list(listing.labels), shard_id=shard_id,
            num_shards=num_shards,
            random_shuffle=training, initial_fill=256, pad_last_batch=not training,
            stick_to_shard=not training, name=READER_NAME)
        images = fn.decoders.image(encoded, device="mixed" if device_id is not None else "cpu",
                                   output_type=types.GRAY)
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout=layout,
                                          mean=[0.0], std=[255.0])
        if device_id is not None:
            labels = labels.gpu()
        return images, labels

    pipe = pipeline(checkpoint=position) if position else pipeline()
    pipe.build()
    return pipe


@dataclass(frozen=True)
class RankData:
    """This rank's view of the training and validation channels, and their pipelines' settings.

    Attributes:
        train / val: the channels' listings.
        steps_per_epoch: training steps per epoch, equal on all ranks.
        val_shard: this rank's validation shard.
    """

    train: Channel
    val: Channel
    steps_per_epoch: int
    val_shard: Shard

    @property
    def train_total(self) -> int:
        return len(self.train)

    @property
    def val_total(self) -> int:
        return len(self.val)

    def describe(self) -> str:
        return (f"{self.train_total} training images ({self.steps_per_epoch} steps/epoch), "
                f"{self.val_total} validation images ({self.val_shard.size} on this rank)")

    def pipelines(self, batch_size: int, rank: int, size: int, *, device_id: int | None, layout: str,
                  seed: int, num_threads: int, train_position: str | None = None):
        """(training, validation) pipelines for this rank, the training one resumed at
        ``train_position`` when given; see ``image_pipeline``."""
        common = dict(device_id=device_id, layout=layout, num_threads=num_threads)
        return (self.train_pipeline(batch_size, rank, size, seed=seed, position=train_position, **common),
                image_pipeline(self.val, batch_size, rank, size, training=False, **common))

    def train_pipeline(self, batch_size: int, rank: int, size: int, *, device_id: int | None, layout: str,
                       seed: int, num_threads: int, position: str | None = None):
        """This rank's training pipeline (shuffled with ``seed + rank``); see ``image_pipeline``."""
        return image_pipeline(self.train, batch_size, rank, size, training=True, seed=seed + rank, device_id=device_id,
                              layout=layout, num_threads=num_threads, position=position)


def rank_data(train_root: str, val_root: str, batch_size: int, rank: int, size: int,
              corrupt_images: str = "fail") -> RankData:
    """Lists both channels (rank 0 logs what it ignores) and derives this rank's steps and
    validation shard.

    Raises:
        FileNotFoundError: a channel is missing or has no images (``channel.list_images``).
        ValueError: corrupt image files and ``corrupt_images="fail"`` (``channel.list_images``).
    """
    train, val = list_images(train_root, corrupt_images), list_images(val_root, corrupt_images)
    if rank == 0:
        train.log_ignored(log)
        val.log_ignored(log)
    return RankData(train, val, steps_per_epoch(len(train), batch_size, size),
                    Shard(shard_size(len(val), rank, size), batch_size))
