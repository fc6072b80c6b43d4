"""Built-in trainer: PyTorch DistributedDataParallel, input through NVIDIA DALI.

Run by torchrun (``train`` with ``sagemaker_torch_distributed_enabled``), which sets ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK`` and the store address (``MASTER_ADDR``/``MASTER_PORT``); alone it
runs as one rank. The process group uses NCCL on GPUs and Gloo on CPUs. Each rank reads its
shard of the training channel; DDP broadcasts rank 0's initial weights and averages gradients
in its backward hooks; validation accuracy is summed exactly over the validation shards. Rank 0
logs one metric line per epoch, writes atomic checkpoints on the ``checkpoint-every`` schedule
and when the job is stopped (a restart resumes at that step: ``torch_common``), and saves
``model.pth`` (the state dict of the wrapped module) with ``model.json``. Stopped (SIGTERM),
every rank exits 143 after the checkpoint.

``data-parallel=fsdp`` shards the model instead (PyTorch's FSDP2, ``fully_shard``: ZeRO stage 3,
each rank holding ``1/world size`` of the parameters, gradients and optimizer state, the layers
gathered for their forward and backward and the gradients reduce-scattered). On Gloo the
gradients are reduced as a sum then divided (``set_force_sum_reduction_for_comms``), the
workaround for PyTorch #162338 (Gloo's AVG reduce-scatter summed without dividing);
tests/integration/test_fsdp.py proves the gradients equal DDP's on the same batches.
Checkpoints are sharded: each rank writes its own part with ``torch.distributed.checkpoint``
(``torch_common``: a new directory per checkpoint, named by ``checkpoint.pt``), and a job with
another world size resumes from them resharded. The saved model holds the whole state (gathered
on every rank), so ``model.pth`` loads into the plain model (``torch_model.load``). Batch
normalization's running statistics, which FSDP2 leaves per rank, are averaged over the ranks at
the end of each epoch; DDP broadcasts rank 0's at every forward.

Hyperparameters: ``dtc_train.config`` (backend ``pytorch_ddp``), ``data-parallel`` among them.
"""

import datetime
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from . import common, config, contract, dali_data, stop, torch_common


def _collectives(device: torch.device) -> torch_common.Collectives:
    """``torch.distributed``'s collectives; sums run on the process group's device (NCCL needs
    CUDA tensors)."""

    def allreduce_sum(tensor: torch.Tensor, _name: str) -> torch.Tensor:
        work = tensor.to(device)
        dist.all_reduce(work, op=dist.ReduceOp.SUM)
        return work.cpu()

    def broadcast_object(obj):
        holder = [obj]
        dist.broadcast_object_list(holder, src=0)
        return holder[0]

    def allgather_object(obj) -> list:
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, obj)
        return gathered

    return torch_common.Collectives(allreduce_sum, broadcast_object, allgather_object, dist.get_world_size())


def fully_shard_model(module: torch.nn.Module, device: torch.device, size: int) -> torch.nn.Module:
    """Shards ``module`` in place with FSDP2 over all ``size`` ranks: each child of the top
    module that holds parameters (``DigitsNet``: ``features``, ``classifier``; a ResNet: ``conv1``,
    ``bn1``, ``layer1`` to ``layer4``, ``fc``) is one unit, gathered for its own forward and
    backward, then the root. Call before the optimizer is built (its parameters become DTensor
    shards). Returns ``module``."""
    from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415  (FSDP2 only when chosen)
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415

    mesh = init_device_mesh(device.type, (size,))
    for child in module.children():
        if any(True for _ in child.parameters()):
            fully_shard(child, mesh=mesh)
    fully_shard(module, mesh=mesh)
    if device.type == "cpu":   # Gloo: SUM then divide (PyTorch #162338: AVG summed without dividing)
        module.set_force_sum_reduction_for_comms(True)
    return module


