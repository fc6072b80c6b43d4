"""Channel listing (train/dtc_train/channel.py): only image files in class folders are samples."""

import io
import logging
from pathlib import Path

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


def _sharded_job(tmp_path, monkeypatch, hosts, distribution):
    import json

    from dtc_local import job_tree

    root = tmp_path / "opt" / "ml"
    job_tree.write(str(root), hyperparameters={}, channels=("training",), hosts=hosts)
    config = root / "input" / "config" / "inputdataconfig.json"
    channels = json.loads(config.read_text())
    channels["training"]["S3DistributionType"] = distribution
    config.write_text(json.dumps(channels))
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(root))
    monkeypatch.delenv("SM_CHANNEL_TRAINING", raising=False)
    return root


@pytest.mark.parametrize("hosts, distribution, host_sharded", [
    (("algo-1", "algo-2"), "ShardedByS3Key", True),
    (("algo-1",), "ShardedByS3Key", False),            # one host holds every shard
    (("algo-1", "algo-2"), "FullyReplicated", False),
])
def test_a_channel_is_host_sharded_only_when_sharded_by_key_on_several_hosts(
        tmp_path, monkeypatch, hosts, distribution, host_sharded):
    """Each host of a ShardedByS3Key job holds a different part: the DALI trainers (Horovod, DDP)
    split the host's part among its ranks (dali_data), MultiWorkerMirrored's workers read their
    host's part, the parameter server's chief gathers every host's part (ps_channel)."""
    from dtc_train import contract

    root = _sharded_job(tmp_path, monkeypatch, hosts, distribution)
    assert contract.channel_dir("training") == str(root / "input" / "data" / "training")
    assert contract.host_sharded("training") is host_sharded and contract.instance_count() == len(hosts)


def _paths(root):
    """What tf.io.matching_files gives for <root>/*, <root>/*/* and <root>/*/*/*, relative to root."""
    return tuple(sorted(str(path.relative_to(root)) for path in root.glob(pattern))
                 for pattern in ("*", "*/*", "*/*/*"))


def test_a_channel_seen_only_as_paths_lists_as_on_disk(tmp_path):
    """Another host's part is listed from its paths (ps_channel.remote_part): the same classes,
    samples, labels and ignored entries as channel.list_images of the same tree."""
    root = _image_folder(tmp_path / "training", {"cat": 3, "dog": 2})
    add_stray_files(root)
    (root / "dog" / "004.JPG").write_bytes((root / "dog" / "000.png").read_bytes())
    for folder in ("nested", "odd.png"):   # folders in a class, one named as an image
        (root / "dog" / folder).mkdir()
        (root / "dog" / folder / "5.png").write_bytes((root / "dog" / "000.png").read_bytes())
    on_disk = channel.list_images(str(root), "off")
    assert channel.listing_of_paths(str(root), *_paths(root)) == on_disk
    assert on_disk.ignored[-2:] == ("dog/nested/", "dog/odd.png/")   # ignored on disk and as paths
    assert on_disk.files[-1] == "dog/004.JPG" and on_disk.labels[-1] == 1


def test_every_hosts_part_merged_lists_as_the_whole_channel(tmp_path):
    """The chief merges the hosts' parts of a ShardedByS3Key channel (Channel.merged): the same
    files, labels and order as the whole channel FullyReplicated, although one part lacks a
    class; corrupt files are found in bytes (another host's) as on disk."""
    whole = _image_folder(tmp_path / "whole", {"cat": 3, "dog": 2, "eel": 2})
    first, second = tmp_path / "algo-1", tmp_path / "algo-2"
    for index, file in enumerate(sorted(whole.rglob("*.png"))):
        part = first if index % 2 and file.parent.name != "eel" else second
        (part / file.parent.name).mkdir(parents=True, exist_ok=True)
        (part / file.parent.name / file.name).write_bytes(file.read_bytes())
    assert not (first / "eel").exists()
    parts = [channel.list_images(str(first)), channel.listing_of_paths(str(first), *_paths(second))]
    merged = channel.Channel.merged(parts)
    expected = channel.list_images(str(whole))
    assert (merged.classes, merged.files, merged.labels) == (expected.classes, expected.files, expected.labels)
    with pytest.raises(ValueError, match=r"algo-1: cat/001.png, dog/000.png listed on two hosts$"):
        channel.Channel.merged([parts[0], parts[0]])

    contents = {path: (second / path).read_bytes() for path in parts[1].files}
    contents["dog/001.png"] = b"<html>not found</html>"
    skipped = channel.without_corrupt(parts[1], "skip", lambda path: io.BytesIO(contents[path]))
    assert skipped.corrupt == ("dog/001.png",) and "dog/001.png" not in skipped.files
    with pytest.raises(ValueError, match=r"has 1 corrupt image files \(Pillow cannot read them\): dog/001.png; "):
        channel.without_corrupt(parts[1], "fail", lambda path: io.BytesIO(contents[path]))
    images, labels = image_folder.read(skipped, contents={path: contents[path] for path in skipped.files})
    assert images.shape == (len(skipped), 8, 8, 1) and list(labels) == list(skipped.labels)


