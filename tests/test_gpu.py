"""GPU checks: skipped without an NVIDIA GPU (CI has none); run them where one is present."""

import subprocess
import sys

import pytest

from conftest import run_train
from test_trainers_e2e import _job

pytestmark = pytest.mark.gpu


def test_horovod_nccl_allreduce_on_one_gpu(tmp_path):
    code = ("import horovod.torch as hvd, torch; hvd.init(); "
            "x = torch.arange(4., device='cuda'); y = hvd.allreduce(x, op=hvd.Sum); "
            "assert y.is_cuda and y.tolist() == [0., 1., 2., 3.], y; "
            "from horovod.torch import nccl_built; assert nccl_built(); print('ok')")
    done = subprocess.run(["mpirun", "-np", "1", sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "ok" in done.stdout, done.stdout + done.stderr


def test_pytorch_trainer_decodes_on_the_gpu(make_job, digits_channels):
    root = _job(make_job, digits_channels, "pytorch", processes_per_host=1)
    result = run_train(root)
    assert result.returncode == 0, result.output[-4000:]
    assert "DALI decodes on gpu" in result.output
