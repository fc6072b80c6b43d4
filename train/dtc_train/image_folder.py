"""An ImageFolder channel read into memory with Pillow, for trainers whose input pipeline is
``tf.data`` (MultiWorkerMirroredStrategy shards it, or each worker reads its host's part of a
ShardedByS3Key channel; ParameterServerStrategy ships it to workers).

The samples and labels are ``channel.list_images``', the ones the DALI pipelines read, so every
trainer sees the same samples with the same labels and skips the same stray files.
"""

import io
import os
from collections.abc import Mapping

import numpy as np
from PIL import Image

from .channel import Channel, list_images
from .dali_data import DIGITS_IMAGES, ImageSpec


def read(listing: Channel, spec: ImageSpec = DIGITS_IMAGES, crop: int | None = None,
         contents: Mapping[str, bytes] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Reads every image of a listed channel (``channel.list_images``, or a host's part of a
    ShardedByS3Key channel labelled by every host's classes: ``dali_data.rank_data``) as the DALI
    pipeline's evaluation does: decoded to ``spec.channels`` (grayscale or RGB), the shorter
    side resized to ``spec.eval_resize`` (bilinear), the centre ``crop`` x ``crop`` square
    (default ``spec.size``; ``spec.eval_resize`` keeps the whole resized square for a training
    augmentation to crop from: ``augment``), normalized to ``(pixel - mean) / std``. A file in
    ``contents`` (listed path -> encoded bytes: another host's file, ``ps_channel``) is decoded
    from those bytes instead of read from ``listing.root``.

    Returns:
        images float32 [N, crop, crop, C], labels int32 [N].
    """
    crop = crop or spec.size
    mean, std = np.array(spec.mean, np.float32), np.array(spec.std, np.float32)
    images = []
    for file in listing.files:
        source = io.BytesIO(contents[file]) if contents and file in contents else os.path.join(listing.root, file)
        with Image.open(source) as image:
            image = image.convert("L" if spec.channels == 1 else "RGB")
            if min(image.size) != spec.eval_resize:
                scale = spec.eval_resize / min(image.size)
                image = image.resize((max(crop, round(image.size[0] * scale)), max(crop, round(image.size[1] * scale))),
                                     Image.Resampling.BILINEAR)
            left, top = (int((side - crop) / 2 + 0.5) for side in image.size)   # DALI's centre rounds half up
            pixels = np.asarray(image.crop((left, top, left + crop, top + crop)), dtype=np.float32)
        images.append(pixels.reshape(crop, crop, spec.channels))
    return (np.stack(images) - mean) / std, np.asarray(listing.labels, dtype=np.int32)


def augment(image, seed, size: int):
    """The training augmentation of ``dali_data``'s pipeline in ``tf.data``: a random resized
    crop (8-100 % of the area, aspect ratio 3/4 to 4/3) of ``image`` (float32 [H, W, C], as
    ``read`` keeps it at ``eval_resize``) resized to ``size`` x ``size``, and a horizontal flip
    with probability 0.5. Stateless, from ``seed`` (int32/int64 [2]): the same sample at the same
    position of the same epoch gets the same crop, so a resumed job reads what an uninterrupted
    one did."""
    import tensorflow as tf  # noqa: PLC0415  (the tf.data trainers only)

    begin, extent, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.shape(image), tf.zeros([1, 0, 4]), seed=seed, min_object_covered=0.0,
        aspect_ratio_range=(0.75, 4.0 / 3.0), area_range=(0.08, 1.0), use_image_if_no_bounding_boxes=True)
    cropped = tf.image.resize(tf.slice(image, begin, extent), (size, size))
    return tf.image.stateless_random_flip_left_right(cropped, seed=seed + 1)


def load(root: str, log=None, corrupt_images: str = "fail") -> tuple[np.ndarray, np.ndarray]:
    """Lists and reads every image of the channel at ``root`` (``log``: where to name ignored
    entries; ``corrupt_images``: ``channel.list_images``). Returns ``read``'s arrays of the digits input.

    Raises:
        FileNotFoundError: ``root`` is missing or has no image in a class folder.
        ValueError: corrupt image files and ``corrupt_images="fail"``.
    """
    channel = list_images(root, corrupt_images)
    if log is not None:
        channel.log_ignored(log)
    return read(channel)
