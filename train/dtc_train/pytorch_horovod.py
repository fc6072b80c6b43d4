"""Built-in trainer: PyTorch data-parallel training with Horovod, input through NVIDIA DALI.

Run under any launcher that starts Horovod ranks (``mpirun``; ``train`` with
``sagemaker_mpi_enabled``), or alone as one rank. Each rank reads its shard of the training
channel, the initial weights and optimizer state are broadcast from rank 0, gradients are
averaged by ``hvd.DistributedOptimizer``, and validation accuracy is summed exactly over the
validation shards. Rank 0 logs one metric line per epoch, writes an atomic checkpoint each
epoch (a restarted job resumes from it: ``torch_common.restore``), and saves ``model.pth`` (the state dict) with ``model.json`` to the model directory.

Hyperparameters: see ``dtc_train.common.parse_args``.
"""

import sys

import horovod
import horovod.torch as hvd
import torch

from . import common, contract, dali_data, observe, torch_common, torch_model


def _allreduce_sum(tensor: torch.Tensor, name: str) -> torch.Tensor:
    return hvd.allreduce(tensor, op=hvd.Sum, name=name)


def _broadcast_checkpoint(state):
    # one name on every rank: by default Horovod names it after the object's type, which differs
    # between rank 0 (a dict) and the others (None), and the ranks would wait for each other forever
    return hvd.broadcast_object(state, root_rank=0, name="checkpoint")


def main(argv: list[str] | None = None) -> int:
    args = common.parse_args(__doc__.split("\n\n")[0], argv)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    common.configure_logging(rank)
    torch.manual_seed(args.seed)
    device = torch_common.device_for(args.data_device, hvd.local_rank())
    dali_device_id = hvd.local_rank() if device.type == "cuda" else None
    torch_common.set_threads_per_rank(hvd.local_size())

    data = dali_data.rank_data(contract.channel_dir(args.train_channel), contract.channel_dir(args.validation_channel),
                               args.batch_size, rank, size, args.corrupt_images)
    common.log.info("PyTorch %s, Horovod %s: rank %d/%d on %s (host %s); %s; DALI decodes on %s", torch.__version__,
                    horovod.__version__, rank, size, device, contract.current_host(), data.describe(),
                    "gpu" if dali_device_id is not None else "cpu")
    train_pipe, val_pipe = data.pipelines(args.batch_size, rank, size, device_id=dali_device_id, layout="CHW",
                                          seed=args.seed, num_threads=args.dali_threads)

    model = torch_model.DigitsNet().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.learning_rate * size, momentum=args.momentum)
    start_epoch = torch_common.restore(args, model, optimizer, rank, _broadcast_checkpoint)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    observer = observe.Observer(args, rank, size, data.steps_per_epoch, args.batch_size * size, "horovod")
    val_accuracy = torch_common.fit(args, model, optimizer, data, torch_common.batches(train_pipe, device),
                                    torch_common.batches(val_pipe, device), rank, _allreduce_sum, observer,
                                    start_epoch)
    torch_common.finish(args, model, rank, size, val_accuracy)
    observer.close()
    hvd.join()   # every rank leaves after rank 0 has saved
    return 0


if __name__ == "__main__":
    sys.exit(main())
