"""Several independent models at once, one per host: a learning-rate sweep in one SageMaker job.

Run with no distribution and `instance_count` = the number of models: SageMaker (and the image's
`train`) runs this script once on every host. Each host picks its own configuration by its index
in SM_HOSTS (here: one learning rate from `--learning-rates`), trains a PyTorch model on the
whole training channel by itself (no communication between hosts), and writes its model and
metrics under a directory named after the host: SageMaker merges every host's /opt/ml/model
into one model.tar.gz, so the names must not clash.

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

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

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

    x_train, y_train, classes = load_image_folder(args.train, args.image_size)
    x_val, y_val, _ = load_image_folder(args.validation, args.image_size, classes)
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
        with torch.no_grad():
            return (model(x_val.to(device)).argmax(1).cpu() == y_val).float().mean().item()

    for epoch in range(first_epoch, args.epochs + 1):
        model.train()
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(args.seed * 1000 + epoch))
        for start in range(0, len(order) - args.batch_size + 1, args.batch_size):
            batch = order[start:start + args.batch_size]
            optimizer.zero_grad()
            F.cross_entropy(model(x_train[batch].to(device)), y_train[batch].to(device)).backward()
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
