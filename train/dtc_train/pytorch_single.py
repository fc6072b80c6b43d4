"""Built-in trainer: PyTorch on one process, no data parallelism, input through NVIDIA DALI.

What ``train`` runs for ``builtin:pytorch`` with no distribution (``strategy.SINGLE``): one
process on one device (GPU 0 when one is visible, else the CPU). It trains with the loop and
the step of the data-parallel trainers (``torch_common.train``: checkpoints, resume, stop,
observers, the final metric and digest lines, the saved model) without a collective runtime:
its collectives return their input (``torch_common.Collectives.alone``) and the optimizer is plain
SGD with momentum. Horovod would add nothing to one process but its background thread, which
wakes every millisecond (``HOROVOD_CYCLE_TIME``) and cost one process pinned to one core about
10 % of its training speed (docs/performance.md, A8). Checkpoints are those of the data-parallel
trainers (``checkpoint.pt``): a job resumed under ``mpi`` or ``torch_distributed`` goes on from
them at its own world size, and this one from theirs.

Hyperparameters: ``dtc_train.config`` (backend ``pytorch_single``).
"""

import torch

from . import common, config, contract, dali_data, stop, torch_common


def main(argv: list[str] | None = None) -> int:
    args = config.parse(config.PYTORCH_SINGLE, argv, __doc__.split("\n\n")[0])
    choice = torch_common.model_choice(args)
    stop_request = stop.StopRequest()
    common.configure_logging(0)
    device = torch_common.device_for(args.data_device, 0)
    collectives = torch_common.Collectives.alone()
    setup = torch_common.set_up_rank(args, choice, dali_data.Place(0, 1, 0, 1, contract.current_host()), device,
                                     collectives.allgather_object, "single", ": one process")
    model, data = setup.module, setup.data
    accumulation = torch_common.Accumulation(args.gradient_accumulation_steps)   # gradients add up in .grad
    accumulation.optimizer_steps(data.steps_per_epoch, args.batch_size)   # too few batches: refused here
    optimizer = torch.optim.SGD(model.parameters(), lr=args.learning_rate, momentum=args.momentum)
    precision = torch_common.Precision.build(args.precision, device)
    job = torch_common.TorchRank(args, choice, setup, device, 0, collectives, model, optimizer, "single",
                                 precision=precision, accumulation=accumulation)
    return torch_common.train(job, stop_request, torch_common.restore(job))


if __name__ == "__main__":
    common.leave(main())
