"""Writes an ``/opt/ml`` tree the way the SageMaker service and the Python SDK write one.

Files (the SageMaker Developer Guide's "How Amazon SageMaker Runs Your Training Image"
and "How Amazon SageMaker Provides Training Information"; the toolkit's ``environment.py``):

* ``input/config/resourceconfig.json``: the service's shape, with ``instance_groups`` whose
  ``hosts`` list starts with the current host (as observed on the real service), or the SDK
  local-mode shape (no groups) with ``--local-mode-shape``;
* ``input/config/inputdataconfig.json``: one entry per channel, File mode, FullyReplicated
  (``ShardedByS3Key`` for the channels in ``sharded_channels``);
* ``input/config/hyperparameters.json``: every value a string, encoded like SDK v2's
  ``Framework`` estimators (``json``: ``json.dumps(value)``) or the generic ``Estimator``
  without ``source_dir`` (``str``: ``str(value)``, so ``False`` is ``"False"``);
* ``input/data/<channel>/``, ``model/``, ``output/data/``, ``code/`` (empty), ``checkpoints/``.

Usage: ``python -m dtc_local.job_tree ROOT --digits --program builtin:pytorch --mpi 2 -p epochs=5``
(``--photos`` instead of ``--digits``: an RGB data set, ``dtc_train.photos``).
"""

import argparse
import json
import os
import shutil
from collections.abc import Mapping, Sequence

ENCODINGS = ("json", "str")


def encode_hyperparameters(hyperparameters: Mapping[str, object], encoding: str = "json") -> dict[str, str]:
    """Encodes values as the SDK does: ``json`` -> ``json.dumps(v)``, ``str`` -> ``str(v)``."""
    if encoding not in ENCODINGS:
        raise ValueError(f"encoding must be one of {ENCODINGS}, got {encoding!r}")
    return {k: json.dumps(v) if encoding == "json" else str(v) for k, v in hyperparameters.items()}


def resource_config(hosts: Sequence[str], current_host: str, instance_type: str = "ml.c5.xlarge",
                    local_mode_shape: bool = False, network_interface: str = "eth0") -> dict:
    """The service's resourceconfig.json for ``current_host`` (or SDK local mode's, no groups)."""
    if local_mode_shape:
        return {"current_host": current_host, "hosts": list(hosts), "network_interface_name": network_interface,
                "current_instance_type": "local"}
    group_hosts = [current_host] + [h for h in hosts if h != current_host]
    return {
        "current_group_name": "homogeneousCluster", "current_host": current_host,
        "current_instance_type": instance_type, "hosts": sorted(hosts),
        "instance_groups": [{"hosts": group_hosts, "instance_group_name": "homogeneousCluster",
                             "instance_type": instance_type}],
        "network_interface_name": network_interface,
    }


def input_data_config(channels: Sequence[str], sharded_channels: Sequence[str] = ()) -> dict:
    return {c: {"TrainingInputMode": "File",
                "S3DistributionType": "ShardedByS3Key" if c in sharded_channels else "FullyReplicated",
                "RecordWrapperType": "None"} for c in channels}


def host_part(source: str, destination: str, instance_count: int, host_index: int,
              weights: Sequence[int] | None = None) -> list[str]:
    """Fills ``destination`` with host ``host_index``'s part (0-based) of the channel at ``source``
    when the channel is ``ShardedByS3Key`` over ``instance_count`` hosts: every file is an S3
    object, keyed by its path below the channel; the sorted keys are dealt out in turn, key ``k``
    to host ``k mod instance_count``. SageMaker gives each instance about 1/N of the objects
    (S3DataSource ``S3DataDistributionType``) without documenting which; dealing in turn gives
    every host a part of every class folder when the folders hold more files than hosts.
    ``weights`` (one count per host) deals unevenly, to rehearse a channel of uneven objects:
    each round gives host ``i`` ``weights[i]`` keys in a row (``3, 1``: three quarters to the
    first host; a 0 leaves a host with an empty channel directory). Files are hard-linked (copied across file
    systems). Returns the keys written, sorted.

    Raises:
        ValueError: ``weights`` is not one count >= 0 per host, or all are 0.
    """
    weights = tuple(weights) if weights else (1,) * instance_count
    if len(weights) != instance_count or min(weights) < 0 or not sum(weights):
        raise ValueError(f"shard weights {list(weights)}: give one count >= 0 per host ({instance_count}), "
                         "not all 0")
    rounds = [host for host, weight in enumerate(weights) for _ in range(weight)]
    keys = sorted(os.path.relpath(os.path.join(folder, name), source)
                  for folder, _, names in os.walk(source) for name in names)
    part = [key for index, key in enumerate(keys) if rounds[index % len(rounds)] == host_index]
    os.makedirs(destination, exist_ok=True)   # the channel's directory exists on every host, empty or not
    for key in part:
        target = os.path.join(destination, key)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        try:
            os.link(os.path.join(source, key), target)
        except OSError:
            shutil.copy2(os.path.join(source, key), target)
    return part


