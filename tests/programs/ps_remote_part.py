"""The parameter-server chief's remote read (dtc_train.ps_channel.remote_part) against a real
parameter server: run as the chief of ``TF_CONFIG``'s cluster, it lists and reads the channel at
argv[1] through ``ps:0`` and prints, as JSON, the listing, a digest of the files' bytes and of
the decoded images, and the files this process sees at that path itself (the test runs it in a
mount namespace where that path is an empty folder, so only the server's host has the files)."""

import hashlib
import json
import os
import sys

# isort: off
from dtc_train import tf_env  # noqa: F401

import tensorflow as tf

from dtc_train import image_folder, ps_channel
# isort: on

root, corrupt_images = sys.argv[1], sys.argv[2]
resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
tf.config.experimental_connect_to_cluster(resolver.cluster_spec(), job_name="chief", task_index=0)
listing, contents = ps_channel.remote_part(root, "/job:ps/replica:0/task:0/device:CPU:0", corrupt_images)
images, labels = image_folder.read(listing, contents=contents)
print(json.dumps({
    "classes": listing.classes, "files": listing.files, "labels": listing.labels, "ignored": listing.ignored,
    "corrupt": listing.corrupt,
    "contents_sha256": {path: hashlib.sha256(data).hexdigest() for path, data in contents.items()},
    "images_sha256": hashlib.sha256(images.tobytes()).hexdigest(), "seen_here": sorted(os.listdir(root)),
}))
