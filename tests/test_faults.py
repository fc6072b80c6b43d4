"""Dead ranks (issue #10): a rank killed mid-epoch (DTC_FAULT, dtc_train.fault: what a crash,
`kill -9` or the OOM killer does) ends the job within seconds, and the failure file's first
line names the rank, its host and the signal, with the out-of-memory hint for SIGKILL. Real
trainers under real mpirun and torchrun; tests/test_cluster.py does the same across hosts and
kills a whole container."""

import json
import os
import re
import time
from datetime import datetime

import pytest

from conftest import processes_of_job, run_train
from dtc_train import fault
from test_trainers_e2e import _job

pytestmark = pytest.mark.e2e
FAULT_LINE = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+) \[rank (\d+)\] DTC_FAULT: ending this rank after step (\d+)")


@pytest.mark.parametrize("text, expected", [
    ("rank=3 step=20", fault.Fault(3, 20)),
    ("rank=0,step=5,signal=segv", fault.Fault(0, 5, fault.signal.SIGSEGV)),
    ("rank=1 step=2 exit=3", fault.Fault(1, 2, None, 3)),
    ("host=algo-2 step=7", fault.Fault(None, 7, host="algo-2")),
])
def test_fault_specs_parse(text, expected):
    assert fault.parse(text) == expected


@pytest.mark.parametrize("text", ["rank=1", "step=3", "rank=1 step=0", "rank=x step=2", "rank=1 step=2 signal=NOPE",
                                  "rank=1 step=2 signal=KILL exit=1", "rank=1 step=2 host=algo-2",
                                  "host=algo-2 step=3 signal=TERM", "host=algo-2"])
def test_a_bad_fault_spec_is_refused_naming_the_variable(text):
    with pytest.raises(ValueError, match="^DTC_FAULT="):
        fault.parse(text)


@pytest.mark.parametrize("strategy", ["mpi", "torch_distributed"])
def test_a_rank_killed_mid_epoch_ends_the_job_naming_rank_host_and_signal(strategy, make_job, digits_channels):
    root = _job(make_job, digits_channels, "pytorch")
    config = root / "input" / "config" / "hyperparameters.json"
    hyperparameters = json.loads(config.read_text())
    hyperparameters["epochs"] = "4"
    if strategy == "torch_distributed":
        hyperparameters.pop("sagemaker_mpi_enabled")
        hyperparameters["sagemaker_torch_distributed_enabled"] = "true"
    config.write_text(json.dumps(hyperparameters))

    result = run_train(root, env={"DTC_FAULT": "rank=1 step=30 signal=KILL"}, timeout_s=300)
    ended = time.time()
    assert result.returncode != 0 and not result.succeeded
    first_line = result.failure.splitlines()[0]
    host = "algo-1" if strategy == "mpi" else "localhost"      # torchrun names a single host "localhost"
    assert first_line == (f"rank 1 on host {host} was killed by SIGKILL (SIGKILL is what the kernel's "
                          "out-of-memory killer sends: check the instance's memory)"), result.failure[:2000]
    [(stamp, rank, step)] = FAULT_LINE.findall(result.stderr)
    assert (rank, step) == ("1", "30")
    killed = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
    assert ended - killed < 60, f"the job took {ended - killed:.0f} s to end after the rank died"
    assert not (root / "model" / "model.pth").exists()          # no model from a job that failed
    assert os.path.exists(root / "output" / "failure")
    assert processes_of_job(root) == []                          # no rank, launcher or DALI worker left behind
