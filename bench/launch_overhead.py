"""A4 and A5: how long a launcher takes before the user's code runs.

* A4, dispatch: ``train`` start -> the first line of the user script (``programs/first_line.py``),
  as one process and as 2 MPI ranks, on one ``/opt/ml`` tree: this image's ``train`` against the
  stock sagemaker-training 5.1.4 ``train`` (``sagemaker_training.cli.train``, which this image's
  command shadows) on the same tree, in the same container (host ``algo-1`` resolves to loopback,
  as the toolkit needs).
  Both ``train`` runs are timed with the preflight off (the dispatch alone), and once more with it
  on (``ours-single-preflight``, its ``quick`` mode on one CPU host: the seconds it adds).
* A5, distributed start: ``train`` start -> every rank past its first barrier
  (``programs/barrier.py``: mpi4py's under mpirun, a gloo process group's under torchrun), against
  the bare launcher on the same program (``mpirun -np 2``, ``torchrun --nproc_per_node 2``).

Times are wall-clock seconds from just before the command starts to the latest stamp a rank
writes (its own ``time.time()``), so the launcher's whole start-up counts, interpreter and
imports included.
"""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

PROGRAMS = Path(__file__).resolve().parent / "programs"
STOCK_TRAIN = [sys.executable, "-c", "from sagemaker_training.cli.train import main; main()"]
TIMEOUT_S = 300


def time_to_stamps(argv: list[str], env: dict[str, str], stamp_dir: Path, ranks: int) -> float:
    """Runs ``argv`` to completion; returns seconds from its start to the last rank's stamp.

    Raises:
        RuntimeError: the command failed or fewer than ``ranks`` stamps were written.
    """
    shutil.rmtree(stamp_dir, ignore_errors=True)
    stamp_dir.mkdir(parents=True)
    log_path = stamp_dir.parent / "launch.log"
    # Output to a file, not a pipe, and the command in its own session: the stock toolkit leaves
    # the sshd it starts for MPI running, which would hold a pipe open; it is killed afterwards.
    with open(log_path, "w") as log:
        started = time.time()
        proc = subprocess.Popen(argv, env={**env, "BENCH_STAMP_DIR": str(stamp_dir)}, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            returncode = proc.wait(timeout=TIMEOUT_S)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    stamps = [float(p.read_text()) for p in stamp_dir.glob("stamp-*")]
    if returncode != 0 or len(stamps) != ranks:
        raise RuntimeError(f"{argv[:3]} exited {returncode} with {len(stamps)}/{ranks} stamps:\n"
                           f"{log_path.read_text()[-4000:]}")
    return max(stamps) - started


def job_tree(root: Path, program: str, hyperparameters: dict) -> Path:
    """An /opt/ml tree for one host ``algo-1`` whose code directory holds ``program``."""
    from dtc_local import job_tree as trees

    trees.write(str(root), hyperparameters={"sagemaker_program": program,
                                            "sagemaker_submit_directory": "/opt/ml/code", **hyperparameters})
    shutil.copy(PROGRAMS / program, root / "code" / program)
    return root


def dispatch_cases(work: Path) -> dict[str, tuple[list[str], dict, int]]:
    """A4: variant -> (argv, env, ranks)."""
    mpi = {"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2}
    single_tree = job_tree(work / "single" / "opt" / "ml", "first_line.py", {})
    mpi_tree = job_tree(work / "mpi" / "opt" / "ml", "first_line.py", mpi)
    base = {**os.environ, "PYTHONUNBUFFERED": "1", "DTC_PREFLIGHT": "off"}
    return {
        "ours-single": (["train"], {**base, "SAGEMAKER_BASE_DIR": str(single_tree)}, 1),
        "ours-single-preflight": (["train"], {**base, "SAGEMAKER_BASE_DIR": str(single_tree), "DTC_PREFLIGHT": "quick"},
                                  1),
        "stock-single": (STOCK_TRAIN, {**base, "SAGEMAKER_BASE_DIR": str(single_tree)}, 1),
        "ours-mpi2": (["train"], {**base, "SAGEMAKER_BASE_DIR": str(mpi_tree)}, 2),
        "stock-mpi2": (STOCK_TRAIN, {**base, "SAGEMAKER_BASE_DIR": str(mpi_tree)}, 2),
    }


def distributed_start_cases(work: Path) -> dict[str, tuple[list[str], dict, int]]:
    """A5: variant -> (argv, env, ranks); each ``ours-*`` has a ``bare-*`` baseline (the preflight off)."""
    base = {**os.environ, "PYTHONUNBUFFERED": "1", "DTC_PREFLIGHT": "off"}
    program = str(PROGRAMS / "barrier.py")
    mpi_tree = job_tree(work / "a5-mpi" / "opt" / "ml", "barrier.py",
                        {"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2})
    torch_tree = job_tree(work / "a5-torch" / "opt" / "ml", "barrier.py",
                          {"sagemaker_torch_distributed_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2})
    single_tree = job_tree(work / "a5-single" / "opt" / "ml", "barrier.py", {})
    return {
        "ours-single": (["train"], {**base, "SAGEMAKER_BASE_DIR": str(single_tree)}, 1),
        "bare-single": ([sys.executable, program], base, 1),
        "ours-mpi": (["train"], {**base, "SAGEMAKER_BASE_DIR": str(mpi_tree)}, 2),
        "bare-mpi": (["mpirun", "-np", "2", "-bind-to", "none", "-x", "BENCH_STAMP_DIR", sys.executable, program],
                     base, 2),
        "ours-torchrun": (["train"], {**base, "SAGEMAKER_BASE_DIR": str(torch_tree)}, 2),
        "bare-torchrun": ([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                           "29511", program], base, 2),
    }
