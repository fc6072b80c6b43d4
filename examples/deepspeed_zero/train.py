"""DeepSpeed ZeRO (stages 1-3) under torchrun: sharded data-parallel training on SageMaker.

Run with torchrun (SageMaker's `distribution={"torch_distributed": {"enabled": True}}`; the image
starts one torchrun per host): DeepSpeed reads torchrun's environment, shards the optimizer
state (stage 1), the gradients too (stage 2) and the parameters too (stage 3) across every rank,
and communicates over Gloo on CPU or NCCL on GPU. DeepSpeed's own launcher is not needed.

The optimizer is DeepSpeed's Adam with `torch_adam` (torch's implementation): DeepSpeed's fused
CPU Adam would be compiled at run time, and the image has no compiler. The one op DeepSpeed
compiles for every CPU job (its shared-memory collectives) is prebuilt in the image.

Every rank lists the channel's files and decodes only the images of its own shard, as it reads
them (a Dataset over file names, DataLoader workers decoding beside the training).

What it reads (SageMaker's training environment):
  SM_CHANNEL_TRAINING, SM_CHANNEL_VALIDATION  image folders: <channel>/<class>/<image>.png
  SM_MODEL_DIR                               rank 0 writes the gathered model, model.pt
  /opt/ml/checkpoints                        DeepSpeed checkpoints (every rank writes its shards):
                                             a restarted job resumes from the latest
  RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR  set by torchrun
Hyperparameters arrive as `--name value` arguments.
"""

import argparse
import glob
import hashlib
import os
import shutil
import sys

import deepspeed
import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

CHECKPOINT_DIR = "/opt/ml/checkpoints"


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zero-stage", type=int, choices=(1, 2, 3), default=2)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.002)
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
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


class ImageFiles(Dataset):
    """The images under root/<class>/, listed by name and decoded when read: item i is a
    (1, S, S) float32 tensor in [0, 1] and its int64 label."""

    def __init__(self, root, image_size, classes):
        self.image_size = image_size
        self.files = [(os.path.join(root, name, file), label) for label, name in enumerate(classes)
                      if os.path.isdir(os.path.join(root, name))
                      for file in sorted(os.listdir(os.path.join(root, name)))]

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
    cuda = torch.cuda.is_available()
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)

    classes = class_folders(channel_dir(args.train, "training"))
    train_files = ImageFiles(args.train, args.image_size, classes)
    sampler = DistributedSampler(train_files, seed=args.seed, drop_last=True)
    loader = DataLoader(train_files, batch_size=args.batch_size, sampler=sampler, drop_last=True,
                        num_workers=args.workers)
    val_files = ImageFiles(channel_dir(args.validation, "validation"), args.image_size, classes)
    val_loader = DataLoader(Subset(val_files, range(rank, len(val_files), world_size)), batch_size=256,
                            num_workers=args.workers)

    config = {
        "train_micro_batch_size_per_gpu": args.batch_size,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": args.lr, "torch_adam": True}},
        "zero_optimization": {"stage": args.zero_stage},
        "steps_per_print": 1_000_000,
    }
    model = Net(len(classes), args.image_size)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)

    first_epoch = 1
    if os.path.exists(os.path.join(args.checkpoint_dir, "latest")):   # every rank loads its own shards
        _, state = engine.load_checkpoint(args.checkpoint_dir)
        first_epoch = state["epoch"] + 1
        if rank == 0:
            print(f"resuming from {args.checkpoint_dir}: epoch {state['epoch']} done", flush=True)

    for epoch in range(first_epoch, args.epochs + 1):
        engine.train()
        sampler.set_epoch(epoch)
        for images, labels in loader:
            loss = F.cross_entropy(engine(images.to(engine.device)), labels.to(engine.device))
            engine.backward(loss)
            engine.step()
        engine.eval()
        correct = seen = 0
        with torch.no_grad():
            for images, labels in val_loader:
                correct += (engine(images.to(engine.device)).argmax(1).cpu() == labels).sum().item()
                seen += len(labels)
        totals = torch.tensor([correct, seen], dtype=torch.float64, device=engine.device)
        dist.all_reduce(totals)
        if rank == 0:
            print(f"epoch={epoch}/{args.epochs} zero_stage={args.zero_stage} loss={loss.item():.4f} "
                  f"val_accuracy={(totals[0] / totals[1]):.4f}", flush=True)
        engine.save_checkpoint(args.checkpoint_dir, tag=f"epoch-{epoch}", client_state={"epoch": epoch})
        dist.barrier()   # every rank's shards of this epoch are written: the older epochs can go
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:   # each host's own folder (a shared one: harmless twice)
            for old in glob.glob(os.path.join(args.checkpoint_dir, "epoch-*")):
                if os.path.basename(old) != f"epoch-{epoch}":
                    shutil.rmtree(old, ignore_errors=True)

    # ZeRO-3 keeps a shard of every parameter on each rank: gather them to save the whole model
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        weights = b"".join(p.detach().cpu().numpy().tobytes() for p in engine.module.parameters())
        if rank == 0:
            os.makedirs(args.model_dir, exist_ok=True)
            torch.save({"model": engine.module.state_dict(), "classes": classes, "image_size": args.image_size},
                       os.path.join(args.model_dir, "model.pt"))
    print(f"rank={rank} world_size={world_size} weights_sha256={hashlib.sha256(weights).hexdigest()}", flush=True)
    dist.barrier()   # every rank waits until rank 0 has saved: some launchers stop all hosts when one exits


if __name__ == "__main__":
    main()
