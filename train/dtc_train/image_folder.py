"""An ImageFolder channel read into memory with Pillow, for trainers whose input pipeline is
``tf.data`` (MultiWorkerMirroredStrategy shards it; ParameterServerStrategy ships it to workers).

Labels follow the sorted class-folder names and files are read in sorted order, as DALI's
``fn.readers.file`` does, so every trainer sees the same samples with the same labels.
"""

import os

import numpy as np


def load(root: str) -> tuple[np.ndarray, np.ndarray]:
    """Reads every image under ``root/<class>/``.

    Returns:
        images float32 [N, H, W, 1] in [0, 1] (grayscale, pixel / 255), labels int32 [N].

    Raises:
        FileNotFoundError: ``root`` has no class folders or no images.
    """
    from PIL import Image

    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d))) if os.path.isdir(root) else []
    images, labels = [], []
    for label, name in enumerate(classes):
        folder = os.path.join(root, name)
        for file in sorted(os.listdir(folder)):
            with Image.open(os.path.join(folder, file)) as image:
                images.append(np.asarray(image.convert("L"), dtype=np.float32) / 255.0)
            labels.append(label)
    if not images:
        raise FileNotFoundError(f"no images in class folders under {root}")
    return np.stack(images)[..., None], np.asarray(labels, dtype=np.int32)
