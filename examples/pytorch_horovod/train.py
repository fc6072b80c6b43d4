"""Horovod + PyTorch: data-parallel image classification on SageMaker (or `make cluster`).

Run with `mpirun` (SageMaker's `distribution={"mpi": {"enabled": True, "processes_per_host": N}}`):
every rank trains a copy of the model on its shard of the training channel, Horovod averages the
gradients, and rank 0 writes checkpoints and the model.

What it reads (SageMaker's training environment):
  SM_CHANNEL_TRAINING, SM_CHANNEL_VALIDATION  image folders: <channel>/<class>/<image>.png
  SM_MODEL_DIR                               where the final model goes (uploaded as model.tar.gz)
  /opt/ml/checkpoints                        synced with checkpoint_s3_uri: a restarted job resumes
Hyperparameters arrive as `--name value` arguments.
"""

import argparse
import hashlib
import os

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

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


def load_image_folder(root, image_size, classes=None):
    """All images under root/<class>/ as (N, 1, S, S) float32 in [0, 1] and (N,) int64 labels."""
    classes = classes or sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    images, labels = [], []
    for label, name in enumerate(classes):
        for file in sorted(os.listdir(os.path.join(root, name))):
            with Image.open(os.path.join(root, name, file)) as image:
                pixels = image.convert("L").resize((image_size, image_size), Image.BILINEAR)
            images.append(np.asarray(pixels, dtype=np.float32) / 255.0)
            labels.append(label)
    return torch.from_numpy(np.stack(images)[:, None]), torch.tensor(labels), classes


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

    x_train, y_train, classes = load_image_folder(args.train, args.image_size)
    x_val, y_val, _ = load_image_folder(args.validation, args.image_size, classes)
    steps = len(x_train) // hvd.size() // args.batch_size   # the same on every rank: the smallest shard's
    x_train, y_train = x_train[hvd.rank()::hvd.size()], y_train[hvd.rank()::hvd.size()]   # this rank's shard
    x_val, y_val = x_val[hvd.rank()::hvd.size()], y_val[hvd.rank()::hvd.size()]

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
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(args.seed * 1000 + epoch))
        for step in range(steps):
            batch = order[step * args.batch_size:(step + 1) * args.batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x_train[batch].to(device)), y_train[batch].to(device))
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            correct = (model(x_val.to(device)).argmax(1).cpu() == y_val).sum()
        totals = hvd.allreduce(torch.tensor([correct.item(), len(y_val)], dtype=torch.float64), op=hvd.Sum)
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
