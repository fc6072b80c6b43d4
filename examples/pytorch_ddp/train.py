"""PyTorch DistributedDataParallel under torchrun: data-parallel image classification on SageMaker.

Run with torchrun (SageMaker's `distribution={"torch_distributed": {"enabled": True}}`; the image
starts one torchrun per host with `--nproc_per_node` = processes per host): every rank trains a
copy of the model on its shard (DistributedSampler), DDP averages the gradients (Gloo on CPU,
NCCL on GPU), and rank 0 writes checkpoints and the model.

Channels may be FullyReplicated (every host holds all files: ranks split them by global rank) or
ShardedByS3Key (`TrainingInput(..., distribution="ShardedByS3Key")`: each host holds its part,
which the host's ranks split by local rank). Either way every rank runs the same number of steps
(the smallest shard's: each step is a collective) and validation sums are exact.

What it reads (SageMaker's training environment):
  SM_CHANNEL_TRAINING, SM_CHANNEL_VALIDATION  image folders: <channel>/<class>/<image>.png
  SM_MODEL_DIR                               where the final model goes (uploaded as model.tar.gz)
  /opt/ml/checkpoints                        synced with checkpoint_s3_uri: a restarted job resumes
  SM_INPUT_DATA_CONFIG, SM_HOSTS             each channel's S3DistributionType, the job's hosts
  RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR  set by torchrun (and LOCAL_WORLD_SIZE)
Hyperparameters arrive as `--name value` arguments.
"""

import argparse
import hashlib
import itertools
import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from PIL import Image
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

CHECKPOINT_DIR = "/opt/ml/checkpoints"


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.01, help="for one rank; scaled by the world size")
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--train", default=os.environ.get("SM_CHANNEL_TRAINING"))
    parser.add_argument("--validation", default=os.environ.get("SM_CHANNEL_VALIDATION"))
    parser.add_argument("--model-dir", default=os.environ.get("SM_MODEL_DIR", "/opt/ml/model"))
    parser.add_argument("--checkpoint-dir", default=CHECKPOINT_DIR)
    return parser.parse_args()


def class_folders(root):
    return sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))


def host_sharded(channel):
    """True when this host holds only its part of the channel: ShardedByS3Key on several hosts."""
    config = json.loads(os.environ.get("SM_INPUT_DATA_CONFIG", "{}")).get(channel, {})
    hosts = json.loads(os.environ.get("SM_HOSTS", "[]"))
    return config.get("S3DistributionType") == "ShardedByS3Key" and len(hosts) > 1


def load_image_folder(root, image_size, classes):
    """All images under root/<class>/ as (N, 1, S, S) float32 in [0, 1] and (N,) int64 labels
    (a class folder this host's part lacks holds no image here)."""
    images, labels = [], []
    for label, name in enumerate(classes):
        if not os.path.isdir(os.path.join(root, name)):
            continue
        for file in sorted(os.listdir(os.path.join(root, name))):
            with Image.open(os.path.join(root, name, file)) as image:
                pixels = image.convert("L").resize((image_size, image_size), Image.BILINEAR)
            images.append(np.asarray(pixels, dtype=np.float32) / 255.0)
            labels.append(label)
    if not images:
        raise ValueError(f"{root} holds no images: a ShardedByS3Key channel needs at least one object per instance")
    return torch.from_numpy(np.stack(images)[:, None]), torch.tensor(labels)