def test_the_chief_reads_each_hosts_part_through_the_parameter_server_on_that_host():
    """dtc_entrypoint.launch_tf runs ps:<i> on the i-th host (the cluster below is its
    parameter_server_cluster for three hosts: test_strategy_plans)."""
    from dtc_train.ps_channel import ps_tasks

    cluster = {"chief": ["algo-1:2222"], "worker": ["algo-2:2222", "algo-3:2222"],
               "ps": ["algo-1:2223", "algo-2:2223", "algo-3:2223"]}
    assert ps_tasks(cluster) == {"algo-1": 0, "algo-2": 1, "algo-3": 2}


def test_sharded_steps_are_the_smallest_shards_and_the_rest_is_counted():
    from dtc_train import dali_data

    # shards of 300, 299 (host 1) and 100, 99 (host 2) in batches of 32: ceil(99/32) = 4 steps of
    # 128 samples per rank; host 1's ranks leave 172 + 171 unread, host 2's none (99 wraps around)
    assert dali_data.sharded_steps([300, 299, 100, 99], 32) == (4, 343)
    assert dali_data.sharded_steps([64, 64], 32) == (2, 0)
    assert dali_data.sharded_steps([5, 70], 32) == (1, 70 - 32)


def test_a_host_without_files_or_with_fewer_files_than_ranks_fails_every_rank_naming_it():
    from dtc_train.dali_data import HostPart, check_host_parts

    classes = ("0", "1")
    check_host_parts("training", [HostPart("algo-1", 10, 5, classes), HostPart("algo-2", 1, 1, classes)], 2)
    with pytest.raises(ValueError, match=r"^channel 'training' is ShardedByS3Key over 3 instances and host\(s\) "
                                         r"algo-3 received no image files: give the channel at least 3 S3 objects"):
        check_host_parts("training", [HostPart("algo-1", 10, 10, classes), HostPart("algo-2", 4, 4, classes),
                                      HostPart("algo-3", 0, 0, ())], 3)
    with pytest.raises(ValueError, match=r"^channel 'validation' is ShardedByS3Key over 2 instances and host algo-2 "
                                         r"received 1 image files for its 2 processes: every rank needs one"):
        check_host_parts("validation", [HostPart("algo-1", 8, 4, classes), HostPart("algo-1", 8, 4, classes),
                                        HostPart("algo-2", 1, 1, classes), HostPart("algo-2", 1, 0, classes)], 2)


def test_a_hosts_part_missing_a_class_folder_keeps_every_label(tmp_path):
    """Labels follow the union of every host's class folders: a host whose part lacks class
    "cat" must still label "dog" 1, as the host with both does."""
    root = _image_folder(tmp_path / "training", {"dog": 2})
    part = channel.list_images(str(root)).with_classes(("cat", "dog"))
    assert part.classes == ("cat", "dog") and set(part.labels) == {1}
    with pytest.raises(ValueError, match=r"class folders \['dog'\] are not among \['cat'\]"):
        channel.list_images(str(root)).with_classes(("cat",))
    empty = tmp_path / "empty"
    empty.mkdir()
    assert len(channel.list_images(str(empty), allow_empty=True)) == 0


