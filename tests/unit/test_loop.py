"""The training loop's rules (``dtc_train.loop.fit``), with a backend of plain numbers: what every
built-in trainer does about resuming, stopping, checkpoints, the learning rate, early stopping
and a non-finite loss, checked in milliseconds instead of through a framework."""

import math
import os
import signal

import numpy as np
import pytest

from dtc_train import loop, stop


class NumbersBackend:
    """``world_size`` ranks simulated by one: every rank's step has ``batch`` samples, ``batch - 1``
    of them correct, and the loss ``losses(global_step)``; ``total`` adds the other ranks' steps
    of the epoch to this rank's sums.
    Validation returns ``val_losses[epoch - 1]``. Records what the loop asked."""

    def __init__(self, steps_per_epoch=5, world_size=2, batch=4, losses=lambda step: 1.0 / step,
                 val_losses=None, rank=0, stop_at=None):
        self.steps_per_epoch, self.world_size, self.rank = steps_per_epoch, world_size, rank
        self.rate_scale = world_size
        self.batch, self.losses, self.val_losses, self.stop_at = batch, losses, val_losses, stop_at
        self.epoch, self.steps, self.rates, self.saves, self.agreements = 0, [], [], [], 0

    def begin_epoch(self, epoch, first_step):
        self.epoch, self.epoch_steps = epoch, np.zeros(3)

    def set_learning_rate(self, rate):
        self.rates.append((len(self.steps) + 1, rate))

    def train_step(self, global_step):
        self.steps.append(global_step)
        if global_step == self.stop_at:
            os.kill(os.getpid(), signal.SIGTERM)   # the real signal, noted by the real StopRequest
        sums = np.array([self.losses(global_step) * self.batch, self.batch - 1, self.batch], dtype=np.float64)
        self.epoch_steps += sums
        return sums

    def total(self, sums, name):
        return sums + (self.world_size - 1) * self.epoch_steps

    def sum_scalar(self, value, name):
        self.agreements += 1
        return value * self.world_size

    def end_training_steps(self):
        pass

    def evaluate(self):
        loss = self.val_losses[self.epoch - 1] if self.val_losses else 0.5
        return loss, 0.75, 100

    def save(self, epoch, step, train_sums, plateau_state):
        self.saves.append((epoch, step, None if train_sums is None else train_sums.tolist(), dict(plateau_state)))


class Observer:
    def __init__(self):
        self.epochs, self.steps_done, self.begun, self.closed = [], 0, [], False

    def begin_epoch(self, epoch, first_step=0):
        self.begun.append((epoch, first_step))

    def step_done(self):
        self.steps_done += 1

    def end_training_steps(self):
        pass

    def end_epoch(self, epoch, **metrics):
        self.epochs.append((epoch, metrics))

    def close(self):
        self.closed = True


@pytest.fixture
def stop_request():
    handlers = {sig: signal.getsignal(sig) for sig in stop.STOP_SIGNALS}
    yield stop.StopRequest()
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def rules(**changes):
    settings = dict(epochs=3, checkpoint_every=stop.Schedule(1, "epochs"), checkpoint_dir="/ckpt", learning_rate=0.1)
    settings.update(changes)
    return loop.Rules(**settings)


def test_an_uninterrupted_job_takes_every_step_and_totals_each_epoch_over_the_ranks(stop_request):
    backend, observer = NumbersBackend(), Observer()
    assert loop.fit(rules(), backend, observer, stop_request) == 0.75
    assert backend.steps == list(range(1, 16)) and observer.steps_done == 15
    epoch, metrics = observer.epochs[1]
    assert epoch == 2 and metrics["train_accuracy"] == 0.75 and metrics["val_samples"] == 100
    assert metrics["train_loss"] == pytest.approx(sum(1.0 / s for s in range(6, 11)) / 5)
    assert [(e, s, sums) for e, s, sums, _ in backend.saves] == [(1, 0, None), (2, 0, None), (3, 0, None)]
    assert backend.rates == [(1, pytest.approx(0.2))]   # linear scaling: 0.1 x 2 ranks, set once


def test_a_job_resumed_mid_epoch_reports_what_the_uninterrupted_one_did(stop_request):
    whole = Observer()
    loop.fit(rules(), NumbersBackend(), whole, stop_request)
    done = sum(np.array([1.0 / step * 4, 3, 4]) * 2 for step in (6, 7))   # epoch 2's first two steps, 2 ranks
    resumed, observer = NumbersBackend(), Observer()
    loop.fit(rules(), resumed, observer, stop_request, loop.Resume(1, 2, done))
    assert resumed.steps == list(range(8, 16)) and observer.begun == [(2, 2), (3, 0)]
    assert observer.epochs[0][1]["train_loss"] == pytest.approx(whole.epochs[1][1]["train_loss"])
    assert observer.epochs[0][1]["train_accuracy"] == whole.epochs[1][1]["train_accuracy"]


