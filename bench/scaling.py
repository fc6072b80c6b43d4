"""A3: weak scaling of the built-in trainers from 1 to 2 ranks on one host; the job set-up and
throughput reading A8 (bench/trainer_overhead.py) shares.

Each case runs ``train`` with a built-in trainer at a fixed per-rank batch (the trainers'
``batch-size`` is per rank), 1 rank pinned to one core, then 2 ranks of one thread each (MPI ranks
bound to a core each). The digits cases train the digits CNN on the digits channels;
``horovod-pytorch-shufflenet`` trains a torchvision architecture (ShuffleNet V2 x0.5, 64 x 64 RGB,
random resized crops and flips) on the photographs' channels (dtc_train.photos). Throughput is the
trainers' own ``samples_per_second`` (training images per second over the epoch's training steps,
every rank's, validation excluded), median over the epochs after the first (the first pays for
start-up, graph tracing and DALI's pipeline build). Efficiency = throughput(2) / (2 x
throughput(1)); on a 2-core machine its ceiling is 1.0 only if communication were free.
``horovod-pytorch-polling`` is ``horovod-pytorch`` with OpenMPI's default wait (``-mca
mpi_yield_when_idle 0``: a rank waiting in MPI spins on its core) instead of the launch plan's CPU
default (yield the core), measured in the same run as its baseline.
"""

import importlib.util
import os
import re
import subprocess
from pathlib import Path

RATE = re.compile(r"epoch=(\d+)/\d+ .*?samples_per_second=([0-9.]+)")
SHUFFLENET = {"model": "shufflenet_v2_x0_5", "image-size": 64}

# case -> (program, hyperparameters, data: digits | photos)
CASES = {
    "horovod-pytorch": ("builtin:pytorch", {"sagemaker_mpi_enabled": True}, "digits"),
    "ddp-pytorch": ("builtin:pytorch", {"sagemaker_torch_distributed_enabled": True}, "digits"),
    "horovod-tensorflow": ("builtin:tensorflow", {"sagemaker_mpi_enabled": True}, "digits"),
    # the baseline of the launch plan's CPU default (mpi_yield_when_idle 1, dtc_entrypoint.launch_mpi):
    # OpenMPI's own, a rank waiting in MPI spins on its core
    "horovod-pytorch-polling": ("builtin:pytorch", {"sagemaker_mpi_enabled": True}, "digits"),
    "horovod-pytorch-shufflenet": ("builtin:pytorch", {"sagemaker_mpi_enabled": True, **SHUFFLENET}, "photos"),
}
NEEDS_TORCHVISION = ("torchvision is not installed in this environment (an image built before 2026-11-27 has none: "
                     "rebuild it with make image, or measure the host's virtual environment with bench/run.py --host)")
MPI_OPTIONS = "-bind-to core -map-by core"
EXTRA_MPI_OPTIONS = {"horovod-pytorch-polling": " -mca mpi_yield_when_idle 0"}


def missing(hyperparameters: dict) -> str | None:
    """Why a case with these hyperparameters cannot run here (a torchvision ``model`` without
    torchvision), or ``None``."""
    if "model" in hyperparameters and importlib.util.find_spec("torchvision") is None:
        return NEEDS_TORCHVISION
    return None


def job_root(work: Path, name: str, hyperparameters: dict, data: str) -> Path:
    """A SageMaker job tree ``work/<name>/opt/ml`` with ``hyperparameters`` and the ``data``
    (``digits`` or ``photos``) set's training and validation channels. Returns its root."""
    from dtc_local import job_tree
    from dtc_train import digits, photos

    root = work / name / "opt" / "ml"
    job_tree.write(str(root), hyperparameters=hyperparameters, channels=("training", "validation"))
    {"digits": digits, "photos": photos}[data].export(str(root / "input" / "data"))
    return root


def pinned(ranks: int, argv: list[str]) -> list[str]:
    """``argv``, pinned to this process's first core when one rank runs it (taskset); 2 ranks
    are bound by their launcher."""
    return argv if ranks > 1 else ["taskset", "-c", str(sorted(os.sched_getaffinity(0))[0]), *argv]


def median_rate(rates: list[float], epochs: int, what: str, output: str) -> float:
    """The median of ``rates`` (images/s of epochs 2..``epochs``).

    Raises:
        RuntimeError: fewer than ``epochs - 1`` rates (the run failed or stopped early).
    """
    if len(rates) < epochs - 1:
        raise RuntimeError(f"{what}: {len(rates)} epochs measured of {epochs - 1}:\n{output[-3000:]}")
    rates = sorted(rates)
    return rates[len(rates) // 2]


def run_trainer(root: Path, ranks: int, epochs: int, what: str) -> float:
    """Runs ``train`` in the job tree ``root``; returns the trainer's training images/s, median
    over epochs 2..``epochs``.

    Raises:
        RuntimeError: the job failed or printed fewer epochs than asked.
    """
    done = subprocess.run(pinned(ranks, ["train"]), env={**os.environ, "SAGEMAKER_BASE_DIR": str(root)},
                          capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL)
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed ({done.returncode}):\n{output[-3000:]}")
    return median_rate([float(r) for e, r in RATE.findall(output) if int(e) > 1], epochs, what, output)


def run_case(work: Path, case: str, ranks: int, epochs: int) -> float:
    """Training images per second of ``case`` on ``ranks`` ranks (median over epochs 2..epochs).

    Raises:
        RuntimeError: the job failed or printed fewer epochs than asked.
    """
    program, flags, data = CASES[case]
    hyperparameters = {"sagemaker_program": program, "sagemaker_mpi_num_of_processes_per_host": ranks,
                       "epochs": epochs, "dali-threads": 1, **flags}
    if "sagemaker_mpi_enabled" in flags:
        hyperparameters["sagemaker_mpi_custom_mpi_options"] = MPI_OPTIONS + EXTRA_MPI_OPTIONS.get(case, "")
    root = job_root(work, f"a3-{case}-{ranks}", hyperparameters, data)
    return run_trainer(root, ranks, epochs, f"A3 {case} on {ranks} ranks")
