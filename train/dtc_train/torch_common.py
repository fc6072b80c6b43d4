"""What the PyTorch trainers share, whatever library averages their gradients: the device,
DALI batches as tensors, the training epoch, exact sharded validation, checkpoints and resuming
from them, and the saved model.

Checkpoints: after every epoch rank 0 writes ``<checkpoint-dir>/checkpoint.pt`` atomically
(``common.atomic_write``: fsync, rename) with the epoch, model and optimizer state and rank 0's
RNG state. At start rank 0 reads it and broadcasts it, so every rank, on every host, resumes
from the same state at the next epoch (a managed-spot restart restores the directory from
``checkpoint_s3_uri``; SageMaker docs, model-checkpoints). Training continues from there, so a
checkpoint is only ever replaced by a later one. An unreadable checkpoint is named in the log and
training starts over.
"""

import os
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

from . import common, dali_data, observe, torch_model

# Sums a float64 tensor over all ranks and returns the result (hvd.allreduce or dist.all_reduce).
AllReduceSum = Callable[[torch.Tensor, str], torch.Tensor]
# Returns rank 0's object on every rank (hvd.broadcast_object or dist.broadcast_object_list).
BroadcastObject = Callable[[object], object]
CHECKPOINT_NAME = "checkpoint.pt"
CHECKPOINT_KEYS = frozenset({"epoch", "model", "optimizer", "rng"})


def read_checkpoint(checkpoint_dir: str) -> dict | None:
    """The checkpoint in ``checkpoint_dir`` as saved by ``fit``, or ``None`` when there is none or
    it cannot be read (logged with the reason)."""
    path = os.path.join(checkpoint_dir, CHECKPOINT_NAME)
    if not os.path.exists(path):
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # a truncated or foreign file: start over rather than fail
        common.log.warning("ignoring checkpoint %s, which cannot be read (%s: %s); training starts at epoch 1",
                           path, type(error).__name__, error)
        return None
    if not isinstance(state, dict) or not CHECKPOINT_KEYS <= set(state) or not isinstance(state["epoch"], int):
        common.log.warning("ignoring checkpoint %s: not one this trainer wrote (keys %s)", path,
                           sorted(state) if isinstance(state, dict) else type(state).__name__)
        return None
    return state


def restore(args, model, optimizer, rank: int, broadcast_object: BroadcastObject) -> int:
    """Loads rank 0's checkpoint (if any) into ``model`` and ``optimizer`` on every rank.
    Returns the epochs it had completed (0 without one)."""
    state = broadcast_object(read_checkpoint(args.checkpoint_dir) if rank == 0 else None)
    if state is None:
        return 0
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if rank == 0:
        torch.set_rng_state(state["rng"])
        common.log.info("resuming from %s: epoch %d of %d done", os.path.join(args.checkpoint_dir, CHECKPOINT_NAME),
                        state["epoch"], args.epochs)
    return state["epoch"]