def _write_json(path: str, data: object) -> None:
    with open(path, "w") as handle:
        json.dump(data, handle, indent=2)


def write(root: str, *, hyperparameters: Mapping[str, object], channels: Sequence[str] = (),
          hosts: Sequence[str] = ("algo-1",), current_host: str = "algo-1", encoding: str = "json",
          instance_type: str = "ml.c5.xlarge", local_mode_shape: bool = False,
          clean: bool = True, sharded_channels: Sequence[str] = ()) -> str:
    """Writes the tree at ``root`` (removing an old one first unless ``clean`` is False).

    Channel directories are created empty; fill them (``dtc_train.digits.export``, or a host's
    part of a channel in ``sharded_channels``: ``host_part``) afterwards. Returns ``root``.
    """
    if clean and os.path.exists(root):
        shutil.rmtree(root)
    config_dir = os.path.join(root, "input", "config")
    for sub in ("input/config", "model", "output/data", "code", "checkpoints"):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    for channel in channels:
        os.makedirs(os.path.join(root, "input", "data", channel), exist_ok=True)
    _write_json(os.path.join(config_dir, "resourceconfig.json"),
                resource_config(hosts, current_host, instance_type, local_mode_shape))
    _write_json(os.path.join(config_dir, "inputdataconfig.json"), input_data_config(channels, sharded_channels))
    _write_json(os.path.join(config_dir, "hyperparameters.json"), encode_hyperparameters(hyperparameters, encoding))
    return root


def _parse_value(text: str) -> object:
    """``-p k=v`` values: JSON when they parse (``3``, ``true``, ``[1]``), else the string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root")
    parser.add_argument("--program", help="sagemaker_program (e.g. train.py or builtin:pytorch)")
    parser.add_argument("--submit-dir", help="sagemaker_submit_directory (directory, .tar.gz or s3://)")
    parser.add_argument("--mpi", type=int, metavar="PROCESSES_PER_HOST",
                        help="enable MPI with this many processes per host")
    data = parser.add_mutually_exclusive_group()
    data.add_argument("--digits", action="store_true", help="fill training/validation with the digits data set")
    data.add_argument("--photos", action="store_true",
                      help="fill training/validation with crops of real RGB photographs, one class per photo "
                           "(dtc_train.photos)")
    parser.add_argument("-p", "--hyperparameter", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--encoding", choices=ENCODINGS, default="json")
    args = parser.parse_args(argv)

    hyperparameters: dict[str, object] = {}
    if args.program:
        hyperparameters["sagemaker_program"] = args.program
    if args.submit_dir:
        hyperparameters["sagemaker_submit_directory"] = args.submit_dir
    if args.mpi:
        hyperparameters.update({"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": args.mpi,
                                "sagemaker_mpi_custom_mpi_options": ""})
    for item in args.hyperparameter:
        key, _, value = item.partition("=")
        hyperparameters[key] = _parse_value(value)
    channels = ("training", "validation") if args.digits or args.photos else ()
    write(args.root, hyperparameters=hyperparameters, channels=channels, encoding=args.encoding)
    if channels:
        from dtc_train import digits, photos  # noqa: PLC0415

        counts = (digits if args.digits else photos).export(os.path.join(args.root, "input", "data"))
        print(f"wrote {args.root}: " + ", ".join(f"{c} {n} images" for c, n in counts.items()))
    else:
        print(f"wrote {args.root}")


if __name__ == "__main__":
    main()