def test_a_local_cluster_deals_a_sharded_channels_objects_to_the_hosts(tmp_path):
    """dtc_local's stand-in for S3's ShardedByS3Key: every file goes to exactly one host, each
    host's tree holds only its part, and its inputdataconfig.json says ShardedByS3Key."""
    import json

    from dtc_local import cluster

    source = _image_folder(tmp_path / "data" / "training", {"cat": 5, "dog": 4})
    (source / "_SUCCESS").write_text("")
    job = cluster.ClusterJob(image="x", instance_count=3, channels={"training": str(source),
                                                                    "validation": str(source)},
                             sharded_channels=("training",))
    trees = cluster.write_trees(job, str(tmp_path / "job"))
    parts = {host: sorted(str(p.relative_to(tree + "/input/data/training")) for p in
                          (tmp_path / "job" / host / "input" / "data" / "training").rglob("*") if p.is_file())
             for host, tree in trees.items()}
    every = sorted(str(p.relative_to(source)) for p in source.rglob("*") if p.is_file())
    assert sorted(sum(parts.values(), [])) == every and all(len(part) in (3, 4) for part in parts.values())
    for host, tree in trees.items():
        config = json.loads((tmp_path / "job" / host / "input" / "config" / "inputdataconfig.json").read_text())
        assert config["training"]["S3DistributionType"] == "ShardedByS3Key"
        assert config["validation"]["S3DistributionType"] == "FullyReplicated"
        mounts = cluster.volumes(job, tree)
        assert not any(m.endswith("/input/data/training:ro") for m in mounts)
        assert any(m.endswith("/input/data/validation:ro") for m in mounts)
    with pytest.raises(ValueError, match=r"sharded_channels names \['test'\]"):
        cluster.write_trees(cluster.ClusterJob(image="x", channels={"training": str(source)},
                                               sharded_channels=("test",)), str(tmp_path / "job2"))


def test_a_local_cluster_deals_a_sharded_channel_unevenly_by_weight(tmp_path):
    """shard_weights (--sharded-channel training:3,1): three of every four files to algo-1, every
    file to exactly one host; a weight of 0 leaves a host without files; bad weights are named."""
    from dtc_local import cluster

    source = _image_folder(tmp_path / "data" / "training", {"cat": 8, "dog": 8})
    parts = {}
    for weights in ((3, 1), (1, 0)):
        job = cluster.ClusterJob(image="x", instance_count=2, channels={"training": str(source)},
                                 sharded_channels=("training",), shard_weights={"training": weights})
        trees = cluster.write_trees(job, str(tmp_path / f"job-{weights[1]}"))
        channels = [Path(tree) / "input" / "data" / "training" for tree in trees.values()]
        parts[weights] = [sorted(p.relative_to(channel) for p in channel.rglob("*") if p.is_file())
                          for channel in channels]
    assert [len(part) for part in parts[(3, 1)]] == [12, 4] and [len(part) for part in parts[(1, 0)]] == [16, 0]
    assert sorted(parts[(3, 1)][0] + parts[(3, 1)][1]) == parts[(1, 0)][0]
    assert {path.parts[0] for path in parts[(3, 1)][1]} == {"cat", "dog"}
    assert (tmp_path / "job-0" / "algo-2" / "input" / "data" / "training").is_dir()   # empty, as on SageMaker
    for weights in ((1,), (0, 0), (2, -1)):
        with pytest.raises(ValueError, match=r"shard weights \[.*\]: give one count >= 0 per host \(2\), not all 0"):
            cluster.write_trees(cluster.ClusterJob(image="x", instance_count=2, channels={"training": str(source)},
                                                   sharded_channels=("training",),
                                                   shard_weights={"training": weights}), str(tmp_path / "bad"))
    with pytest.raises(ValueError, match=r"shard_weights names \['validation'\], which are not among the "):
        cluster.write_trees(cluster.ClusterJob(image="x", instance_count=2, channels={"training": str(source)},
                                               shard_weights={"validation": (1, 1)}), str(tmp_path / "bad"))


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
