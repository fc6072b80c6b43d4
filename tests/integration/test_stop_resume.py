"""Stop and resume (issue #10): SageMaker stops a job with SIGTERM to the container (a stop,
MaxRuntime, a managed-spot interruption) and kills it 120 s later; a restart finds
/opt/ml/checkpoints restored.

Each built-in trainer, under its real launcher (mpirun + Horovod, torchrun + DDP,
MultiWorkerMirrored, the parameter-server chief with its servers), is sent SIGTERM at a random
step after its first epoch and before its last, held there until the signal comes (the seed is
printed; a stop during start-up is tested apart; the parameter-server trainer, whose chief holds
at no step, at a random moment). It must exit 143 well within the grace period, say it was
stopped, and leave a checkpoint of the step it had reached (none if it had not trained yet).
Started again on the same tree it resumes at that step and ends where an uninterrupted run ends:
with bit-identical weights, the input order being restored exactly (DALI checkpoints for
PyTorch; per-epoch inputs with the done steps skipped for the Keras trainers; one seeded stream
with the done batches skipped for the parameter-server trainer, whose one worker runs the
scheduled steps in order).
"""

import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest

from dtc_train import stop
from helpers import (
    BIN,
    DIGEST,
    FAULT_LINE,
    METRIC,
    PROGRESS,
    RESUMING,
    STRATEGIES,
    checkpoint_position,
    digits_job,
    job_tree_at,
    own_ports,
    run_train,
    train_env,
)

pytestmark = pytest.mark.e2e
EPOCH_SECONDS = re.compile(r"epoch_seconds=([0-9.]+)")
# how long rank 0 holds at the step a job is stopped after (DTC_FAULT stall=): SIGTERM comes
# within it, however slow the machine
HOLD_S = 10
EPOCHS = 4
# every strategy's sagemaker_* keys, and builtin:pytorch with no distribution (dtc_train.pytorch_single)
CASES = {**{case: strategy.hyperparameters() for case, strategy in STRATEGIES.items()},
         "one-process-pytorch": {"sagemaker_program": "builtin:pytorch"}}


def job(case, where, digits_channels, **hyperparameters):
    """The case ``case`` (CASES) on this host, over the digits channels, for EPOCHS."""
    return digits_job(where, digits_channels, {**CASES[case], "epochs": EPOCHS, **hyperparameters})


