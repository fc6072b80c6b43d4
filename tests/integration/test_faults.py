"""Dead ranks (issue #10): a rank killed mid-epoch (DTC_FAULT, dtc_train.fault: what a crash,
`kill -9` or the OOM killer does) ends the job within seconds, and the failure file's first
line names the rank, its host and the signal, with the out-of-memory hint for SIGKILL. Real
trainers under real mpirun and torchrun; tests/cluster/test_cluster.py does the same across hosts and
kills a whole container."""

import os
import time
from datetime import datetime

import pytest

from helpers import FAULT_LINE, STRATEGIES, digits_job, processes_of_job, run_train

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("case", ["mpi-pytorch", "torchrun-ddp"])
def test_a_rank_killed_mid_epoch_ends_the_job_naming_rank_host_and_signal(case, digits_channels, tmp_path):
    root = digits_job(tmp_path, digits_channels, {**STRATEGIES[case].hyperparameters(), "epochs": 4})

    result = run_train(root, env={"DTC_FAULT": "rank=1 step=30 signal=KILL"}, timeout_s=300)
    ended = time.time()
    assert result.returncode != 0 and not result.succeeded
    first_line = result.failure.splitlines()[0]
    host = "algo-1" if case == "mpi-pytorch" else "localhost"      # torchrun names a single host "localhost"
    assert first_line == (f"rank 1 on host {host} was killed by SIGKILL (SIGKILL is what the kernel's "
                          "out-of-memory killer sends: check the instance's memory)"), result.failure[:2000]
    [(stamp, rank, step)] = FAULT_LINE.findall(result.stderr)
    assert (rank, step) == ("1", "30")
    killed = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
    assert ended - killed < 60, f"the job took {ended - killed:.0f} s to end after the rank died"
    assert not (root / "model" / "model.pth").exists()          # no model from a job that failed
    assert os.path.exists(root / "output" / "failure")
    assert processes_of_job(root) == []                          # no rank, launcher or DALI worker left behind
