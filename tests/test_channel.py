"""Channel listing (train/dtc_train/channel.py): only image files in class folders are samples."""

import logging

import numpy as np
import pytest
from PIL import Image

from conftest import add_stray_files
from dtc_train import channel, image_folder


def _image_folder(root, per_class: dict[str, int]):
    for name, count in per_class.items():
        (root / name).mkdir(parents=True)
        for i in range(count):
            Image.fromarray(np.full((8, 8), 16 * i, dtype=np.uint8)).save(root / name / f"{i:03d}.png")
    return root


def test_stray_files_are_ignored_and_named_once(tmp_path, caplog):
    root = _image_folder(tmp_path / "training", {"cat": 3, "dog": 2})
    add_stray_files(root)
    (root / "dog" / "004.JPG").write_bytes((root / "dog" / "000.png").read_bytes())   # extension case
    listed = channel.list_images(str(root))
    assert listed.classes == ("cat", "dog")
    assert listed.files == ("cat/000.png", "cat/001.png", "cat/002.png", "dog/000.png", "dog/001.png", "dog/004.JPG")
    assert listed.labels == (0, 0, 0, 1, 1, 1)
    assert listed.ignored == (".ipynb_checkpoints/", "_SUCCESS", "manifest.json", "cat/.DS_Store", "cat/README.txt")
    with caplog.at_level(logging.WARNING):
        listed.log_ignored(logging.getLogger("t"))
    assert len(caplog.records) == 1 and "ignoring 5 entries" in caplog.records[0].getMessage()


def test_image_folder_load_reads_only_the_samples(tmp_path):
    root = _image_folder(tmp_path / "validation", {"a": 2, "b": 1})
    add_stray_files(root)
    images, labels = image_folder.load(str(root))
    assert images.shape == (3, 8, 8, 1) and images.dtype == np.float32
    assert labels.tolist() == [0, 0, 1]
    assert images[1].max() == pytest.approx(16 / 255)


@pytest.mark.parametrize("make, message", [
    (lambda root: None, "does not exist"),
    (lambda root: root.mkdir() or (root / "_SUCCESS").write_text(""), "no image files in class folders"),
])
def test_a_missing_or_empty_channel_is_named(tmp_path, make, message):
    root = tmp_path / "training"
    make(root)
    with pytest.raises(FileNotFoundError, match=message) as raised:
        channel.list_images(str(root))
    assert str(root) in str(raised.value)
