"""A8: the built-in PyTorch trainer's throughput against a bare training loop (issue #19 item 7).

Per case, the same model, data, batch size and optimizer on one process pinned to one core, one
intra-op thread, one DALI thread:

- ``trainer``: ``train`` with ``builtin:pytorch`` and no distribution (``dtc_train.pytorch_single``
  since 2026-11-27, the Horovod trainer on one rank before: the loop's stop agreement, loss
  read-back and non-finite check, the learning-rate schedule, progress lines, system metrics,
  TensorBoard, a checkpoint and validation after every epoch); its own ``samples_per_second``
  (training steps only).
- ``trainer-no-stall-rule``: the same with the stall rule off (``sagemaker_stall_timeout_s=0``):
  what watching a healthy job for stalls costs it (issue #41 item 4: a thread polling once a
  second, a psutil walk of the job's processes, stdout through a pipe).
- ``horovod-1-rank``, ``ddp-1-rank``: the data-parallel trainers on one rank under their launchers
  (``mpi`` with one process per host, ``torch_distributed`` with one): what Horovod
  (``DistributedOptimizer``, its background thread) and DDP (its gradient buckets' allreduce over
  Gloo with nobody else) add to the same loop, reported against the bare loop without a target.
- ``bare-loop``: ``programs/bare_loop.py``: zero_grad, forward, loss, backward, step on the same
  DALI pipeline, timed per epoch.
- ``bare-loop-ddp``: the same loop with its model in ``DistributedDataParallel`` on a Gloo group
  of one (``--wrap ddp``): DDP's own cost, so that ``ddp-1-rank`` against it is the DDP
  trainer's own.

Each: the median over epochs 2..N. The overhead is 1 - trainer / bare loop (target <= 3 %). Cases:
``digits-cnn`` (the main job's model: 8 x 8 grayscale, tiny steps, so fixed per-step costs weigh
most) and ``shufflenet`` (ShuffleNet V2 x0.5 on the 64 x 64 photographs, a torchvision
architecture's steps).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import scaling

BARE_LOOP = Path(__file__).resolve().parent / "programs" / "bare_loop.py"
# case -> (model hyperparameters, data)
CASES = {
    "digits-cnn": ({}, "digits"),
    "shufflenet": (scaling.SHUFFLENET, "photos"),
}
# variant -> its sagemaker_* hyperparameters: no distribution, then each data-parallel trainer on
# one rank; mpirun binds to nothing, so the rank keeps the core taskset gave train
TRAINERS = {
    "trainer": {},
    "trainer-no-stall-rule": {"sagemaker_stall_timeout_s": 0},
    "horovod-1-rank": {"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 1,
                       "sagemaker_mpi_custom_mpi_options": "-bind-to none"},
    "ddp-1-rank": {"sagemaker_torch_distributed_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 1},
}
# variant -> the bare loop's extra arguments
BARE_LOOPS = {"bare-loop": [], "bare-loop-ddp": ["--wrap", "ddp"]}
VARIANTS = (*TRAINERS, *BARE_LOOPS)


def run(work: Path, case: str, variant: str, epochs: int) -> float:
    """Training images/s of ``variant`` on ``case``, median over epochs 2..``epochs``.

    Raises:
        RuntimeError: the run failed or measured fewer epochs than asked.
    """
    model, data = CASES[case]
    hyperparameters = {"sagemaker_program": "builtin:pytorch", "epochs": epochs, "dali-threads": 1, **model,
                       **TRAINERS.get(variant, {})}
    root = scaling.job_root(work, f"a8-{case}-{variant}", hyperparameters, data)
    what = f"A8 {case} {variant}"
    if variant in TRAINERS:
        return scaling.run_trainer(root, 1, epochs, what)
    argv = [sys.executable, str(BARE_LOOP), "--epochs", str(epochs), "--dali-threads", "1", *BARE_LOOPS[variant],
            *(arg for key, value in model.items() for arg in (f"--{key}", str(value)))]
    done = subprocess.run(scaling.pinned(1, argv), env={**os.environ, "SAGEMAKER_BASE_DIR": str(root)},
                          capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    rates = [line["images_per_s"] for line in map(json.loads, done.stdout.splitlines()) if line["epoch"] > 1]
    return scaling.median_rate(rates, epochs, what, done.stdout + done.stderr)
