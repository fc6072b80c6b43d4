"""A8's baseline: the plainest PyTorch training loop on the built-in trainer's model and data.

The same model (``dtc_train.torch_model.ModelChoice``: the digits CNN or a torchvision
architecture, built untrained), the same DALI pipelines (``dtc_train.dali_data``: the job's
channels, decoded, augmented and normalized as the trainer's), the same batch size and optimizer
(SGD with momentum), one process. Each step is ``zero_grad``, forward, cross-entropy, ``backward``,
``step`` and nothing else: no Horovod, no stop agreement, no loss read back, no progress lines,
metrics or checkpoints. Each epoch ends with a forward pass over the validation channel, as the
trainer's do: DALI's training pipeline fills its prefetch queue meanwhile, in both. Prints one
JSON line per epoch: ``{"epoch": N, "images_per_s": float}`` (training images over the wall-clock
time of the epoch's training steps, validation excluded, as the trainer's samples_per_second).

On a GPU (``--device cuda``: the GPU suite's B5) the model, the step and DALI's decoding run on
GPU 0, the step under ``torch.autocast`` in ``--precision`` and the model and images in the
memory format of the trainer compared with (``--data-parallel``; ``torch_common.memory_format``:
channels-last for DDP and for one process alone, ``single``), as that trainer's with
``data-device=gpu`` and ``precision``.

``--wrap ddp`` puts the model in ``DistributedDataParallel`` on a process group of one (Gloo on a
CPU, NCCL on a GPU; an in-process ``HashStore``, no launcher): what DDP's reducer (its gradient
buckets and their allreduce) costs the same loop, apart from the DDP trainer's own costs.

Run in a SageMaker job tree (``SAGEMAKER_BASE_DIR``), as ``train`` would run the trainer:
``python bare_loop.py --model shufflenet_v2_x0_5 --image-size 64 --epochs 4``.
"""

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F
from nvidia.dali.plugin.pytorch import DALIGenericIterator

from dtc_train import contract, dali_data, torch_common, torch_model


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=torch_model.DIGITS)
    parser.add_argument("--image-size", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)       # the trainer's defaults (dtc_train.common)
    parser.add_argument("--learning-rate", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--dali-threads", type=int, default=1)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--data-parallel", choices=("horovod", "ddp", "single"), default="horovod",
                        help="the trainer compared with: its memory format (torch_common.memory_format)")
    parser.add_argument("--wrap", choices=("none", "ddp"), default="none",
                        help="ddp: the model in DistributedDataParallel on a process group of one")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    torch.set_num_threads(len(os.sched_getaffinity(0)))           # as the trainer's set_threads_per_rank
    choice = torch_model.ModelChoice.from_args(args.model, args.image_size, "auto", None)
    place = dali_data.Place(0, 1, 0, 1, contract.current_host())
    data = dali_data.rank_data("training", "validation", args.batch_size, place, lambda obj: [obj])
    gpu = args.device == "cuda"
    decoding = dali_data.Decoding(0 if gpu else None, "CHW", choice.images, args.dali_threads)
    pipes = data.pipelines(args.batch_size, decoding, order=data.read_order(args.batch_size, args.seed),
                           seed=args.seed)
    batches, val_batches = (DALIGenericIterator([pipe], ["images", "labels"], size=-1, auto_reset=True)
                            for pipe in pipes)
    layout = torch_common.memory_format(torch.device(args.device), args.data_parallel)   # as that trainer's
    model = choice.build(len(data.classes)).to(args.device, memory_format=layout)
    if args.wrap == "ddp":   # as the DDP trainer wraps it (dtc_train.pytorch_ddp), on a group of one
        torch.distributed.init_process_group("nccl" if gpu else "gloo", store=torch.distributed.HashStore(),
                                             rank=0, world_size=1)
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0] if gpu else None)
    dtype = torch_common.PRECISIONS[args.precision]
    optimizer = torch.optim.SGD(model.parameters(), lr=args.learning_rate, momentum=args.momentum)
    model.train()
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        for _ in range(data.steps_per_epoch):
            batch = next(batches)[0]
            images, labels = batch["images"].contiguous(memory_format=layout), batch["labels"].view(-1).long()
            optimizer.zero_grad()
            with torch.autocast(args.device, dtype=dtype, enabled=dtype is not None):
                loss = F.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
        if gpu:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        print(json.dumps({"epoch": epoch, "images_per_s": data.steps_per_epoch * args.batch_size / seconds}),
              flush=True)
        model.eval()
        with torch.no_grad(), torch.autocast(args.device, dtype=dtype, enabled=dtype is not None):
            for _ in range(data.val_shard.batches):
                model(next(val_batches)[0]["images"])
        model.train()
    if args.wrap == "ddp":
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
