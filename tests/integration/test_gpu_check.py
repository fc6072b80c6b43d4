"""`make gpu-check` proves the GPU runtime only where there is a GPU: without one it checks
nothing and fails, saying so (#21: it used to exit 0 with every check skipped)."""

import subprocess

import pytest
from conftest import gpu_available

from helpers import REPO


@pytest.mark.skipif(gpu_available(), reason="this machine has a GPU: make gpu-check runs the checks here")
def test_make_gpu_check_without_a_gpu_fails_saying_nothing_was_checked():
    done = subprocess.run(["make", "-s", "gpu-check"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "[gpu-check] error: no NVIDIA GPU is visible here (nvidia-smi lists none): nothing was checked." \
        in done.stderr.splitlines()
