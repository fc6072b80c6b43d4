"""Real photographs as an RGB image-classification data set on disk: crops of the sample photos
that installed packages ship, one class per photo.

The photos: scikit-learn's two sample images (``sklearn.datasets.load_sample_images``:
``china.jpg`` and ``flower.jpg``, 640x427 RGB) and matplotlib's ``grace_hopper.jpg``
(``matplotlib.cbook.get_sample_data``, 512x600 RGB). Nothing is downloaded.

The layout: one folder per class (the ImageFolder convention), one JPEG per crop, in a
``training`` and a ``validation`` channel::

    <root>/training/<photo>/<index>.jpg      TRAINING_PER_CLASS crops per photo
    <root>/validation/<photo>/<index>.jpg    VALIDATION_PER_CLASS crops per photo

A crop is a square whose side is 25-60 % of the photo's shorter side, at a uniformly random
place, resized to ``SIZE`` pixels (Pillow's bicubic filter) and saved at JPEG quality 90. The two
channels draw their crops with different random numbers (``SEED``), so a validation crop is never
a training crop but may overlap one: a rehearsal set for training an RGB architecture, not a
benchmark of generalisation.

Usage: ``python -m dtc_local.job_tree ROOT --photos ...`` writes a job whose channels hold it.
"""

import os

import numpy as np
from PIL import Image

SIZE = 64
TRAINING_PER_CLASS = 160
VALIDATION_PER_CLASS = 40
SEED = 0
CROP_FRACTION = (0.25, 0.6)
CHANNELS = ("training", "validation")


def photographs() -> dict[str, Image.Image]:
    """The photos by class name, RGB."""
    from matplotlib import cbook  # noqa: PLC0415  (only to find its sample photo)
    from sklearn.datasets import load_sample_images  # noqa: PLC0415

    samples = load_sample_images()
    photos = {os.path.splitext(os.path.basename(name))[0]: Image.fromarray(image)
              for name, image in zip(samples.filenames, samples.images, strict=True)}
    with Image.open(cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)) as image:
        photos["grace_hopper"] = image.convert("RGB")
    return photos


def export(root: str, per_class: tuple[int, int] = (TRAINING_PER_CLASS, VALIDATION_PER_CLASS),
           size: int = SIZE) -> dict[str, int]:
    """Writes both channels under ``root`` (existing files are overwritten).

    Args:
        per_class: crops per photo in (training, validation).
        size: the crops' side in pixels.

    Returns:
        images written per channel, e.g. ``{"training": 480, "validation": 120}``.
    """
    counts = {}
    photos = photographs()
    for offset, (channel, count) in enumerate(zip(CHANNELS, per_class, strict=True)):
        random = np.random.default_rng([SEED, offset])
        for name, photo in sorted(photos.items()):
            folder = os.path.join(root, channel, name)
            os.makedirs(folder, exist_ok=True)
            width, height = photo.size
            for index in range(count):
                side = int(min(width, height) * random.uniform(*CROP_FRACTION))
                left, top = int(random.integers(0, width - side + 1)), int(random.integers(0, height - side + 1))
                crop = photo.crop((left, top, left + side, top + side)).resize((size, size), Image.Resampling.BICUBIC)
                crop.save(os.path.join(folder, f"{index:04d}.jpg"), quality=90)
        counts[channel] = count * len(photos)
    return counts

