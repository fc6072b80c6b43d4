"""Horovod + PyTorch: data-parallel image classification on SageMaker (or `make cluster`).

Run with `mpirun` (SageMaker's `distribution={"mpi": {"enabled": True, "processes_per_host": N}}`):
every rank trains a copy of the model on its shard of the training channel, Horovod averages the
gradients, and rank 0 writes checkpoints and the model.

Every rank lists the channel's files and decodes only the images of its own shard, as it reads
them (a Dataset over file names, DataLoader workers decoding beside the training), so a channel
larger than a host's memory trains too. `--precision bf16` runs the forward pass in bfloat16
(torch.autocast), on GPUs and CPUs alike.

What it reads (SageMaker's training environment):
  SM_CHANNEL_TRAINING, SM_CHANNEL_VALIDATION  image folders: <channel>/<class>/<image>.png
  SM_MODEL_DIR                               where the final model goes (uploaded as model.tar.gz)
  /opt/ml/checkpoints                        synced with checkpoint_s3_uri: a restarted job resumes
Hyperparameters arrive as `--name value` arguments. Metrics: one `epoch=... loss=...
val_accuracy=...` line per epoch, for an estimator's `metric_definitions`.
"""

import argparse
import hashlib
import os
import sys

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader, Dataset, Subset

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


def save_checkpoint(path, model, optimizer, epoch):
    """Written to a temporary file and renamed, so a job stopped mid-write keeps the last one."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, path + ".tmp")
    os.replace(path + ".tmp", path)


def main():
    args = parse_args()
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))
    device = torch.device("cuda", hvd.local_rank()) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)

    classes = class_folders(channel_dir(args.train, "training"))
    train_files = ImageFiles(args.train, args.image_size, classes)
    val_files = ImageFiles(channel_dir(args.validation, "validation"), args.image_size, classes)
    steps = len(train_files) // hvd.size() // args.batch_size   # the same on every rank: the smallest shard's
    shard = Subset(train_files, range(hvd.rank(), len(train_files), hvd.size()))   # this rank's files
    val_loader = DataLoader(Subset(val_files, range(hvd.rank(), len(val_files), hvd.size())), batch_size=256,
                            num_workers=args.workers)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16")

    model = Net(len(classes), args.image_size).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    # Wrap before loading a checkpoint: DistributedOptimizer is a new optimizer with empty state,
    # so momentum loaded into the one it wraps would be lost.
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    checkpoint = os.path.join(args.checkpoint_dir, "checkpoint.pt")
    first_epoch = 1
    if hvd.rank() == 0 and os.path.exists(checkpoint):
        state = torch.load(checkpoint, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first_epoch = state["epoch"] + 1
        print(f"resuming from {checkpoint}: epoch {state['epoch']} done", flush=True)
    # rank 0's weights, optimizer state and position go to every rank
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    first_epoch = hvd.broadcast_object(first_epoch, root_rank=0)

    for epoch in range(first_epoch, args.epochs + 1):
        model.train()
        order = torch.randperm(len(shard), generator=torch.Generator().manual_seed(args.seed * 1000 + epoch))
        batches = [order[step * args.batch_size:(step + 1) * args.batch_size].tolist() for step in range(steps)]
        for images, labels in DataLoader(shard, batch_sampler=batches, num_workers=args.workers):
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
        totals = hvd.allreduce(torch.tensor([correct, seen], dtype=torch.float64), op=hvd.Sum)
        if hvd.rank() == 0:
            print(f"epoch={epoch}/{args.epochs} loss={loss.item():.4f} val_accuracy={(totals[0] / totals[1]):.4f}",
                  flush=True)
            save_checkpoint(checkpoint, model, optimizer, epoch)

    digest = hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters())).hexdigest()
    print(f"rank={hvd.rank()} world_size={hvd.size()} weights_sha256={digest}", flush=True)
    if hvd.rank() == 0:
        os.makedirs(args.model_dir, exist_ok=True)
        torch.save({"model": model.state_dict(), "classes": classes, "image_size": args.image_size},
                   os.path.join(args.model_dir, "model.pt"))
    hvd.barrier()   # every rank waits until rank 0 has saved: some launchers stop all hosts when one exits


if __name__ == "__main__":
    main()
