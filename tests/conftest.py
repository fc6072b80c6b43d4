"""Shared fixtures: /opt/ml job trees and running the real `train` command on them."""

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from dtc_local import job_tree

REPO = Path(__file__).resolve().parents[1]
PROGRAMS = Path(__file__).resolve().parent / "programs"
BIN = Path(sys.executable).parent


def gpu_available() -> bool:
    return shutil.which("nvidia-smi") is not None and subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True).returncode == 0


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU on this machine (runs on the lent GPU machine)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@dataclass
class TrainResult:
    returncode: int
    stdout: str
    stderr: str
    base_dir: Path

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    @property
    def failure(self) -> str | None:
        path = self.base_dir / "output" / "failure"
        return path.read_text() if path.exists() else None

    @property
    def succeeded(self) -> bool:
        return (self.base_dir / "output" / "success").exists()


def run_train(base_dir: Path, *args: str, env: dict | None = None, timeout_s: float = 900) -> TrainResult:
    """Runs the installed `train` command against ``base_dir`` like a container would."""
    full_env = {**os.environ, "SAGEMAKER_BASE_DIR": str(base_dir), "PATH": f"{BIN}:{os.environ['PATH']}"}
    full_env.pop("SAGEMAKER_PROGRAM", None)
    full_env.update(env or {})
    done = subprocess.run([str(BIN / "train"), *args], env=full_env, capture_output=True, text=True,
                          timeout=timeout_s, stdin=subprocess.DEVNULL)
    return TrainResult(done.returncode, done.stdout, done.stderr, base_dir)


def processes_of_job(base_dir: Path) -> list[str]:
    """Processes still running for the job at ``base_dir`` (every process ``train`` starts has
    its ``SAGEMAKER_BASE_DIR``), as ``pid cmdline`` strings."""
    import psutil  # noqa: PLC0415

    found = []
    for process in psutil.process_iter():
        try:
            if process.pid != os.getpid() and process.environ().get("SAGEMAKER_BASE_DIR") == str(base_dir):
                found.append(f"{process.pid} {' '.join(process.cmdline())}")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


@pytest.fixture
def make_job(tmp_path):
    """Writes a job tree: make_job(hyperparameters, encoding=..., hosts=..., channels=...)."""

    def make(hyperparameters: dict, **kwargs) -> Path:
        root = tmp_path / "opt" / "ml"
        job_tree.write(str(root), hyperparameters=hyperparameters, **kwargs)
        return root

    return make


@pytest.fixture
def source_dir(tmp_path) -> Path:
    return tmp_path / "source"


@pytest.fixture(scope="session")
def digits_channels(tmp_path_factory) -> Path:
    """The digits data set exported once per session: <dir>/training, <dir>/validation."""
    from dtc_train import digits

    root = tmp_path_factory.mktemp("digits")
    digits.export(str(root))
    return root


def copy_programs(source_dir: Path, *names: str) -> Path:
    """A submit directory holding the named test programs (tests/programs/)."""
    source_dir.mkdir(exist_ok=True)
    for name in names:
        shutil.copy(PROGRAMS / name, source_dir / name)
    return source_dir


def add_stray_files(channel: Path) -> list[str]:
    """Puts what S3 channels often hold besides images into an ImageFolder channel: a _SUCCESS
    marker and a manifest at the top, .DS_Store and a README in a class folder, a hidden
    folder. Returns their paths relative to the channel."""
    first_class = sorted(p for p in channel.iterdir() if p.is_dir())[0]
    strays = {"_SUCCESS": "", "manifest.json": "[]", f"{first_class.name}/.DS_Store": "\0\0",
              f"{first_class.name}/README.txt": "not an image", ".ipynb_checkpoints/x-checkpoint.png": "junk"}
    for path, text in strays.items():
        (channel / path).parent.mkdir(parents=True, exist_ok=True)
        (channel / path).write_text(text)
    return sorted(strays)


def read_json(path: Path):
    return json.loads(Path(path).read_text())
