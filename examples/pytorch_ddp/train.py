"""PyTorch DistributedDataParallel under torchrun: data-parallel image classification on SageMaker.

Run with torchrun (SageMaker's `distribution={"torch_distributed": {"enabled": True}}`; the image
starts one torchrun per host with `--nproc_per_node` = processes per host): every rank trains a
copy of the model on its shard (DistributedSampler), DDP averages the gradients (Gloo on CPU,
NCCL on GPU), and rank 0 writes checkpoints and the model.

Every rank lists the channel's files and decodes only the images of its own shard, as it reads
them (a Dataset over file names, DataLoader workers decoding beside the training), so a channel
larger than a host's memory trains too. `--precision bf16` runs the forward pass in bfloat16
(torch.autocast), on GPUs and CPUs alike.

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
Hyperparameters arrive as `--name value` arguments. Metrics: one `epoch=... loss=...
val_accuracy=...` line per epoch, for an estimator's `metric_definitions`.
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
from torch.utils.data import DataLoader, Dataset, DistributedSampler

CHECKPOINT_DIR = "/opt/ml/checkpoints"


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.01, help="for one rank; scaled by the world size")
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="bf16: autocast's bfloat16")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader processes decoding images, per rank")
    parser.add_argument("--train", default=os.environ.get("SM_CHANNEL_TRAINING"))
    parser.add_argument("--validation", default=os.environ.get("SM_CHANNEL_VALIDATION"))
    parser.add_argument("--model-dir", default=os.environ.get("SM_MODEL_DIR", "/opt/ml/model"))
    parser.add_argument("--checkpoint-dir", default=CHECKPOINT_DIR)
    return parser.parse_args()


def channel_dir(path, name):
    """The channel's directory; a missing or empty channel ends the job with a sentence naming it."""
    if not path or not os.path.isdir(path):
        sys.exit(f"channel '{name}' is missing (SM_CHANNEL_{name.upper()} is not set or not a directory): "
                 f"pass it to fit(), e.g. fit({{'{name}': 's3://<bucket>/<prefix>/{name}'}})")
    if not class_folders(path):
        sys.exit(f"channel '{name}' ({path}) holds no class folders: it must hold <class>/<image> files")
    return path


def class_folders(root):
    return sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))


def host_sharded(channel):
    """True when this host holds only its part of the channel: ShardedByS3Key on several hosts."""
    config = json.loads(os.environ.get("SM_INPUT_DATA_CONFIG", "{}")).get(channel, {})
    hosts = json.loads(os.environ.get("SM_HOSTS", "[]"))
    return config.get("S3DistributionType") == "ShardedByS3Key" and len(hosts) > 1


class ImageFiles(Dataset):
    """The images under root/<class>/, listed by name and decoded when read: item i is a
    (1, S, S) float32 tensor in [0, 1] and its int64 label (a class folder this host's part of a
    sharded channel lacks holds no image here)."""

    def __init__(self, root, image_size, classes):
        self.image_size = image_size
        self.files = [(os.path.join(root, name, file), label) for label, name in enumerate(classes)
                      if os.path.isdir(os.path.join(root, name))
                      for file in sorted(os.listdir(os.path.join(root, name)))]
        if not self.files:
            sys.exit(f"{root} holds no images: a ShardedByS3Key channel needs at least one object per instance")

    def __len__(self):
        return len(self.files)

    def __getitem__(self, index):
        path, label = self.files[index]
        with Image.open(path) as image:
            pixels = image.convert("L").resize((self.image_size, self.image_size), Image.BILINEAR)
        return torch.from_numpy(np.asarray(pixels, dtype=np.float32)[None] / 255.0), label


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

    args.train = channel_dir(args.train, "training")
    args.validation = channel_dir(args.validation, "validation")
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    # who splits a channel: every rank (a full copy on each host) or the host's ranks (its part)
    train_split = (local_rank, local_size) if host_sharded("training") else (rank, world_size)
    val_split = (local_rank, local_size) if host_sharded("validation") else (rank, world_size)
    # labels from every host's class folders: a host's part of a sharded channel may lack one
    folders = [None] * world_size
    dist.all_gather_object(folders, class_folders(args.train))
    classes = sorted(set().union(*folders))
    train_files = ImageFiles(args.train, args.image_size, classes)
    sampler = DistributedSampler(train_files, num_replicas=train_split[1], rank=train_split[0], seed=args.seed,
                                 drop_last=True)
    workers = dict(num_workers=args.workers)   # each epoch's loop starts its workers and ends them
    loader = DataLoader(train_files, batch_size=args.batch_size, sampler=sampler, drop_last=True, **workers)
    val_files = ImageFiles(args.validation, args.image_size, classes)
    val_loader = DataLoader(torch.utils.data.Subset(val_files, range(val_split[0], len(val_files), val_split[1])),
                            batch_size=256, **workers)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16")
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
            with autocast:
                loss = F.cross_entropy(model(images.to(device)), labels.to(device))
            loss.backward()
            optimizer.step()
        model.eval()
        correct = seen = 0
        with torch.no_grad(), autocast:
            for images, labels in val_loader:
                correct += (model(images.to(device)).argmax(1).cpu() == labels).sum().item()
                seen += len(labels)
        totals = torch.tensor([correct, seen], dtype=torch.float64, device=device)
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
