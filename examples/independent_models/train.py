"""Several independent models at once, one per host: a learning-rate sweep in one SageMaker job.

Run with no distribution and `instance_count` = the number of models: SageMaker (and the image's
`train`) runs this script once on every host. Each host picks its own configuration by its index
in SM_HOSTS (here: one learning rate from `--learning-rates`), trains a PyTorch model on the
whole training channel by itself (no communication between hosts), and writes its model and
metrics under a directory named after the host: SageMaker merges every host's /opt/ml/model
into one model.tar.gz, so the names must not clash. The images are listed by name and decoded
as they are read (a Dataset over file names, DataLoader workers), not held in memory.

What it reads (SageMaker's training environment):
  SM_HOSTS, SM_CURRENT_HOST                   the job's hosts (sorted) and this one
  SM_CHANNEL_TRAINING, SM_CHANNEL_VALIDATION  image folders: <channel>/<class>/<image>.png
  SM_MODEL_DIR                               <model dir>/<host>/model.pt and metrics.json
  /opt/ml/checkpoints                        <checkpoints>/<host>/checkpoint.pt: a restarted job resumes
Hyperparameters arrive as `--name value` arguments.
"""

import argparse
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader, Dataset

CHECKPOINT_DIR = "/opt/ml/checkpoints"


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learning-rates", default="0.005,0.02",
                        help="comma-separated: host i (in SM_HOSTS order) trains with the i-th")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--train", default=os.environ.get("SM_CHANNEL_TRAINING"))
    parser.add_argument("--validation", default=os.environ.get("SM_CHANNEL_VALIDATION"))
    parser.add_argument("--model-dir", default=os.environ.get("SM_MODEL_DIR", "/opt/ml/model"))
    parser.add_argument("--checkpoint-dir", default=CHECKPOINT_DIR)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader processes decoding images")
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
    hosts = json.loads(os.environ.get("SM_HOSTS", '["algo-1"]'))
    host = os.environ.get("SM_CURRENT_HOST", hosts[0])
    index = hosts.index(host)
    learning_rates = [float(value) for value in args.learning_rates.split(",")]
    if index >= len(learning_rates):
        raise SystemExit(f"--learning-rates gives {len(learning_rates)} values for {len(hosts)} hosts: "
                         f"give one per host (host {host} is number {index + 1})")
    lr = learning_rates[index]
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    classes = class_folders(channel_dir(args.train, "training"))
    train_files = ImageFiles(args.train, args.image_size, classes)
    val_loader = DataLoader(ImageFiles(channel_dir(args.validation, "validation"), args.image_size, classes),
                            batch_size=256, num_workers=args.workers)
    model = Net(len(classes), args.image_size).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)

    checkpoint = os.path.join(args.checkpoint_dir, host, "checkpoint.pt")   # one per host: they never clash
    first_epoch = 1
    if os.path.exists(checkpoint):
        state = torch.load(checkpoint, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first_epoch = state["epoch"] + 1
        print(f"{host}: resuming from {checkpoint}: epoch {state['epoch']} done", flush=True)

    def evaluate():
        model.eval()
        correct = seen = 0
        with torch.no_grad():
            for images, labels in val_loader:
                correct += (model(images.to(device)).argmax(1).cpu() == labels).sum().item()
                seen += len(labels)
        return correct / seen

    for epoch in range(first_epoch, args.epochs + 1):
        model.train()
        order = torch.randperm(len(train_files), generator=torch.Generator().manual_seed(args.seed * 1000 + epoch))
        batches = [order[start:start + args.batch_size].tolist()
                   for start in range(0, len(order) - args.batch_size + 1, args.batch_size)]
        for images, labels in DataLoader(train_files, batch_sampler=batches, num_workers=args.workers):
            optimizer.zero_grad()
            F.cross_entropy(model(images.to(device)), labels.to(device)).backward()
            optimizer.step()
        print(f"{host}: lr={lr} epoch={epoch}/{args.epochs} val_accuracy={evaluate():.4f}", flush=True)
        os.makedirs(os.path.dirname(checkpoint), exist_ok=True)
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch},
                   checkpoint + ".tmp")
        os.replace(checkpoint + ".tmp", checkpoint)   # a job stopped mid-write keeps the last checkpoint

    out = os.path.join(args.model_dir, host)
    os.makedirs(out, exist_ok=True)
    torch.save({"model": model.state_dict(), "classes": classes, "image_size": args.image_size},
               os.path.join(out, "model.pt"))
    with open(os.path.join(out, "metrics.json"), "w") as f:
        json.dump({"host": host, "learning_rate": lr, "epochs": args.epochs, "val_accuracy": evaluate()}, f)


if __name__ == "__main__":
    main()
