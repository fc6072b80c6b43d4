"""The Dockerfile without building it: lint, pins, and the GPU flavor's resolved build."""

import os
import re
import shutil
import subprocess

from conftest import BIN, REPO
from test_install import pins


def test_hadolint_finds_no_errors():
    hadolint = shutil.which("hadolint", path=str(BIN)) or shutil.which("hadolint")
    done = subprocess.run([hadolint, "--failure-threshold", "error", str(REPO / "Dockerfile")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_dockerfile_defaults_equal_the_pins():
    text = (REPO / "Dockerfile").read_text()
    defaults = dict(re.findall(r"^ARG ([A-Z_]+)=(\S+)$", text, re.M))
    pinned = pins()
    checked = {k: v for k, v in defaults.items() if k in pinned}
    assert checked and all(pinned[k] == v for k, v in checked.items()), checked
    assert "nvidia/cuda:" + pinned["CUDA_VERSION"] in defaults["GPU_BUILDER_IMAGE"]


def test_gpu_flavor_dry_run_prints_its_resolved_build():
    done = subprocess.run([str(REPO / "scripts" / "build-image.sh")], capture_output=True, text=True,
                          env={**os.environ, "DRY_RUN": "1", "FLAVOR": "gpu"}, timeout=60)
    assert done.returncode == 0, done.stderr
    command = done.stdout
    pinned = pins()
    for arg in ("FLAVOR=gpu", f"CUDA_VERSION={pinned['CUDA_VERSION']}", f"TORCH_CUDA_INDEX={pinned['TORCH_CUDA_INDEX']}",
                f"GPU_BUILDER_IMAGE={pinned['GPU_BUILDER_IMAGE']}", f"HOROVOD_CUDA_CC_LIST={pinned['HOROVOD_CUDA_CC_LIST']}"):
        assert arg.replace(",", "\\,") in command or arg in command, arg
    assert "TORCH_INDEX_URL=" not in command        # the GPU flavor uses PyTorch's cu12x index