def device_for(data_device: str, local_rank: int) -> torch.device:
    """``cuda:<local_rank>`` when a GPU is wanted and visible (``--data-device``), else CPU."""
    if data_device == "gpu" or (data_device == "auto" and torch.cuda.is_available()):
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def set_threads_per_rank(local_size: int) -> int:
    """Gives each of the host's ``local_size`` ranks an equal share of the CPUs this process may run
    on (its affinity: a container's cpuset or a pinned rank sees fewer than ``os.cpu_count()``) as
    PyTorch intra-op threads. Returns the thread count."""
    threads = max(1, len(os.sched_getaffinity(0)) // local_size)
    torch.set_num_threads(threads)
    return threads


def batches(pipe, device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless (images float32 [B, 1, 8, 8], labels int64 [B]) batches from a built DALI pipeline."""
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    for batch in DALIGenericIterator([pipe], ["images", "labels"], size=-1, auto_reset=True):
        data = batch[0]
        yield data["images"].to(device), data["labels"].to(device).view(-1).long()


def train_epoch(model, optimizer, train_batches, steps: int, on_step: Callable[[], None] = lambda: None) -> torch.Tensor:
    """``steps`` optimizer steps, calling ``on_step()`` after each; returns this rank's float64
    [loss sum, correct, samples]."""
    sums = torch.zeros(3, dtype=torch.float64)
    for _ in range(steps):
        images, labels = next(train_batches)
        optimizer.zero_grad()
        logits = model(images)
        loss = F.cross_entropy(logits, labels)
        loss.backward()
        optimizer.step()
        sums += torch.tensor([loss.item() * len(labels), (logits.argmax(1) == labels).sum().item(),
                              len(labels)], dtype=torch.float64)
        on_step()
    return sums


def evaluate(model, val_batches, shard: dali_data.Shard, allreduce_sum: AllReduceSum) -> tuple[float, float, int]:
    """Loss and accuracy over the whole validation set: each rank scores its shard (dropping
    the padding of its last batch) and the sums are all-reduced. Returns (loss, accuracy, n)."""
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64)
    with torch.no_grad():
        for index in range(shard.batches):
            images, labels = next(val_batches)
            real = shard.real_samples(index)
            logits = model(images[:real])
            sums += torch.tensor([
                F.cross_entropy(logits, labels[:real], reduction="sum").item(),
                (logits.argmax(1) == labels[:real]).sum().item(), real], dtype=torch.float64)
    loss_sum, correct, count = allreduce_sum(sums, "validation_sums").tolist()
    model.train()
    return loss_sum / count, correct / count, int(count)


def fit(args, model, optimizer, data: dali_data.RankData, train_batches, val_batches, rank: int,
        allreduce_sum: AllReduceSum, observer: observe.Observer, start_epoch: int = 0) -> float:
    """Epochs ``start_epoch + 1`` to ``args.epochs``: train, all-reduce the training sums, validate
    exactly; rank 0 reports the epoch (``observer``: metric line, TensorBoard) and writes the
    checkpoint. Returns the last validation accuracy (measured once when the checkpoint had
    already reached ``args.epochs``)."""
    if start_epoch >= args.epochs:
        if rank == 0:
            common.log.info("the checkpoint has done all %d epochs: nothing left to train", args.epochs)
        return evaluate(model, val_batches, data.val_shard, allreduce_sum)[1]
    val_accuracy = 0.0
    for epoch in range(start_epoch + 1, args.epochs + 1):
        observer.begin_epoch(epoch)
        sums = train_epoch(model, optimizer, train_batches, data.steps_per_epoch, observer.step_done)
        loss_sum, correct, count = allreduce_sum(sums, "train_sums").tolist()
        observer.end_training_steps()
        val_loss, val_accuracy, val_count = evaluate(model, val_batches, data.val_shard, allreduce_sum)
        observer.end_epoch(epoch, train_loss=loss_sum / count, train_accuracy=correct / count, val_loss=val_loss,
                           val_accuracy=val_accuracy, val_samples=val_count)
        if rank == 0:
            checkpoint = {"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                          "rng": torch.get_rng_state()}
            common.atomic_write(os.path.join(args.checkpoint_dir, CHECKPOINT_NAME),
                                lambda tmp: torch.save(checkpoint, tmp))
    return val_accuracy


def finish(args, model: torch.nn.Module, rank: int, size: int, val_accuracy: float) -> None:
    """Every rank prints its weights' digest; rank 0 saves ``model.pth`` (state dict) and
    ``model.json`` to the model directory."""
    digest = common.weights_digest(p.detach().cpu().numpy() for p in model.state_dict().values())
    common.emit(f"rank={rank} world_size={size} final_weights_sha256={digest}")
    if rank != 0:
        return
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    common.atomic_write(os.path.join(args.model_dir, "model.pth"), lambda tmp: torch.save(state, tmp))
    common.write_json(os.path.join(args.model_dir, "model.json"), {
        "framework": "pytorch", "format": "state_dict", "class": "dtc_train.torch_model.DigitsNet",
        "input_shape": list(torch_model.INPUT_SHAPE), "input_scale": "pixel / 255",
        "classes": [str(c) for c in range(torch_model.NUM_CLASSES)],
        "val_accuracy": val_accuracy, "epochs": args.epochs, "world_size": size})
    common.log.info("saved %s", os.path.join(args.model_dir, "model.pth"))
