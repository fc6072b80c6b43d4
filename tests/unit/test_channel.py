"""Channel listing (train/dtc_train/channel.py): only image files in class folders are samples."""

import logging

import numpy as np
import pytest
from PIL import Image

from dtc_train import channel, image_folder
from helpers import add_stray_files


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


@pytest.mark.parametrize("hosts, distribution, refused", [
    (("algo-1", "algo-2"), "ShardedByS3Key", True),
    (("algo-1",), "ShardedByS3Key", False),            # one host holds every shard
    (("algo-1", "algo-2"), "FullyReplicated", False),
])
def test_a_sharded_channel_on_several_hosts_is_refused_naming_what_to_set(tmp_path, monkeypatch, hosts, distribution,
                                                                         refused):
    """Built-in trainers shard a full copy by rank; ShardedByS3Key gives each host a different part."""
    import json

    from dtc_local import job_tree
    from dtc_train import contract

    root = tmp_path / "opt" / "ml"
    job_tree.write(str(root), hyperparameters={}, channels=("training",), hosts=hosts)
    config = root / "input" / "config" / "inputdataconfig.json"
    channels = json.loads(config.read_text())
    channels["training"]["S3DistributionType"] = distribution
    config.write_text(json.dumps(channels))
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(root))
    monkeypatch.delenv("SM_CHANNEL_TRAINING", raising=False)
    if refused:
        with pytest.raises(ValueError, match=r"^channel 'training' is ShardedByS3Key \(input/config/inputdataconfig"
                                             r"\.json\) on 2 hosts.*set the channel's S3DataDistributionType to "
                                             r"FullyReplicated"):
            contract.channel_dir("training")
    else:
        assert contract.channel_dir("training") == str(root / "input" / "data" / "training")


def _add_corrupt_images(root) -> list[str]:
    """Three ways image files arrive broken: empty, an HTML error page, a truncated upload."""
    (root / "cat" / "empty.png").write_bytes(b"")
    (root / "dog" / "page.jpg").write_text("<html><body>403 Forbidden</body></html>")
    (root / "dog" / "short.png").write_bytes((root / "dog" / "000.png").read_bytes()[:20])
    return ["cat/empty.png", "dog/page.jpg", "dog/short.png"]


def test_corrupt_images_fail_the_channel_by_default_naming_them_and_the_option(tmp_path):
    root = _image_folder(tmp_path / "training", {"cat": 3, "dog": 2})
    bad = _add_corrupt_images(root)
    with pytest.raises(ValueError, match=r"has 3 corrupt image files \(Pillow cannot read them\): "
                                         + ", ".join(bad) + r"; remove them, or set the hyperparameter "
                                         r"corrupt-images=skip"):
        channel.list_images(str(root))


def test_corrupt_images_are_skipped_and_named_once_with_skip(tmp_path, caplog):
    root = _image_folder(tmp_path / "training", {"cat": 3, "dog": 2})
    bad = _add_corrupt_images(root)
    listed = channel.list_images(str(root), corrupt_images="skip")
    assert listed.files == ("cat/000.png", "cat/001.png", "cat/002.png", "dog/000.png", "dog/001.png")
    assert listed.labels == (0, 0, 0, 1, 1) and listed.corrupt == tuple(bad)
    with caplog.at_level(logging.WARNING):
        listed.log_ignored(logging.getLogger("test"))
    assert [r.getMessage() for r in caplog.records if "corrupt" in r.getMessage()] == [
        f"channel {root}: skipping 3 corrupt image files (corrupt-images=skip): {', '.join(bad)}"]
    images, labels = image_folder.load(str(root), corrupt_images="skip")     # what the tf.data trainers read
    assert images.shape == (5, 8, 8, 1) and labels.tolist() == [0, 0, 0, 1, 1]


def test_corrupt_images_off_checks_nothing(tmp_path):
    root = _image_folder(tmp_path / "training", {"cat": 3, "dog": 2})
    _add_corrupt_images(root)
    assert len(channel.list_images(str(root), corrupt_images="off")) == 8


@pytest.mark.parametrize("mode, refused", [("Pipe", True), ("FastFile", False), ("File", False), (None, False)])
def test_a_pipe_mode_channel_is_refused_before_reading_and_fastfile_reads_as_files(tmp_path, monkeypatch, mode,
                                                                                   refused):
    """Pipe mode gives FIFOs (``training_0``, ``training_1``...) instead of a directory; FastFile
    presents the objects as files, which is all the trainers need."""
    import json

    from dtc_local import job_tree
    from dtc_train import contract

    root = tmp_path / "opt" / "ml"
    job_tree.write(str(root), hyperparameters={}, channels=("training",), hosts=("algo-1", "algo-2"))
    config = root / "input" / "config" / "inputdataconfig.json"
    channels = json.loads(config.read_text())
    channels["training"].pop("TrainingInputMode", None)
    if mode:
        channels["training"]["TrainingInputMode"] = mode
    config.write_text(json.dumps(channels))
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(root))
    monkeypatch.delenv("SM_CHANNEL_TRAINING", raising=False)
    assert contract.channel_input_mode("training") == (mode or "File")
    if refused:
        with pytest.raises(ValueError, match=r"^channel 'training' is in Pipe mode \(TrainingInputMode in "
                                             r"input/config/inputdataconfig\.json\).*in File or FastFile mode"):
            contract.channel_dir("training")
    else:
        assert contract.channel_dir("training") == str(root / "input" / "data" / "training")
