"""The parameter-server chief's copy of a channel, gathered from every host when each host holds
a part of it.

The parameter-server trainer (``tensorflow_ps``) reads the training and validation channels into
the chief's memory and ships the batches to the workers with the dataset function. On a
``ShardedByS3Key`` channel of several hosts (``contract.host_sharded``) each host holds a
different part, so the chief gathers the parts: its own host's from its disk, every other host's
through the parameter server that runs there (``ps:<i>`` on the i-th host:
``dtc_entrypoint.launch_tf``), with TensorFlow ops placed on that task's CPU:
``tf.io.matching_files`` lists the part and ``tf.io.read_file`` reads its image files,
``READ_FILES`` per call, the bytes coming back over the cluster's gRPC channels. Each part is read
from its own host's disk only; the chief decodes them all as it decodes its own
(``image_folder.read``).

A remote part is listed by ``channel.list_images``' rules (``channel.listing_of_paths``) and
checked for corrupt files the same way; the labels follow the union of every host's class
folders, and the merged listing is the one the same files give FullyReplicated
(``channel.Channel.merged``): the job trains and validates on the whole channel, exactly as it
would FullyReplicated. A host that received no image file fails the job before any step
(``dali_data.check_host_parts``). The chief holds every part's encoded bytes while it decodes
them, besides the decoded arrays it already held for a FullyReplicated channel.
"""

import io
import posixpath

from . import channel, common, contract, dali_data

READ_FILES = 256   # files per remote read: a few MB of JPEGs, far below gRPC's message limit


def ps_tasks(cluster: dict[str, list[str]]) -> dict[str, int]:
    """The parameter server of each host, from ``TF_CONFIG``'s cluster (addresses ``host:port``).

    Returns:
        host -> the index of the first ``ps`` task on it, in the cluster's host order.
    """
    tasks: dict[str, int] = {}
    for index, address in enumerate(cluster.get("ps", [])):
        tasks.setdefault(address.rsplit(":", 1)[0], index)
    return tasks


def remote_part(root: str, device: str, corrupt_images: str) -> tuple[channel.Channel, dict[str, bytes]]:
    """Lists and reads the channel at ``root`` on the host of ``device`` (a task's CPU).

    Returns:
        (its listing, its image files' bytes by listed path); an empty listing when the host
        has no image file there.

    Raises:
        ValueError: corrupt image files with ``corrupt_images="fail"`` (``channel.without_corrupt``).
        tensorflow.errors.OpError: the task is unreachable or a file cannot be read.
    """
    import tensorflow as tf  # noqa: PLC0415  (imported by tensorflow_ps after tf_env; the unit tests need none)

    def relative(paths) -> list[str]:
        return [posixpath.relpath(path.decode(), root) for path in paths.numpy()]

    @tf.function   # one function for every call of READ_FILES files (one trace more for the last, shorter one)
    def read_files(paths):
        return tf.map_fn(tf.io.read_file, paths, fn_output_signature=tf.string)

    with tf.device(device):
        top, inside, deeper = (relative(tf.io.matching_files(root + pattern)) for pattern in ("/*", "/*/*", "/*/*/*"))
    listing = channel.listing_of_paths(root, top, inside, deeper)
    contents: dict[str, bytes] = {}
    for start in range(0, len(listing.files), READ_FILES):
        files = listing.files[start:start + READ_FILES]
        with tf.device(device):
            data = read_files(tf.constant([posixpath.join(root, file) for file in files]))
        contents.update(zip(files, data.numpy().tolist(), strict=True))
    listing = channel.without_corrupt(listing, corrupt_images, lambda path: io.BytesIO(contents[path]))
    return listing, {path: contents[path] for path in listing.files}


def read_channel(name: str, corrupt_images: str, cluster: dict[str, list[str]]) -> tuple[channel.Channel,
                                                                                        dict[str, bytes]]:
    """The listing of channel ``name`` for the chief: ``channel.list_images`` of its directory,
    or, on a ``ShardedByS3Key`` channel of several hosts, every host's part merged (above).

    Returns:
        (the listing, the bytes of the files other hosts hold, by listed path: for
        ``image_folder.read``'s ``contents``).

    Raises:
        FileNotFoundError: the channel is missing or holds no image (FullyReplicated).
        ValueError: a host of a sharded channel received no image file (naming the channel, the
            host and the instance count), or corrupt files with ``corrupt_images="fail"``.
    """
    root = contract.channel_dir(name)
    if not contract.host_sharded(name):
        return channel.list_images(root, corrupt_images), {}
    here, instances = contract.current_host(), contract.instance_count()
    parts, contents, reports, where = [], {}, [], []
    for host, task in ps_tasks(cluster).items():
        if host == here:
            part = channel.list_images(root, corrupt_images, allow_empty=True)
            where.append(f"{len(part)} on {host} (here)")
        else:
            part, part_contents = remote_part(root, f"/job:ps/replica:0/task:{task}/device:CPU:0", corrupt_images)
            contents.update(part_contents)
            where.append(f"{len(part)} on {host} (read through ps:{task})")
        parts.append(part)
        reports.append(dali_data.HostPart(host, len(part), len(part), part.classes))
    dali_data.check_host_parts(name, reports, instances)
    merged = channel.Channel.merged(parts)
    common.log.info("channel %s is ShardedByS3Key over %d instances: %d images, %s; the chief reads them all",
                    name, instances, len(merged), ", ".join(where))
    return merged, contents
