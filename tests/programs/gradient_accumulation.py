"""Run on 2 ranks (``ddp`` and ``fsdp``: torchrun, Gloo; ``horovod``: mpirun): the built-in
trainer's optimizer step (``dtc_train.torch_common.train_step``) with gradient accumulation, k
micro-batches of B per step, against the same step without it on batches of k x B holding the
same samples, from the same weights, each rank on its own data. Rank 0 prints one JSON line:

- ``max_weight_difference``: between the two after ``STEPS`` SGD steps with momentum
  (the DigitsNet has no batch normalization, so the math says they are equal up to rounding);
- ``max_weight_change``: how far the weights moved (so a difference of 0 means something);
- ``reductions_per_step``: gradient reductions over the ranks per optimizer step, with
  accumulation and without (DDP: calls of its communication hook; Horovod: allreduce requests
  of the model's weights; FSDP2: ``null``, its reduce-scatters are not counted);
- ``local_until_last``: on every micro-batch but the last of a step, no gradient had been
  reduced over the ranks (DDP: no hook call; Horovod: no allreduce; FSDP2: no sharded gradient).

Usage: gradient_accumulation.py {ddp|fsdp|horovod}
"""

import json
import os
import sys

import torch

from dtc_train import torch_common
from dtc_train.torch_model import DigitsNet

BACKEND = sys.argv[1]
K, B, STEPS = 4, 8, 3

if BACKEND == "horovod":
    import horovod.torch as hvd
    import horovod.torch.optimizer as hvd_optimizer

    from dtc_train import pytorch_horovod

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
else:
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    from dtc_train.pytorch_ddp import fully_shard_model

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()

generator = torch.Generator().manual_seed(1000 + rank)   # each rank its own samples
batches = [(torch.rand(K * B, 1, 8, 8, generator=generator), torch.randint(0, 10, (K * B,), generator=generator))
           for _ in range(STEPS)]
reductions = [0]


class Probe:
    """The (images, labels) of ``batches`` cut into ``micro_batches`` parts; before handing out a
    part other than a step's first, notes whether a reduction had happened since the step began."""

    def __init__(self, micro_batches: int, reduced):
        self.parts = [(images[i::micro_batches], labels[i::micro_batches])
                      for images, labels in batches for i in range(micro_batches)]
        self.micro_batches, self.reduced, self.handed, self.local = micro_batches, reduced, 0, True
        self.step_start = 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.handed % self.micro_batches == 0:
            self.step_start = reductions[0]
        elif self.reduced(self.step_start):
            self.local = False
        self.handed += 1
        return self.parts[self.handed - 1]


def build(micro_batches: int):
    """(model, optimizer, accumulation, probe of a reduction since a count, weights getter)."""
    torch.manual_seed(0)
    module = DigitsNet()
    if BACKEND == "horovod":
        optimizer = pytorch_horovod.distributed_optimizer(module, 0.05, 0.9, "none", micro_batches)
        return (module, optimizer, torch_common.Accumulation(micro_batches),
                lambda since: reductions[0] > since, lambda: module.state_dict())
    if BACKEND == "ddp":
        model = DistributedDataParallel(module)

        def counting_hook(state, bucket):
            reductions[0] += 1
            return allreduce_hook(state, bucket)

        model.register_comm_hook(None, counting_hook)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        return (model, optimizer, torch_common.Accumulation(micro_batches, model.no_sync),
                lambda since: reductions[0] > since, lambda: module.state_dict())
    model = fully_shard_model(module, torch.device("cpu"), size)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    # a sharded gradient exists once a reduce-scatter has run (zero_grad sets them to None)
    accumulation = torch_common.Accumulation(micro_batches, lambda: torch_common.fsdp_local_gradients(model))
    return (model, optimizer, accumulation, lambda since: any(p.grad is not None for p in model.parameters()),
            lambda: {n: p.full_tensor() for n, p in model.named_parameters()})


def run(micro_batches: int) -> tuple[dict, int, bool]:
    model, optimizer, accumulation, reduced, weights = build(micro_batches)
    probe = Probe(micro_batches, reduced)
    reductions[0] = 0
    for _ in range(STEPS):
        torch_common.train_step(model, optimizer, probe, accumulation=accumulation)
    return {n: t.detach().clone() for n, t in weights().items()}, reductions[0], probe.local


if BACKEND == "horovod":   # count the allreduce requests the optimizer makes (its module imported the function)
    original = hvd_optimizer.allreduce_async_

    def counting_allreduce(*args, **kwargs):
        if (kwargs.get("name") or "").endswith("classifier.3.weight"):
            reductions[0] += 1
        return original(*args, **kwargs)

    hvd_optimizer.allreduce_async_ = counting_allreduce

torch.manual_seed(0)
initial = DigitsNet().state_dict()
plain, plain_reductions, _ = run(1)
accumulated, accumulated_reductions, local_until_last = run(K)
if rank == 0:
    print(json.dumps({
        "world_size": size,
        "max_weight_difference": max((accumulated[n] - plain[n]).abs().max().item() for n in plain),
        "max_weight_change": max((plain[n] - initial[n]).abs().max().item() for n in plain),
        "reductions_per_step": None if BACKEND == "fsdp" else {"1": plain_reductions / STEPS,
                                                              str(K): accumulated_reductions / STEPS},
        "local_until_last": local_until_last,
    }), flush=True)
if BACKEND == "horovod":
    hvd.shutdown()   # MPI finalized: mpirun counts an exit without it as a failure
else:
    dist.barrier()
    dist.destroy_process_group()
    # Skips the interpreter's teardown, where PyTorch 2.13's Gloo worker threads sometimes abort
    # (pytorch/pytorch#179291; see fsdp_parity.py): this program's result is printed above.
    sys.stdout.flush()
    os._exit(0)
