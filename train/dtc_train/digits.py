"""scikit-learn's handwritten digits as an image-classification data set on disk.

The data: 1,797 real 8x8 grayscale scans of digits 0-9 (UCI "Optical Recognition of Handwritten
Digits", shipped inside scikit-learn as ``sklearn.datasets.load_digits``), pixel values 0..16.

The layout: one folder per class (the ImageFolder convention), one PNG per scan, in a
``training`` and a ``validation`` channel::

    <root>/training/<digit>/<index>.png      1,437 images
    <root>/validation/<digit>/<index>.png      360 images

``<index>`` is the sample's index in ``load_digits()``. The split is fixed:
``train_test_split(test_size=0.2, stratify=labels, random_state=0)``. Pixels are scaled
``round(v * 255 / 16)`` to uint8.

Usage: ``python -m dtc_train.digits <root>``.
"""

import argparse
import os

import numpy as np
from PIL import Image
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

VALIDATION_FRACTION = 0.2
SPLIT_SEED = 0
CHANNELS = ("training", "validation")


def split_indices():
    """(training indices, validation indices) of ``load_digits()``, each sorted."""

    labels = load_digits().target
    train, validation = train_test_split(
        np.arange(len(labels)), test_size=VALIDATION_FRACTION, stratify=labels, random_state=SPLIT_SEED)
    return np.sort(train), np.sort(validation)


def export(root: str) -> dict[str, int]:
    """Writes both channels under ``root`` (existing files are overwritten).

    Returns:
        images written per channel, e.g. ``{"training": 1437, "validation": 360}``.
    """

    digits = load_digits()
    counts = {}
    for channel, indices in zip(CHANNELS, split_indices(), strict=True):
        for index in indices:
            label = int(digits.target[index])
            folder = os.path.join(root, channel, str(label))
            os.makedirs(folder, exist_ok=True)
            pixels = np.round(digits.images[index] * 255.0 / 16.0).astype(np.uint8)
            Image.fromarray(pixels, mode="L").save(os.path.join(folder, f"{index:04d}.png"))
        counts[channel] = len(indices)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", help="directory that receives the training/ and validation/ channels")
    counts = export(parser.parse_args().root)
    print(", ".join(f"{channel}: {count} images" for channel, count in counts.items()))


if __name__ == "__main__":
    main()