def stop_at(root, delay_s: float | Callable[[list[float]], float], after: re.Pattern | None = None, nth: int = 1,
            env: dict | None = None) -> tuple[int, float, str]:
    """Starts `train` on ``root`` (with ``env`` added) and sends it SIGTERM (as SageMaker does to
    the container's PID 1) ``delay_s`` seconds after the start, or after the ``nth`` line
    matching ``after``; waits. ``delay_s`` may be a function of the monotonic times (s) of the
    first ``nth`` matching lines. Returns (exit code, seconds from signal to exit, log)."""
    train = subprocess.Popen([str(BIN / "train")], env=train_env(root, {**own_ports(), **(env or {})}),
                             stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    lines: list[str] = []
    matched_at: list[float] = []
    seen = threading.Event()

    def read():
        for line in train.stdout:
            lines.append(line)
            if after is not None and after.search(line):
                matched_at.append(time.monotonic())
                if len(matched_at) == nth:
                    seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    if after is not None:
        assert seen.wait(timeout=300), "".join(lines)[-3000:]
    time.sleep(delay_s(matched_at[:nth]) if callable(delay_s) else delay_s)
    signalled = time.monotonic()
    train.send_signal(signal.SIGTERM)
    code = train.wait(timeout=120)
    took = time.monotonic() - signalled
    reader.join(timeout=10)
    return code, took, "".join(lines)


def final(result_stdout: str) -> tuple[float, set[str]]:
    accuracies = METRIC.findall(result_stdout)
    return float(accuracies[-1][2]), {digest for _, _, digest in DIGEST.findall(result_stdout)}


@pytest.mark.parametrize("case", list(STRATEGIES))
def test_a_job_stopped_at_a_random_moment_resumes_where_it_stopped(case, digits_channels, tmp_path):
    check_stop_and_resume(case, digits_channels, tmp_path)


@pytest.mark.parametrize("case", ["torchrun-ddp", "mpi-tensorflow", "multi-worker-mirrored", "parameter-server"])
def test_a_job_accumulating_gradients_stopped_at_a_random_moment_resumes_where_it_stopped(case, digits_channels,
                                                                                          tmp_path):
    """Steps of 2 batches each (gradient-accumulation-steps) under DDP, under Horovod with
    tf-keras (backward_passes_per_step), under MultiWorkerMirroredStrategy (the trainer's
    accumulating train functions) and on the parameter server (both batches in one scheduled
    step; the resumed stream skips 2 batches per step done): the stop, the checkpoint and the resumed data position
    fall on optimizer steps, never between a step's batches (PyTorch's Horovod accumulation, proven
    against the larger batch in test_speed_features.py, resumes through the same loop and
    checkpoint as DDP's; its run here took 3.7 minutes of CI). Twice the epochs, so that the job
    takes as many steps as the others and a stop lands before its end, and twice the learning rate
    for twice the samples per step (the linear scaling rule, which the trainer leaves to the user
    under accumulation)."""
    full_log, accuracy = check_stop_and_resume(case, digits_channels, tmp_path, epochs=2 * EPOCHS,
                                               **{"gradient-accumulation-steps": 2, "learning-rate": 0.02})
    if case == "parameter-server":
        assert "gradient accumulation: 2 micro-batches of 32 per optimizer step, all on the worker the step is " \
               "scheduled on (64 samples per step), 22 steps per epoch" in full_log, full_log[-3000:]
    else:
        line = re.search(r"gradient accumulation: 2 micro-batches of 32 per optimizer step on each rank \((\d+) "
                         r"samples per step over (\d+) ranks\), \d+ steps per epoch", full_log)
        assert line and int(line[1]) == 2 * 32 * int(line[2]), full_log[-3000:]
    assert accuracy >= 0.90


def test_a_one_process_pytorch_job_resumes_where_it_stopped_and_under_mpi_from_its_checkpoint(digits_channels,
                                                                                              tmp_path):
    """``builtin:pytorch`` with no distribution runs ``dtc_train.pytorch_single`` (no Horovod, no
    collectives): stopped at a random moment it resumes to the uninterrupted run's weights, as
    every trainer. Its checkpoint is the data-parallel trainers' ``checkpoint.pt``: the finished
    job's tree, run again under mpi on 2 ranks with one epoch more, trains that epoch from it."""
    log, accuracy = check_stop_and_resume("one-process-pytorch", digits_channels, tmp_path)
    assert re.search(r"PyTorch \S+: one process on cpu \(host algo-1\)", log), log[-3000:]
    assert "Horovod" not in log and accuracy >= 0.85, log[-3000:]   # 0.875 after 4 epochs (2026-11-27)

    root = job_tree_at({**STRATEGIES["mpi-pytorch"].hyperparameters(), "epochs": EPOCHS + 1}, tmp_path / "full")
    more = run_train(root)
    assert more.returncode == 0, more.output[-3000:]
    assert tuple(int(v) for v in RESUMING.search(more.output).groups()) == (EPOCHS, 0), more.output[-3000:]
    assert [int(e) for e, *_ in METRIC.findall(more.stdout)] == [EPOCHS + 1], more.output[-3000:]
    final_accuracy, digests = final(more.stdout)
    assert len(digests) == 1 and len(DIGEST.findall(more.stdout)) == 2 and final_accuracy >= 0.85, more.output[-3000:]


def check_stop_and_resume(case: str, digits_channels, tmp_path, epochs: int = EPOCHS,
                          **hyperparameters) -> tuple[str, float]:
    """An uninterrupted run of ``case`` for ``epochs`` with ``hyperparameters``; the same stopped
    by SIGTERM at a random moment after its first epoch (exit 143 within 60 s, a checkpoint,
    nothing half written); resumed at the checkpoint's step, it ends with the uninterrupted run's
    weights. Returns the uninterrupted run's log and final validation accuracy."""
    hyperparameters["epochs"] = epochs
    if case != "parameter-server":
        # a progress line after every optimizer step but an epoch's last (dtc_train.observe): the
        # steps per epoch, read from the uninterrupted run
        hyperparameters["progress-seconds"] = 1e-6
    full = run_train(job(case, tmp_path / "full", digits_channels, **hyperparameters))
    assert full.returncode == 0, full.output[-3000:]
    full_accuracy, full_digests = final(full.stdout)

    # A random step after the first epoch (start-up: test_a_job_stopped_while_starting_exits_at_once)
    # and before the last: rank 0 holds there for HOLD_S (DTC_FAULT stall=, dtc_train.fault), the
    # other ranks wait for it in their next collective, and SIGTERM comes as its line is read.
    # Every rank then stops after the first step from there at which they compare notes
    # (stop.AGREE_EVERY_STEPS), however slow the machine: the checkpoint's position is that
    # step's. (A SIGTERM timed in seconds overshot the job's end twice in CI runs of 2026-11-28,
    # one timed from the uninterrupted run, one from the stopped run's own epoch k, which took
    # 10.4 s where the two after it took 2.3 and 1.4 s; and one sent as rank 0's progress line of
    # a step was read reached the ranks after their last step, here beside a CI run.) The
    # parameter-server trainer's chief schedules its steps on the workers and holds at none: it is
    # stopped after the metric line of a random epoch k (2 <= k <= epochs - 2), a random part (up
    # to 3/4) of its fastest epoch in either run later.
    seed = random.randrange(1 << 30)
    chance = random.Random(seed)
    root = job(case, tmp_path / "stopped", digits_channels, **hyperparameters)
    expected = None
    if case == "parameter-server":
        after_epoch, fraction = chance.randint(2, epochs - 2), chance.uniform(0.0, 0.75)
        fastest_s = min(float(s) for s in EPOCH_SECONDS.findall(full.stdout))
        print(f"{case}: SIGTERM after epoch {after_epoch}, {fraction:.2f} of the fastest epoch's time later "
              f"(random seed {seed})")
        code, took_s, log = stop_at(root, lambda metric_s: fraction * min(fastest_s, metric_s[-1] - metric_s[-2]),
                                    after=METRIC, nth=after_epoch)
    else:
        [steps] = {int(total) for *_, total, _, _ in PROGRESS.findall(full.stdout)}
        held = (chance.randint(2, epochs - 1) - 1) * steps + chance.randint(1, steps - 1)   # a global step
        # the ranks compare notes every AGREE_EVERY_STEPS steps: they stop after the next such step
        stops = -(-held // stop.AGREE_EVERY_STEPS) * stop.AGREE_EVERY_STEPS
        expected = ((stops - 1) // steps, stops - (stops - 1) // steps * steps)
        print(f"{case}: SIGTERM while rank 0 holds after step {held} of {epochs} x {steps}; the ranks stop after "
              f"step {stops} (random seed {seed})")
        code, took_s, log = stop_at(root, 0.0, after=FAULT_LINE,
                                    env={"DTC_FAULT": f"rank=0 step={held} stall={HOLD_S}"})
    assert code == 128 + signal.SIGTERM, log[-3000:]
    assert took_s < 60, f"{took_s:.0f} s from SIGTERM to exit"
    assert (root / "output" / "failure").read_text().splitlines()[0].endswith("was stopped by SIGTERM"), log[-3000:]
    assert not (root / "output" / "success").exists() and not any((root / "model").iterdir()), log[-3000:]
    position = checkpoint_position(root)
    assert expected is None or position == expected, (position, expected, log[-3000:])
    staged = [p for p in root.rglob("*") if p.name.startswith(".tmp-") or p.name.endswith(".staging")]
    assert not staged, staged                                            # no half-written file anywhere
    print(f"{case}: stopped {took_s:.1f} s after the signal; checkpoint position {position}")

    resumed = run_train(root)
    assert resumed.returncode == 0 and resumed.succeeded, resumed.output[-3000:]
    if position:
        epoch, step = (int(v) for v in RESUMING.search(resumed.output).groups())
        assert (epoch, step) == position
        # the epochs it reports: from the one under way, one stopped after its last step included
        # (every trainer runs dtc_train.loop)
        assert sorted(int(e) for e, *_ in METRIC.findall(resumed.stdout)) == \
            list(range(epoch + 1, epochs + 1))
    accuracy, digests = final(resumed.stdout)
    assert digests == full_digests, "the resumed job's weights differ from an uninterrupted run's"
    assert accuracy == full_accuracy
    return full.output, full_accuracy


def test_a_checkpoint_schedule_in_steps_is_kept_and_a_bad_one_is_refused(digits_channels, tmp_path):
    root = job("mpi-pytorch", tmp_path / "steps", digits_channels, **{"checkpoint-every": "7steps", "epochs": 1})
    result = run_train(root)
    assert result.returncode == 0, result.output[-3000:]
    assert checkpoint_position(root) == (1, 0)

    bad = job("mpi-pytorch", tmp_path / "bad", digits_channels, **{"checkpoint-every": "often"})
    refused = run_train(bad, timeout_s=120)
    assert refused.returncode != 0
    assert "checkpoint-every='often'" in refused.failure


def test_a_job_stopped_while_starting_exits_at_once_and_starts_over(digits_channels, tmp_path):
    """SIGTERM before the first step (imports, MPI start-up, data listing): nothing to save, so the
    ranks exit at once (not after a step), and a restart starts from the beginning."""
    root = job("mpi-pytorch", tmp_path / "job", digits_channels, epochs=1)
    # 1 s after the entrypoint started mpirun: MPI, Python and framework start-up take longer (a
    # fixed delay from the start landed before the launch on a loaded machine)
    code, took_s, log = stop_at(root, 1.0, after=re.compile(r"running: .*mpirun"))
    assert code == 128 + signal.SIGTERM and took_s < 15, (code, took_s, log[-3000:])
    assert (root / "output" / "failure").read_text().splitlines()[0] == "builtin:pytorch was stopped by SIGTERM"
    assert checkpoint_position(root) is None
    restarted = run_train(root)
    assert restarted.returncode == 0 and "resuming" not in restarted.output, restarted.output[-3000:]
    assert checkpoint_position(root) == (1, 0)


def test_a_stop_before_training_begins_exits_at_once_and_after_it_is_only_noted():
    program = ("import os, signal, sys, time\n"
               "from dtc_train import stop\n"
               "request = stop.StopRequest()\n"
               "if sys.argv[1] == 'training':\n"
               "    request.training_begins()\n"
               "os.kill(os.getpid(), signal.SIGTERM)\n"
               "time.sleep(0.2)\n"
               "print(request.signum)\n")
    before = subprocess.run([sys.executable, "-c", program, "starting"], capture_output=True, text=True, timeout=60)
    assert before.returncode == 143 and "before training began: nothing to save" in before.stderr
    during = subprocess.run([sys.executable, "-c", program, "training"], capture_output=True, text=True, timeout=60)
    assert during.returncode == 0 and during.stdout.strip() == str(int(signal.SIGTERM))
