"""Built-in trainer: PyTorch data-parallel training with Horovod, input through NVIDIA DALI.

Run under any launcher that starts Horovod ranks (``mpirun``; ``train`` with
``sagemaker_mpi_enabled``), or alone as one rank. Each rank reads its shard of the training
channel, the initial weights and optimizer state are broadcast from rank 0, gradients are
averaged by ``hvd.DistributedOptimizer``, and validation accuracy is summed exactly over the
validation shards. Rank 0 logs one metric line per epoch, writes an atomic checkpoint each
epoch, and saves ``model.pth`` (the state dict) with ``model.json`` to the model directory.

Hyperparameters: see ``dtc_train.common.parse_args``.
"""

import os
import sys
import time

import horovod
import horovod.torch as hvd
import torch
import torch.nn.functional as F

from . import common, contract, dali_data, torch_model


def _device(args, local_rank: int) -> torch.device:
    if args.data_device == "gpu" or (args.data_device == "auto" and torch.cuda.is_available()):
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _batches(pipe, device):
    """Endless (images, labels) batches from a built DALI pipeline, as torch tensors on ``device``."""
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    for batch in DALIGenericIterator([pipe], ["images", "labels"], size=-1, auto_reset=True):
        data = batch[0]
        yield data["images"].to(device), data["labels"].to(device).view(-1).long()


def evaluate(model, batches, shard: dali_data.Shard) -> tuple[float, float, int]:
    """Loss and accuracy over the whole validation set: each rank scores its shard (dropping
    the padding of its last batch) and the sums are all-reduced. Returns (loss, accuracy, n)."""
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64)
    with torch.no_grad():
        for index in range(shard.batches):
            images, labels = next(batches)
            real = shard.real_samples(index)
            logits = model(images[:real])
            sums += torch.tensor([
                F.cross_entropy(logits, labels[:real], reduction="sum").item(),
                (logits.argmax(1) == labels[:real]).sum().item(), real], dtype=torch.float64)
    loss_sum, correct, count = hvd.allreduce(sums, op=hvd.Sum, name="validation_sums").tolist()
    model.train()
    return loss_sum / count, correct / count, int(count)


def main(argv: list[str] | None = None) -> int:
    args = common.parse_args(__doc__.split("\n\n")[0], argv)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    common.configure_logging(rank)
    torch.manual_seed(args.seed)
    device = _device(args, hvd.local_rank())
    dali_device_id = hvd.local_rank() if device.type == "cuda" else None
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))

    data = dali_data.rank_data(contract.channel_dir(args.train_channel), contract.channel_dir(args.validation_channel),
                               args.batch_size, rank, size)
    common.log.info("PyTorch %s, Horovod %s: rank %d/%d on %s; %s; DALI decodes on %s", torch.__version__,
                    horovod.__version__, rank, size, device, data.describe(), "gpu" if dali_device_id is not None else "cpu")
    train_pipe, val_pipe = data.pipelines(args.batch_size, rank, size, device_id=dali_device_id, layout="CHW",
                                          seed=args.seed, num_threads=args.dali_threads)
    train_batches, val_batches = _batches(train_pipe, device), _batches(val_pipe, device)

    model = torch_model.DigitsNet().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.learning_rate * size, momentum=args.momentum)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    for epoch in range(1, args.epochs + 1):
        started = time.perf_counter()
        sums = torch.zeros(3, dtype=torch.float64)
        for _ in range(data.steps_per_epoch):
            images, labels = next(train_batches)
            optimizer.zero_grad()
            logits = model(images)
            loss = F.cross_entropy(logits, labels)
            loss.backward()
            optimizer.step()
            sums += torch.tensor([loss.item() * len(labels), (logits.argmax(1) == labels).sum().item(),
                                  len(labels)], dtype=torch.float64)
        loss_sum, correct, count = hvd.allreduce(sums, op=hvd.Sum, name="train_sums").tolist()
        val_loss, val_accuracy, val_count = evaluate(model, val_batches, data.val_shard)
        if rank == 0:
            common.emit(common.METRIC_LINE.format(
                epoch=epoch, epochs=args.epochs, train_loss=loss_sum / count, train_accuracy=correct / count,
                val_loss=val_loss, val_accuracy=val_accuracy, val_samples=val_count,
                epoch_seconds=time.perf_counter() - started))
            checkpoint = {"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
            common.atomic_write(os.path.join(args.checkpoint_dir, "checkpoint.pt"),
                                lambda tmp: torch.save(checkpoint, tmp))

    digest = common.weights_digest(p.detach().cpu().numpy() for p in model.state_dict().values())
    common.emit(f"rank={rank} world_size={size} final_weights_sha256={digest}")
    if rank == 0:
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        common.atomic_write(os.path.join(args.model_dir, "model.pth"), lambda tmp: torch.save(state, tmp))
        common.write_json(os.path.join(args.model_dir, "model.json"), {
            "framework": "pytorch", "format": "state_dict", "class": "dtc_train.torch_model.DigitsNet",
            "input_shape": list(torch_model.INPUT_SHAPE), "input_scale": "pixel / 255",
            "classes": [str(c) for c in range(torch_model.NUM_CLASSES)],
            "val_accuracy": val_accuracy, "epochs": args.epochs, "world_size": size})
        common.log.info("saved %s", os.path.join(args.model_dir, "model.pth"))
    hvd.join()   # every rank leaves after rank 0 has saved
    return 0


if __name__ == "__main__":
    sys.exit(main())
