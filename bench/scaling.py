"""A3: weak scaling of the built-in trainers from 1 to 2 ranks on one host.

Each case runs ``train`` with a built-in trainer on the digits channels at a fixed per-rank
batch (the trainers' ``batch-size`` is per rank), 1 rank pinned to one core, then 2 ranks of one
thread each (MPI ranks bound to a core each). Throughput is training images per second over the
epochs after the first (the first pays for start-up, graph tracing and DALI's pipeline build),
from the trainers' own ``epoch_seconds``. Efficiency = throughput(2) / (2 x throughput(1)); on a
2-core machine its ceiling is 1.0 only if communication were free. ``horovod-pytorch-polling`` is
``horovod-pytorch`` with OpenMPI's default wait (``-mca mpi_yield_when_idle 0``: a rank waiting in
MPI spins on its core) instead of the launch plan's CPU default (yield the core), measured in the
same run as its baseline.
"""

import os
import re
import subprocess
from pathlib import Path

EPOCH = re.compile(r"epoch=(\d+)/\d+ .*?epoch_seconds=([0-9.]+)")
TRAINING_IMAGES = 1437   # dtc_train.digits: the fixed stratified training split

CASES = {
    "horovod-pytorch": ("builtin:pytorch", {"sagemaker_mpi_enabled": True}),
    "ddp-pytorch": ("builtin:pytorch", {"sagemaker_torch_distributed_enabled": True}),
    "horovod-tensorflow": ("builtin:tensorflow", {"sagemaker_mpi_enabled": True}),
    # the baseline of the launch plan's CPU default (mpi_yield_when_idle 1, dtc_entrypoint.launch_mpi):
    # OpenMPI's own, a rank waiting in MPI spins on its core
    "horovod-pytorch-polling": ("builtin:pytorch", {"sagemaker_mpi_enabled": True}),
}
MPI_OPTIONS = "-bind-to core -map-by core"
EXTRA_MPI_OPTIONS = {"horovod-pytorch-polling": " -mca mpi_yield_when_idle 0"}


def run_case(work: Path, case: str, ranks: int, epochs: int) -> float:
    """Training images per second of ``case`` on ``ranks`` ranks (median over epochs 2..epochs).

    Raises:
        RuntimeError: the job failed or printed fewer epochs than asked.
    """
    from dtc_local import job_tree
    from dtc_train import digits

    program, flags = CASES[case]
    root = work / f"a3-{case}-{ranks}" / "opt" / "ml"
    hyperparameters = {"sagemaker_program": program, "sagemaker_mpi_num_of_processes_per_host": ranks,
                       "epochs": epochs, "dali-threads": 1, **flags}
    if "sagemaker_mpi_enabled" in flags:
        hyperparameters["sagemaker_mpi_custom_mpi_options"] = MPI_OPTIONS + EXTRA_MPI_OPTIONS.get(case, "")
    job_tree.write(str(root), hyperparameters=hyperparameters, channels=("training", "validation"))
    digits.export(str(root / "input" / "data"))
    argv = ["train"] if ranks > 1 else ["taskset", "-c", str(sorted(os.sched_getaffinity(0))[0]), "train"]
    done = subprocess.run(argv, env={**os.environ, "SAGEMAKER_BASE_DIR": str(root)}, capture_output=True,
                          text=True, timeout=1800, stdin=subprocess.DEVNULL)
    seconds = [float(s) for e, s in EPOCH.findall(done.stdout + done.stderr) if int(e) > 1]
    if done.returncode != 0 or len(seconds) < epochs - 1:
        raise RuntimeError(f"A3 {case} on {ranks} ranks failed ({done.returncode}):\n{done.stderr[-3000:]}")
    seconds.sort()
    return TRAINING_IMAGES / seconds[len(seconds) // 2]
