"""``builtin:numbers`` under ``once_per_host`` (and alone): a backend of plain numbers driven by
the built-in trainers' loop (``dtc_train.loop``), with their options, metric lines and report.
Registered under the entry-point group ``dtc.trainers``."""

import json
import os
import sys

import numpy as np

from dtc_train.trainers import Trainer

TRAINER = Trainer("numbers", "numbers", ("once_per_host", "single"),
                  "builtin:numbers once per host (a backend of plain numbers)", dali_input=False,
                  package="once_per_host")


class NumbersBackend:
    """One rank: ``steps_per_epoch`` steps of ``batch`` samples, ``batch - 1`` right, loss
    ``1 / global_step``; validation 0.75 of 100. ``save`` writes the position."""

    rank, world_size, rate_scale, steps_per_epoch, batch = 0, 1, 1, 5, 4

    def __init__(self, checkpoint_dir):
        self.checkpoint_dir, self.weights = checkpoint_dir, np.zeros(3)

    def begin_epoch(self, epoch, first_step):
        pass

    def set_learning_rate(self, rate):
        self.rate = rate

    def train_step(self, global_step):
        self.weights += self.rate
        return np.array([self.batch / global_step, self.batch - 1, self.batch], dtype=np.float64)

    def total(self, sums, name):
        return sums

    def sum_scalar(self, value, name):
        return value

    def end_training_steps(self):
        pass

    def evaluate(self):
        return 0.5, 0.75, 100

    def save(self, epoch, step, train_sums, plateau_state):
        os.makedirs(self.checkpoint_dir, exist_ok=True)
        with open(os.path.join(self.checkpoint_dir, "numbers.json"), "w") as out:
            json.dump({"epoch": epoch, "step": step}, out)


def main(argv=None) -> int:
    from dtc_train import config, loop, observe, stop

    args = config.parse(TRAINER.backend, argv)
    backend = NumbersBackend(args.checkpoint_dir)
    observer = observe.Observer(args, 0, 1, backend.steps_per_epoch, backend.batch, "once_per_host")

    def finish(val_accuracy):
        loop.emit_digest(0, 1, [backend.weights])
        with open(os.path.join(args.model_dir, "model.json"), "w") as out:
            json.dump({"host": os.environ["SM_CURRENT_HOST"], "val_accuracy": val_accuracy}, out)

    return loop.run(loop.Rules.of(args), backend, observer, stop.StopRequest(), loop.Resume(), finish)


if __name__ == "__main__":
    sys.exit(main())