def test_only_the_reporting_rank_adds_the_checkpoints_sums(stop_request):
    observer = Observer()
    sums = np.array([10.0, 10.0, 10.0])
    loop.fit(rules(epochs=2), NumbersBackend(rank=1), observer, stop_request, loop.Resume(1, 2, sums))
    assert observer.epochs[0][1]["train_accuracy"] == 0.75   # rank 1's total leaves the checkpoint's out


def test_a_checkpoint_after_an_epochs_last_step_validates_that_epoch_then_goes_on(stop_request):
    backend, observer = NumbersBackend(), Observer()
    done = np.array([5.0, 30.0, 40.0])                     # epoch 2's five steps, both ranks
    loop.fit(rules(), backend, observer, stop_request, loop.Resume(1, 5, done))
    assert backend.steps == list(range(11, 16))
    assert [epoch for epoch, _ in observer.epochs] == [2, 3] and observer.epochs[0][1]["train_accuracy"] == 0.75


def test_a_finished_job_is_only_validated(stop_request, caplog):
    backend = NumbersBackend()
    caplog.set_level("INFO", logger="dtc.train")
    assert loop.fit(rules(), backend, Observer(), stop_request, loop.Resume(3, 0)) == 0.75
    assert backend.steps == [] and backend.saves == []
    assert "the checkpoint has done all 3 epochs: nothing left to train" in caplog.text


def test_a_stop_waits_for_the_agreement_step_then_checkpoints_and_raises(stop_request):
    backend = NumbersBackend(steps_per_epoch=20, stop_at=13)
    with pytest.raises(stop.Stopped) as stopped:
        loop.fit(rules(), backend, Observer(), stop_request)
    assert stopped.value.exit_code == 128 + signal.SIGTERM
    assert backend.steps[-1] == 20                     # the next multiple of stop.AGREE_EVERY_STEPS
    assert backend.agreements == 2                     # steps 10 and 20 only
    epoch, step, sums, _ = backend.saves[-1]
    assert (epoch, step) == (0, 20) and sums[2] == 20 * 4 * 2   # every step's samples, both ranks


def test_a_step_schedule_checkpoints_mid_epoch_with_the_sums_so_far(stop_request):
    backend = NumbersBackend(steps_per_epoch=5)
    loop.fit(rules(epochs=2, checkpoint_every=stop.Schedule(3, "steps")), backend, Observer(), stop_request)
    positions = [(e, s, sums and sums[2]) for e, s, sums, _ in backend.saves]
    assert positions == [(0, 3, 24.0), (1, 1, 8.0), (1, 4, 32.0), (2, 0, None)]   # and after the last epoch


def test_warmup_and_cosine_set_the_rate_of_each_step_by_the_jobs_step(stop_request):
    backend = NumbersBackend(steps_per_epoch=4)
    loop.fit(rules(epochs=2, warmup_epochs=1, lr_schedule="cosine"), backend, Observer(), stop_request)
    rates = dict(backend.rates)
    assert rates[1] == pytest.approx(0.1) and rates[3] == pytest.approx(0.15)       # 0.1 -> 0.2 over 4 steps
    assert rates[5] == pytest.approx(0.2) and rates[7] == pytest.approx(0.2 * (1 + math.cos(math.pi / 2)) / 2)
    resumed = NumbersBackend(steps_per_epoch=4)
    loop.fit(rules(epochs=2, warmup_epochs=1, lr_schedule="cosine"), resumed, Observer(), stop_request,
             loop.Resume(1, 2))
    assert resumed.rates == [(1, pytest.approx(rates[7]))] + [(2, pytest.approx(rates[8]))]


def test_early_stopping_ends_on_a_plateau_and_its_state_survives_a_restart(stop_request, caplog):
    caplog.set_level("INFO", logger="dtc.train")
    backend = NumbersBackend(val_losses=[0.5, 0.4, 0.45, 0.41, 0.3])
    loop.fit(rules(epochs=5, early_stopping_patience=2), backend, Observer(), stop_request)
    assert backend.epoch == 4 and "early stopping after epoch 4 of 5" in caplog.text
    epoch, step, _, state = backend.saves[-1]
    assert (epoch, step) == (4, 0) and state == {"best_loss": 0.4, "best_epoch": 2, "stopped_after": 4}
    restarted = NumbersBackend()
    loop.fit(rules(epochs=5, early_stopping_patience=2), restarted, Observer(), stop_request,
             loop.Resume(4, 0, None, state))
    assert restarted.steps == [] and "stopped early after epoch 4 (early-stopping-patience)" in caplog.text