class Net(torch.nn.Module):
    def __init__(self, classes, image_size):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.fc = torch.nn.Linear(32 * (image_size // 4) ** 2, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def main():
    args = parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)

    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    # who splits a channel: every rank (a full copy on each host) or the host's ranks (its part)
    train_split = (local_rank, local_size) if host_sharded("training") else (rank, world_size)
    val_split = (local_rank, local_size) if host_sharded("validation") else (rank, world_size)
    # labels from every host's class folders: a host's part of a sharded channel may lack one
    folders = [None] * world_size
    dist.all_gather_object(folders, class_folders(args.train))
    classes = sorted(set().union(*folders))
    x_train, y_train = load_image_folder(args.train, args.image_size, classes)
    x_val, y_val = load_image_folder(args.validation, args.image_size, classes)
    sampler = DistributedSampler(TensorDataset(x_train, y_train), num_replicas=train_split[1], rank=train_split[0],
                                 seed=args.seed, drop_last=True)
    loader = DataLoader(TensorDataset(x_train, y_train), batch_size=args.batch_size, sampler=sampler, drop_last=True)
    x_val, y_val = x_val[val_split[0]::val_split[1]], y_val[val_split[0]::val_split[1]]
    # every rank runs the same number of steps: the smallest shard's (hosts' parts may differ)
    steps = torch.tensor([len(loader)], device=device)
    dist.all_reduce(steps, op=dist.ReduceOp.MIN)
    steps = int(steps)
    if rank == 0:
        print(f"training: {'ShardedByS3Key, split by local rank' if host_sharded('training') else 'split by rank'}; "
              f"{steps} steps per epoch on every rank", flush=True)

    model = Net(len(classes), args.image_size).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * world_size, momentum=0.9)
    checkpoint = os.path.join(args.checkpoint_dir, "checkpoint.pt")
    # rank 0 reads the checkpoint (rank 0's host is the one that wrote it) and sends it to every rank
    found = [torch.load(checkpoint, map_location="cpu") if rank == 0 and os.path.exists(checkpoint) else None]
    dist.broadcast_object_list(found, src=0)
    first_epoch = 1
    if found[0] is not None:
        model.load_state_dict(found[0]["model"])
        optimizer.load_state_dict(found[0]["optimizer"])
        first_epoch = found[0]["epoch"] + 1
        if rank == 0:
            print(f"resuming from {checkpoint}: epoch {found[0]['epoch']} done", flush=True)
    model = DistributedDataParallel(model)   # also broadcasts rank 0's weights

    for epoch in range(first_epoch, args.epochs + 1):
        model.train()
        sampler.set_epoch(epoch)
        for images, labels in itertools.islice(loader, steps):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(images.to(device)), labels.to(device))
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            correct = (model(x_val.to(device)).argmax(1).cpu() == y_val).sum().item()
        totals = torch.tensor([correct, len(y_val)], dtype=torch.float64, device=device)
        dist.all_reduce(totals)
        if rank == 0:
            print(f"epoch={epoch}/{args.epochs} loss={loss.item():.4f} val_accuracy={(totals[0] / totals[1]):.4f}",
                  flush=True)
            os.makedirs(args.checkpoint_dir, exist_ok=True)
            state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
            torch.save(state, checkpoint + ".tmp")
            os.replace(checkpoint + ".tmp", checkpoint)   # a job stopped mid-write keeps the last checkpoint
        dist.barrier()   # the checkpoint is complete before any rank reads it or the job ends

    weights = b"".join(p.detach().cpu().numpy().tobytes() for p in model.module.parameters())
    print(f"rank={rank} world_size={world_size} weights_sha256={hashlib.sha256(weights).hexdigest()}", flush=True)
    if rank == 0:
        os.makedirs(args.model_dir, exist_ok=True)
        torch.save({"model": model.module.state_dict(), "classes": classes, "image_size": args.image_size},
                   os.path.join(args.model_dir, "model.pt"))
    dist.barrier()   # every rank waits until rank 0 has saved: some launchers stop all hosts when one exits
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Everything is saved and every rank is done: leave without Python's interpreter teardown.
    # A Gloo worker thread of PyTorch can drop its reference to a collective's tensor a moment
    # after the collective completed (late when the CPUs are busy); if that falls inside Python
    # 3.11's teardown, taking the GIL ends that thread inside a C++ destructor and the process
    # aborts ("terminate called without an active exception", SIGABRT) after a job that succeeded.
    # Seen about once in 100 runs beside busy CPUs; the native stack is in docs/troubleshooting.md.
    # Upstream: pytorch/pytorch#179291 (Gloo works holding Python tensors at exit), python/cpython
    # gh-87135 (threads that take the GIL during teardown exit; Python 3.14 makes them wait).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
