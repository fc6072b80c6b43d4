"""The PyTorch trainers' checkpoint file, ``<checkpoint-dir>/checkpoint.pt``: one typed record
(``Checkpoint``) with a version, written (``write``) and read (``read``) here for every PyTorch
trainer (``torch_common`` builds it and applies it: ``save_checkpoint``, ``restore``).

The file is the record's fields as a ``dict`` saved by ``torch.save`` and loaded with
``weights_only=True`` (tensors, numbers, strings, lists and dicts only). ``version`` is
``VERSION``; a file without one was written before the field existed and has version 1's
layout; a newer version is refused with what to do.
"""

import dataclasses
import os
from dataclasses import dataclass

import torch

from . import common

NAME = "checkpoint.pt"
VERSION = 1
SHARDS_PREFIX = "shards-"


@dataclass(frozen=True)
class Checkpoint:
    """Everything a restart needs to go on as if the job had not stopped.

    Attributes:
        epoch: epochs done.
        step: optimizer steps of the next epoch done.
        steps_per_epoch: optimizer steps per epoch of the job that wrote it.
        rng: rank 0's ``torch`` RNG state (uint8 tensor).
        train_sums: float64 tensor [3] (``loop.SUMS``): the next epoch's training sums so far over
            every rank; ``None`` at an epoch's end.
        data_positions: every rank's DALI pipeline position (``Batches.position``), in rank order.
        data_order: the training order's state (``TorchBackend.data_order``), or ``None``.
        rank_buffers: every rank's floating-point buffers (name -> tensor), or ``None`` where the
            wrapper keeps them equal.
        grad_scaler: fp16's ``GradScaler`` state, or ``None``.
        plateau: the early-stopping state (``plateau.Plateau.state``), or ``None``.
        model, optimizer: the whole model's and optimizer's state dicts; ``None`` when sharded.
        sharded_state: the shard directory under the checkpoint directory (``shards-<ns>``) that
            holds a sharded model's state, or ``None``.
        version: the layout's version (``VERSION``).
    """

    epoch: int
    step: int
    steps_per_epoch: int | None
    rng: torch.Tensor
    train_sums: torch.Tensor | None = None
    data_positions: list | None = None
    data_order: dict | None = None
    rank_buffers: list | None = None
    grad_scaler: dict | None = None
    plateau: dict | None = None
    model: dict | None = None
    optimizer: dict | None = None
    sharded_state: str | None = None
    version: int = VERSION


_FIELDS = {field.name for field in dataclasses.fields(Checkpoint)}
# keys every version-1 file has (the others arrived with later features and may be missing)
_REQUIRED = frozenset({"epoch", "model", "optimizer", "rng"})


def write(checkpoint_dir: str, checkpoint: Checkpoint) -> str:
    """Writes ``checkpoint`` to ``checkpoint_dir``/``NAME`` atomically (``common.atomic_write``).
    Returns the path."""
    path = os.path.join(checkpoint_dir, NAME)
    state = {name: getattr(checkpoint, name) for name in _FIELDS}   # no deep copy of the tensors
    common.atomic_write(path, lambda tmp: torch.save(state, tmp))
    return path


def read(checkpoint_dir: str) -> Checkpoint | None:
    """The checkpoint in ``checkpoint_dir``, or ``None`` when there is none or it cannot be read
    (logged with the reason: a truncated or foreign file starts the job over).

    Raises:
        ValueError: it was written by a newer layout (``version`` > ``VERSION``).
    """
    path = os.path.join(checkpoint_dir, NAME)
    if not os.path.exists(path):
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # a truncated or foreign file: start over rather than fail
        common.log.warning("ignoring checkpoint %s, which cannot be read (%s: %s); training starts at epoch 1",
                           path, type(error).__name__, error)
        return None
    if not isinstance(state, dict) or not _REQUIRED <= set(state) or not isinstance(state["epoch"], int):
        common.log.warning("ignoring checkpoint %s: not one this trainer wrote (keys %s)", path,
                           sorted(state) if isinstance(state, dict) else type(state).__name__)
        return None
    version = state.get("version", 1)
    if version > VERSION:
        raise ValueError(f"checkpoint {path} has version {version}, newer than this image's {VERSION}: resume it "
                         "with the image that wrote it, or give the job an empty checkpoint directory")
    return Checkpoint(**{"step": 0, "steps_per_epoch": None, **{k: v for k, v in state.items() if k in _FIELDS},
                         "version": version})
