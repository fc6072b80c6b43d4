"""Built-in trainer: PyTorch data-parallel training with Horovod, input through NVIDIA DALI.

Run under any launcher that starts Horovod ranks (``mpirun``; ``train`` with
``sagemaker_mpi_enabled``), or alone as one rank. Each rank reads its shard of the training
channel, the initial weights and optimizer state are broadcast from rank 0, gradients are
averaged by ``hvd.DistributedOptimizer``, and validation accuracy is summed exactly over the
validation shards (batch normalization's running statistics, which Horovod leaves per rank, are
averaged over the ranks at the end of each epoch). Rank 0 logs one metric line per epoch, writes
atomic checkpoints on the
``checkpoint-every`` schedule and when the job is stopped (a restarted job resumes from the step
it had reached: ``torch_common``), and saves ``model.pth`` (the state dict) with ``model.json``
to the model directory. Stopped (SIGTERM), every rank exits 143 after the checkpoint.

Hyperparameters: ``dtc_train.config`` (backend ``pytorch_horovod``), ``allreduce-compression``
among them.
"""

import horovod
import horovod.torch as hvd
import torch

from . import common, config, contract, dali_data, stop, torch_common


def _collectives() -> torch_common.Collectives:
    # Horovod names broadcast objects after their type by default, which differs between rank 0
    # (a dict) and the others (None): the ranks would wait for each other forever; one name each
    return torch_common.Collectives(
        allreduce_sum=lambda tensor, name: hvd.allreduce(tensor, op=hvd.Sum, name=name),
        broadcast_object=lambda obj: hvd.broadcast_object(obj, root_rank=0, name="checkpoint"),
        allgather_object=lambda obj: hvd.allgather_object(obj, name="data_positions"), world_size=hvd.size())


# allreduce-compression (dtc_train.config.COMPRESSIONS): how gradients travel in the allreduce
# (Horovod's Compression); fp16: cast to float16 for the allreduce and back
COMPRESSIONS = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}


def distributed_optimizer(model: torch.nn.Module, learning_rate: float, momentum: float,
                          compression: str = "none", micro_batches: int = 1) -> "hvd.DistributedOptimizer":
    """SGD with momentum over ``model``'s parameters, wrapped by Horovod's ``DistributedOptimizer``:
    the gradients averaged over the ranks once every ``micro_batches`` backward passes
    (``backward_passes_per_step``: the passes before add up locally), in ``compression``
    (``COMPRESSIONS``)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate, momentum=momentum)
    return hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                    compression=COMPRESSIONS[compression], backward_passes_per_step=micro_batches)


def main(argv: list[str] | None = None) -> int:
    args = config.parse(config.PYTORCH_HOROVOD, argv, __doc__.split("\n\n")[0])
    choice = torch_common.model_choice(args)
    stop_request = stop.StopRequest()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    common.configure_logging(rank)
    device = torch_common.device_for(args.data_device, hvd.local_rank())
    collectives = _collectives()
    place = dali_data.Place(rank, size, hvd.local_rank(), hvd.local_size(), contract.current_host())
    setup = torch_common.set_up_rank(args, choice, place, device,
                                     lambda obj: hvd.allgather_object(obj, name="channel_shards"), "horovod",
                                     f", Horovod {horovod.__version__}: rank {rank}/{size}")
    model, data = setup.module, setup.data
    # wrapped before the checkpoint is loaded: the wrapper is a new optimizer object whose state
    # starts empty, so state loaded into the plain one (momentum buffers) would be dropped
    # Horovod counts the backward passes of an accumulated step itself: no context needed
    accumulation = torch_common.Accumulation(args.gradient_accumulation_steps)
    accumulation.optimizer_steps(data.steps_per_epoch, args.batch_size)   # too few batches: refused here
    optimizer = distributed_optimizer(model, args.learning_rate * size, args.momentum, args.allreduce_compression,
                                      accumulation.micro_batches)
    precision = torch_common.Precision.build(args.precision, device, horovod=True)
    job = torch_common.TorchRank(args, choice, setup, device, rank, collectives, model, optimizer, "horovod",
                                 precision=precision, accumulation=accumulation, buffers_synced=False)
    resume = torch_common.restore(job)
    # parameters only: the buffers (batch normalization's statistics) are each rank's own, restored
    # from the checkpoint; a new job's are equal on every rank (same seed)
    hvd.broadcast_parameters(list(model.named_parameters()), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    code = torch_common.train(job, stop_request, resume)
    if code == 0:
        hvd.join()   # every rank leaves after rank 0 has saved
    return code


if __name__ == "__main__":
    exit_code = main()
    hvd.shutdown()   # what its exit handler would do; MPI is finalized
    common.leave(exit_code)
