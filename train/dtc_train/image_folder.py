"""An ImageFolder channel read into memory with Pillow, for trainers whose input pipeline is
``tf.data`` (MultiWorkerMirroredStrategy shards it, or each worker reads its host's part of a
ShardedByS3Key channel; ParameterServerStrategy ships it to workers).

The samples and labels are ``channel.list_images``', the ones the DALI pipelines read, so every
trainer sees the same samples with the same labels and skips the same stray files.
"""

import os

import numpy as np
from PIL import Image

from .channel import Channel, list_images


def read(listing: Channel) -> tuple[np.ndarray, np.ndarray]:
    """Reads every image of a listed channel (``channel.list_images``, or a host's part of a
    ShardedByS3Key channel labelled by every host's classes: ``dali_data.rank_data``).

    Returns:
        images float32 [N, H, W, 1] in [0, 1] (grayscale, pixel / 255), labels int32 [N].
    """
    images = []
    for file in listing.files:
        with Image.open(os.path.join(listing.root, file)) as image:
            images.append(np.asarray(image.convert("L"), dtype=np.float32) / 255.0)
    return np.stack(images)[..., None], np.asarray(listing.labels, dtype=np.int32)


def load(root: str, log=None, corrupt_images: str = "fail") -> tuple[np.ndarray, np.ndarray]:
    """Lists and reads every image of the channel at ``root`` (``log``: where to name ignored
    entries; ``corrupt_images``: ``channel.list_images``). Returns ``read``'s arrays.

    Raises:
        FileNotFoundError: ``root`` is missing or has no image in a class folder.
        ValueError: corrupt image files and ``corrupt_images="fail"``.
    """
    channel = list_images(root, corrupt_images)
    if log is not None:
        channel.log_ignored(log)
    return read(channel)