def test_a_nonfinite_loss_fails_naming_the_step_or_trains_on(stop_request):
    diverging = NumbersBackend(losses=lambda step: math.nan if step == 7 else 1.0)
    with pytest.raises(FloatingPointError, match=r"^the training loss is nan at step 2 of epoch 2 \(global step 7\) "
                                                  r"on rank 0: the model diverged"):
        loop.fit(rules(), diverging, Observer(), stop_request)
    trains_on = NumbersBackend(losses=lambda step: math.nan if step == 7 else 1.0)
    loop.fit(rules(nonfinite_loss="continue"), trains_on, Observer(), stop_request)
    assert trains_on.steps[-1] == 15


class UnreadSums:
    """A step's sums as a GPU backend returns them (``torch_common.PendingSums``): known only
    when read with ``np.asarray``, which the log records."""

    def __init__(self, sums, global_step, log):
        self.sums, self.global_step, self.log = sums, global_step, log

    def __array__(self, dtype=None, copy=None):
        self.log.append(f"read {self.global_step}")
        return self.sums.astype(dtype or np.float64)


class GpuLikeBackend(NumbersBackend):
    """``NumbersBackend`` whose steps return ``UnreadSums``; logs steps, reads, saves and totals."""

    def __init__(self, **settings):
        super().__init__(**settings)
        self.log = []

    def train_step(self, global_step):
        self.log.append(f"step {global_step}")
        return UnreadSums(super().train_step(global_step), global_step, self.log)

    def total(self, sums, name):
        self.log.append(name)
        return super().total(sums, name)

    def save(self, epoch, step, train_sums, plateau_state):
        self.log.append(f"save {epoch}/{step}")
        super().save(epoch, step, train_sums, plateau_state)


def test_a_steps_sums_are_read_once_the_next_step_is_under_way_and_all_before_a_checkpoint_or_total(stop_request):
    backend, observer = GpuLikeBackend(steps_per_epoch=4), Observer()
    loop.fit(rules(epochs=2, checkpoint_every=stop.Schedule(3, "steps")), backend, observer, stop_request)
    assert backend.log[:14] == [
        "step 1", "step 2", "read 1", "step 3", "read 2", "read 3", "checkpoint_train_sums", "save 0/3",
        "step 4", "read 4", "train_sums", "step 5", "step 6", "read 5"]
    numbers = Observer()
    loop.fit(rules(epochs=2), NumbersBackend(steps_per_epoch=4), numbers, stop_request)
    assert observer.epochs == numbers.epochs   # the same totals as sums read at once
    diverging = GpuLikeBackend(losses=lambda step: math.nan if step == 7 else 1.0)
    with pytest.raises(FloatingPointError, match=r"^the training loss is nan at step 2 of epoch 2 \(global step 7\)"):
        loop.fit(rules(), diverging, Observer(), stop_request)
    assert diverging.log[-2:] == ["step 8", "read 7"]   # found on reading, one step on, naming its step


def test_run_finishes_and_reports_a_job_reports_a_stopped_one_and_leaves_a_failed_one(stop_request):
    finished, observer = [], Observer()
    assert loop.run(rules(), NumbersBackend(), observer, stop_request, loop.Resume(), finished.append) == 0
    assert finished == [0.75] and observer.closed
    finished, observer = [], Observer()
    code = loop.run(rules(), NumbersBackend(steps_per_epoch=20, stop_at=13), observer, stop_request, loop.Resume(),
                    finished.append)
    assert code == 128 + signal.SIGTERM and finished == [] and observer.closed    # no model saved, the report kept
    observer = Observer()
    with pytest.raises(FloatingPointError):
        loop.run(rules(), NumbersBackend(losses=lambda step: math.nan), observer, stop_request, loop.Resume(),
                 finished.append)
    assert finished == [] and not observer.closed


def test_emit_digest_prints_one_line_equal_for_equal_weights(capsys):
    loop.emit_digest(1, 2, [np.arange(3, dtype=np.float32)])
    loop.emit_digest(0, 2, [np.arange(3, dtype=np.float32)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("rank=1 world_size=2 final_weights_sha256=")
    assert lines[0].split("=")[-1] == lines[1].split("=")[-1]