def sharded_state_dicts(local_rank: int) -> torch_common.StateDicts:
    """A sharded model's state (``torch.distributed.checkpoint``, PyTorch's DCP). Checkpoints:
    each rank saves its own shards of the model and optimizer with ``dcp.save`` and loads with
    ``dcp.load``, which reshards a state saved at another world size into this job's shards
    (DCP's load-time resharding; ``get_state_dict``/``set_state_dict`` give the DTensor state and
    create the optimizer's state before its first step). ``get`` (``model.pth``, the final digest)
    gathers the whole state on every rank (``full_state_dict=True``): the plain module's keys, at
    any world size. Local rank 0 prunes the host's older shard directories."""
    import torch.distributed.checkpoint as dcp  # noqa: PLC0415  (FSDP2 only when chosen)
    from torch.distributed.checkpoint.state_dict import (  # noqa: PLC0415
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        get_state_dict,
        set_state_dict,
    )

    full = StateDictOptions(full_state_dict=True)

    def get(model, optimizer):
        return (get_model_state_dict(model, options=full),
                get_optimizer_state_dict(model, optimizer, options=full) if optimizer is not None else None)

    def save(model, optimizer, directory: str) -> None:
        model_state, optimizer_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=directory)

    def load(model, optimizer, directory: str) -> None:
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state}
        dcp.load(state, checkpoint_id=directory)   # in place, into this rank's shards
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])

    return torch_common.StateDicts(get, None, torch_common.ShardedCheckpoints(save, load, prunes=local_rank == 0))


def _init_process_group(device: torch.device) -> None:
    """Joins torchrun's group (env:// rendezvous), or makes a one-rank group when run alone."""
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=os.environ.get("MASTER_PORT", "29500"))
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(minutes=10),
                            device_id=device if device.type == "cuda" else None)


def main(argv: list[str] | None = None) -> int:
    args = config.parse(config.PYTORCH_DDP, argv, __doc__.split("\n\n")[0])
    choice = torch_common.model_choice(args)
    stop_request = stop.StopRequest()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch_common.device_for(args.data_device, local_rank)
    _init_process_group(device)
    rank, size = dist.get_rank(), dist.get_world_size()
    common.configure_logging(rank)
    collectives = _collectives(device)
    place = dali_data.Place(rank, size, local_rank, int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
                            contract.current_host())
    setup = torch_common.set_up_rank(args, choice, place, device, collectives.allgather_object, args.data_parallel,
                                     f" {'FSDP2' if args.data_parallel == 'fsdp' else 'DDP'} ({dist.get_backend()}): "
                                     f"rank {rank}/{size}")
    module, data = setup.module, setup.data
    micro_batches = args.gradient_accumulation_steps
    if args.data_parallel == "fsdp":
        model = fully_shard_model(module, device, size)
        states = sharded_state_dicts(local_rank)
        accumulation = torch_common.Accumulation(micro_batches, lambda: torch_common.fsdp_local_gradients(model))
    else:
        model = DistributedDataParallel(module, device_ids=[local_rank] if device.type == "cuda" else None)
        states = torch_common.PLAIN_STATE
        accumulation = torch_common.Accumulation(micro_batches, model.no_sync)
    accumulation.optimizer_steps(data.steps_per_epoch, args.batch_size)   # too few batches: refused here
    # gradients are averaged over the ranks; the linear scaling rule multiplies the rate by the world size.
    optimizer = torch.optim.SGD(model.parameters(), lr=args.learning_rate * size, momentum=args.momentum)
    precision = torch_common.Precision.build(args.precision, device)
    job = torch_common.TorchRank(args, choice, setup, device, rank, collectives, model, optimizer, args.data_parallel,
                                 states, precision, accumulation, buffers_synced=args.data_parallel == "ddp")
    code = torch_common.train(job, stop_request, torch_common.restore(job))
    if code == 0:
        dist.barrier()   # every rank leaves after rank 0 has saved
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    common.leave(main())
