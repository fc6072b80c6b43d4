"""Where a trainer finds its inputs and puts its outputs, per the SageMaker contract.

Trainers read only the contract (``SM_*`` variables, ``/opt/ml`` paths), never launcher
details, so they run the same under mpirun, torchrun or as a plain process.
"""

import json
import os
import socket

DEFAULT_BASE_DIR = "/opt/ml"


def base_dir() -> str:
    """``$SAGEMAKER_BASE_DIR`` or ``/opt/ml``."""
    return os.environ.get("SAGEMAKER_BASE_DIR") or DEFAULT_BASE_DIR


def model_dir() -> str:
    """``$SM_MODEL_DIR``: uploaded to S3 as model.tar.gz when the job ends."""
    return os.environ.get("SM_MODEL_DIR") or os.path.join(base_dir(), "model")


def output_dir() -> str:
    """``$SM_OUTPUT_DIR`` (``<base>/output``): its ``tensorboard/`` is what SageMaker's
    TensorBoardOutputConfig syncs to S3 by default."""
    return os.environ.get("SM_OUTPUT_DIR") or os.path.join(base_dir(), "output")


def output_data_dir() -> str:
    """``$SM_OUTPUT_DATA_DIR`` (``<base>/output/data``): uploaded as output.tar.gz."""
    return os.environ.get("SM_OUTPUT_DATA_DIR") or os.path.join(output_dir(), "data")


def channel_dir(name: str) -> str:
    """``$SM_CHANNEL_<NAME>``, else ``<base>/input/data/<name>``: the directory of files the
    built-in trainers read, in ``File`` or ``FastFile`` mode alike (FastFile presents the S3
    objects as files, fetched as they are read). On a ``ShardedByS3Key`` channel of several hosts
    it holds this host's part (``host_sharded``).

    Raises:
        ValueError: the channel is in Pipe mode (``refuse_pipe_channel``).
    """
    refuse_pipe_channel(name)
    return os.environ.get(f"SM_CHANNEL_{name.upper()}") or os.path.join(base_dir(), "input", "data", name)


def _read_config(name: str) -> dict:
    """``<base>/input/config/<name>`` as JSON, or ``{}`` when the file is absent."""
    path = os.path.join(base_dir(), "input", "config", name)
    if not os.path.isfile(path):
        return {}
    with open(path) as handle:
        return json.load(handle)


def channel_input_mode(name: str) -> str:
    """The channel's ``TrainingInputMode`` in ``input/config/inputdataconfig.json``: ``File``,
    ``FastFile`` or ``Pipe`` (``File`` when the file or the key is absent, as in SageMaker's
    CreateTrainingJob, where ``InputMode`` defaults to the job's ``TrainingInputMode``)."""
    return _read_config("inputdataconfig.json").get(name, {}).get("TrainingInputMode") or "File"


def instance_count() -> int:
    """The job's hosts in ``input/config/resourceconfig.json`` (1 when it is absent)."""
    return len(_read_config("resourceconfig.json").get("hosts", [])) or 1


def host_sharded(name: str) -> bool:
    """Whether each host holds a different part of the channel: ``S3DistributionType``
    ``ShardedByS3Key`` in ``input/config/inputdataconfig.json`` on a job of several hosts
    (SageMaker's S3DataSource: each instance receives about 1/N of the S3 objects; one host
    holds them all)."""
    setting = _read_config("inputdataconfig.json").get(name, {}).get("S3DistributionType")
    return setting == "ShardedByS3Key" and instance_count() > 1


def refuse_pipe_channel(name: str) -> None:
    """Refuses, before any data is read, a channel in ``TrainingInputMode: Pipe``: SageMaker
    streams it through FIFOs ``<channel>_<epoch>`` (one pass each) instead of a directory of
    files, and the built-in trainers shuffle and re-read an image folder.

    Raises:
        ValueError: naming the channel, the file and what to set instead.
    """
    if channel_input_mode(name) == "Pipe":
        raise ValueError(
            f"channel {name!r} is in Pipe mode (TrainingInputMode in input/config/inputdataconfig.json), but the "
            "built-in trainers read a directory of image files: start the job with the channel in File or FastFile "
            "mode (SDK v2: the estimator's input_mode='FastFile', or TrainingInput(..., input_mode='FastFile'))")


def checkpoint_dir() -> str:
    """``LocalPath`` of ``input/config/checkpointconfig.json`` when the job set CheckpointConfig,
    else ``<base>/checkpoints`` (SageMaker's default LocalPath; docs: model-checkpoints)."""
    return _read_config("checkpointconfig.json").get("LocalPath") or os.path.join(base_dir(), "checkpoints")


def current_host() -> str:
    """``$SM_CURRENT_HOST`` (the host this process runs on, ``algo-N``), else the hostname."""
    return os.environ.get("SM_CURRENT_HOST") or socket.gethostname()


def pretrained_weights_file(spec: str, suffixes: tuple[str, ...]) -> str:
    """The file that the trainers' ``pretrained-weights=CHANNEL[/PATH]`` names: ``PATH`` inside
    the channel's directory (``channel_dir``), or the channel's one weights file (a name ending in
    one of ``suffixes``: the framework's, ``torch_model.WEIGHT_SUFFIXES`` or
    ``tf_model.WEIGHT_SUFFIXES``) when no path is given.

    Raises:
        FileNotFoundError: the channel or the file is missing, or the channel holds no weights
            file or more than one and no path chose.
    """
    channel, _, relative = spec.partition("/")
    root = channel_dir(channel)
    if not os.path.isdir(root):
        raise FileNotFoundError(f"pretrained-weights={spec}: channel {channel!r} was not given to the job ({root} does "
                                "not exist): add the channel that holds the weights file, or drop pretrained-weights")
    if relative:
        path = os.path.join(root, relative)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"pretrained-weights={spec}: {path} does not exist")
        return path
    found = sorted(os.path.join(folder, name) for folder, _, names in os.walk(root) for name in names
                   if name.endswith(suffixes))
    if len(found) != 1:
        raise FileNotFoundError(
            f"pretrained-weights={spec}: channel {channel!r} holds {len(found)} weights files "
            f"({', '.join(suffixes)})"
            f"{': ' + ', '.join(os.path.relpath(p, root) for p in found[:5]) if found else ''}; name one as "
            f"pretrained-weights={channel}/<path>")
    return found[0]
