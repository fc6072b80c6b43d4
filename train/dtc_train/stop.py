"""Stopping cleanly when asked: save where training stands, then leave.

SageMaker stops a job (StopTrainingJob, MaxRuntimeInSeconds, a managed-spot interruption) by
sending SIGTERM to the container and SIGKILL 120 s later (SageMaker docs: "Stop a training
job"; ``train`` passes the signal to every rank on every host). A built-in trainer does not die
of it: ``StopRequest`` notes the signal, the training loop goes on until the ranks agree that
one of them was asked (``agreed``, a sum over ranks every ``AGREE_EVERY_STEPS`` steps, so that
all stop after the same step and no collective is left waiting), rank 0 writes the checkpoint,
and every rank exits with ``128 + signal`` (143 for SIGTERM): the job is reported as stopped,
and a restart resumes from that step.

Also here: when to write a checkpoint on a schedule (``Schedule``, the ``checkpoint-every``
hyperparameter).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
AGREE_EVERY_STEPS = 10


class Stopped(Exception):
    """Raised out of the training loop once the checkpoint of a stop is written; ``exit_code``
    is ``128 + signal``."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @classmethod
    def after_checkpoint(cls, signum: int, epoch: int, step: int, checkpoint_dir: str, announce: bool) -> Stopped:
        """The exception to raise once the stop's checkpoint (after ``step`` of ``epoch``, 1-based)
        is in ``checkpoint_dir``; the reporting rank (``announce``) logs it."""
        stopped = cls(signum)
        if announce:
            logging.getLogger("dtc.train").warning("%s after step %d of epoch %d: checkpoint written to %s", stopped,
                                                   step, epoch, checkpoint_dir)
        return stopped


class StopRequest:
    """Handles SIGTERM/SIGINT (installed by the constructor, first thing in a trainer).

    Until ``training_begins()`` there is nothing to save, so a stop ends the process at once
    with ``128 + signal``. From then on the signal is only noted: ``signum`` is the first one
    received, or ``None``, and its arrival is one line on stderr (``SIGTERM received: ...``: a
    Python handler runs when the main thread next runs Python, so the line also shows how long
    a trainer's native call held the stop up); call ``agreed(global_step, sum_over_ranks)`` at
    the same point of every step on every rank.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self.deferring = False
        self.install()

    def install(self) -> None:
        """Makes this object the handler of the stop signals. Call it again after creating a
        ``tf.distribute.MultiWorkerMirroredStrategy`` with ``TF_CONFIG``: TensorFlow's
        coordination service then installs a C-level SIGTERM handler of its own (its preemption
        notifier), which takes the signal from Python while ``signal.getsignal`` still names ours."""
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._note)

    def training_begins(self) -> None:
        """From now on a stop waits for the end of the step and a checkpoint."""
        self.deferring = True

    def _note(self, signum, _frame) -> None:
        if not self.deferring:
            sys.stderr.write(f"stopped by {signal.Signals(signum).name} before training began: nothing to save\n")
            sys.stderr.flush()
            os._exit(128 + signum)   # not SystemExit: library threads (DALI, Horovod) could hold the exit up
        if self.signum is None:
            self.signum = signum
            # when this handler ran (the main thread's first Python after the signal), against when
            # the ranks act on it; one write: safe in a signal handler, unlike logging
            os.write(2, f"{signal.Signals(signum).name} received: stopping after the step the ranks agree on, "
                        "with a checkpoint\n".encode())

    def agreed(self, global_step: int, sum_over_ranks: Callable[[float], float]) -> int | None:
        """The signal to stop for when any rank received one, else ``None``; the same answer on
        every rank. The ranks compare notes after every ``AGREE_EVERY_STEPS``-th step of the job
        (a stop waits for at most that many steps): an eager all-reduce costs TensorFlow
        trainers several times a digits step, so not every step.

        Args:
            global_step: the optimizer steps done in the job (1-based; the same on every rank).
            sum_over_ranks: sums a float over all ranks (an all-reduce); called with this rank's
                signal number (0 when none), so the result is non-zero when any rank was asked.
        """
        if global_step % AGREE_EVERY_STEPS:
            return None
        total = sum_over_ranks(float(self.signum or 0))
        if not total:
            return None
        return self.signum or signal.SIGTERM   # a rank not yet signalled stops for the others' SIGTERM


_SCHEDULE = re.compile(r"^\s*(\d+)\s*(epochs?|steps?)?\s*$")


@dataclass(frozen=True)
class Schedule:
    """When to write a scheduled checkpoint: every ``every`` epochs or optimizer steps.

    ``every == 0``: no scheduled checkpoints (one is still written on a stop and at the end).
    """

    every: int
    unit: str   # "epochs" or "steps"

    @classmethod
    def parse(cls, text: str) -> Schedule:
        """``"2"`` or ``"2epochs"`` (every 2 epochs), ``"500steps"``, ``"0"`` (never).

        Raises:
            ValueError: naming the hyperparameter and the accepted forms.
        """
        match = _SCHEDULE.match(str(text))
        if not match:
            raise ValueError(f"checkpoint-every={text!r}: use a count of epochs ('1', '2epochs') or of steps "
                             "('500steps'), or 0 for a checkpoint only when stopped and at the end")
        unit = "steps" if (match.group(2) or "").startswith("step") else "epochs"
        return cls(int(match.group(1)), unit)

    def due_after_step(self, global_step: int) -> bool:
        """Whether global optimizer step ``global_step`` (1-based, counted over the job) ends with a checkpoint."""
        return self.unit == "steps" and self.every > 0 and global_step % self.every == 0

    def due_after_epoch(self, epoch: int) -> bool:
        """Whether epoch ``epoch`` (1-based) ends with a checkpoint."""
        return self.unit == "epochs" and self.every > 0 and epoch % self.every == 0
