"""What several test tiers share: paths, the log lines the trainers print, running `train` on a
job tree, the container and local-cluster runners, the checks more than one file asserts, and
the one table of distribution strategies (``STRATEGIES``) every strategy test iterates over.

Test files import from here, never from each other. Fixtures live in tests/conftest.py.
"""

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from dtc_entrypoint.config import JobConfig, MpiConfig, natural_key
from dtc_entrypoint.program import Program
from dtc_local import cluster, job_tree
from dtc_train import system_metrics

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
PROGRAMS = TESTS / "programs"
FIXTURES = TESTS / "fixtures"
BIN = Path(sys.executable).parent
CONTAINER = str(REPO / "scripts" / "container.sh")
HOSTS = ("algo-1", "algo-2")
# Under pytest-xdist each worker runs its two-host clusters under its own name and subnet, so two
# workers' clusters (containers <name>-algo-N, network <name>) never meet.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
CLUSTER = cluster.ClusterJob(image="", name=f"dtc-test-{WORKER}", subnet=f"10.213.{50 + int(WORKER[2:])}.0/24")
IMAGES = {"cpu": os.environ.get("DTC_IMAGE"), "gpu": os.environ.get("DTC_GPU_IMAGE")}
# The image buildspec.yml builds (scripts/release.sh build: dtc:<flavor>). Where the run's image has
# this name, tests/image/test_delivery.py's buildspec run tests it with the in-image suite
# (release.sh test) under podman, and under Docker where the run built a Docker image
# (docker_image): the suite is not run a second time in that engine.
BUILDSPEC_IMAGE = "dtc:cpu"
DOCKER_BUILD_WAIT_S = 2700

# The lines every built-in trainer prints (dtc_train.common): one metric line per epoch, one
# weight digest per rank at the end, rate-limited progress lines within epochs.
METRIC = re.compile(r"epoch=(\d+)/(\d+) .*?val_accuracy=([0-9.]+) val_samples=(\d+)")
DIGEST = re.compile(r"rank=(\d+) world_size=(\d+) final_weights_sha256=([0-9a-f]{64})")
# examples/: each one's metric and weight lines, and example -> (ranks that print identical weights,
# the model file on algo-1, the validation accuracy it reaches on two hosts): tests/cluster/test_examples.py
# (CPU image) and tests/image/test_gpu_image.py (GPU image on CPU)
EPOCH_LINE = re.compile(r"epoch=(\d+)/(\d+) .*?val_accuracy=([0-9.]+)")
WEIGHTS_LINE = re.compile(r"rank=(\d+) world_size=(\d+) weights_sha256=([0-9a-f]{64})")
EXAMPLES = {
    "pytorch_horovod": (4, "model.pt", 0.90),
    "pytorch_ddp": (4, "model.pt", 0.85),
    "keras_horovod": (4, "1/saved_model.pb", 0.90),
    "tensorflow_multiworker": (2, "1/saved_model.pb", 0.90),
    "tensorflow_parameter_server": (0, "1/saved_model.pb", 0.90),
    "independent_models": (0, "algo-1/model.pt", 0.80),
    "deepspeed_zero": (4, "model.pt", 0.90),
}
PROGRESS = re.compile(r"progress epoch=(\d+)/(\d+) step=(\d+)/(\d+) samples_per_second=([0-9.]+) eta_seconds=(\d+)")
RESUMING = re.compile(r"resuming from .*: epoch (\d+)(?: of \d+)? done, (\d+) (?:of \d+ )?steps of epoch \d+ done")
FAULT_LINE = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+) \[rank (\d+)\] "
                        r"DTC_FAULT: (?:ending|stalling) this rank after step (\d+)")
SCALAR_TAGS = {"train/loss", "train/accuracy", "validation/loss", "validation/accuracy",
               "throughput/samples_per_second", "time/epoch_seconds"}
VALIDATION_IMAGES = 360          # the digits validation channel (dtc_train.digits)
SAVED_MODEL = {"pytorch": "model.pth", "tensorflow": "1/saved_model.pb"}
# Hyperparameter values that a shell or a naive encoding would mangle; they must reach programs exactly.
AWKWARD = {
    "spaces": "a b  c",
    "quotes": "it's \"quoted\"",
    "dollar": "$HOME ${PATH} $(id)",
    "semicolon": "x; rm -rf / && echo hi | cat",
    "backtick": "`uname`",
    "newline": "line1\nline2",
    "glob": "*.py",
    "empty": "",
    "dash": "--not-a-flag",
    "unicode": "naïve ✓",
}


# ------------------------------------------------------------------------------ strategies
@dataclass(frozen=True)
class Strategy:
    """One way of training, as every strategy test runs it.

    Attributes:
        distribution: ``dtc_local.cluster.DISTRIBUTIONS`` (the SDK v2 ``distribution`` it stands for).
        framework: ``pytorch`` | ``tensorflow`` (the built-in trainer, ``builtin:<framework>``).
        processes_per_host: ``sagemaker_mpi_num_of_processes_per_host``.
        two_host_world_size: data-parallel ranks on two hosts (the parameter-server layout has one
            worker: the chief trains, the other host serves).
        cluster_epochs: epochs a two-host job runs to reach >= 0.90 validation accuracy.
        lost_master: the start of the worker host's first failure line when the master host dies
            (None: not tested).
        killed_rank: the rank on algo-2 that a rank-kill test kills (None: not tested).
        killed_rank_failure: the start of the master's first failure line then.
    """

    distribution: str
    framework: str
    processes_per_host: int
    two_host_world_size: int
    cluster_epochs: int
    lost_master: str | None = None
    killed_rank: int | None = None
    killed_rank_failure: str | None = None

    @property
    def program(self) -> str:
        return f"builtin:{self.framework}"

    def hyperparameters(self) -> dict[str, object]:
        """hyperparameters.json's ``sagemaker_*`` keys for one host, as SDK v2 writes them (the
        local cluster's own table, ``dtc_local.cluster.distribution_hyperparameters``)."""
        job = cluster.ClusterJob(image="", instance_count=1, processes_per_host=self.processes_per_host,
                                 distribution=self.distribution, program=self.program)
        return {"sagemaker_program": self.program, **cluster.distribution_hyperparameters(job)}

    def cluster_args(self) -> list[str]:
        """``python -m dtc_local.cluster`` flags for this strategy."""
        return ["--distribution", self.distribution, "--processes-per-host", str(self.processes_per_host),
                "--program", self.program]


STRATEGIES = {
    "mpi-pytorch": Strategy(
        "mpi", "pytorch", 2, 4, 10, "host algo-1 stopped answering: mpirun's daemon here lost it and ended rank 2, 3",
        killed_rank=3, killed_rank_failure="rank 3 on host algo-2 was killed by SIGKILL (SIGKILL is what the "
                                           "kernel's out-of-memory killer sends"),
    "mpi-tensorflow": Strategy("mpi", "tensorflow", 2, 4, 10),
    "torchrun-ddp": Strategy(
        "torch_distributed", "pytorch", 2, 4, 10, "host algo-1 stopped answering",
        # the master learns it from torchrun (the connection to its ranks was lost) or from algo-2's
        # train, whichever comes first; either way algo-2's train says why (peers.Presence)
        killed_rank=3, killed_rank_failure="host algo-2 failed: rank 3 on host algo-2 was killed by SIGKILL"),
    "multi-worker-mirrored": Strategy(
        "multi_worker_mirrored_strategy", "tensorflow", 1, 2, 8, "host algo-1 stopped answering: TensorFlow",
        # TensorFlow on the master sees the worker go; algo-2's train says why (peers.Presence)
        killed_rank=1, killed_rank_failure="host algo-2 failed: builtin:tensorflow was killed by SIGKILL"),
    "parameter-server": Strategy(
        "parameter_server", "tensorflow", 1, 1, 6,
        "host algo-1 stopped answering: its parameter server (algo-1:2223) closed"),
}


# ------------------------------------------------------------------------------ train on this host
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


# Ports the tests' servers bind come from below the kernel's ephemeral range
# (/proc/sys/net/ipv4/ip_local_port_range, 32768-60999 by default), from a block of its own for each
# pytest-xdist worker. A port the kernel picks for a bind to port 0 is an ephemeral one, which any
# outgoing connection on the machine may be given as its local port between the pick and the
# server's bind: EADDRINUSE (seen in a CI run of b141d87: tests/integration/test_preflight.py, the
# probe's store on port 43525, taken meanwhile). No connection is ever given a port below the range.
PORT_BASE, PORTS_PER_WORKER = 20000, 1000
EPHEMERAL_LOW = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
_port_offset = 0


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports nothing is bound to now, from this pytest-xdist worker's own block
    below the ephemeral range (above), each tried by binding it on every interface; successive calls
    move on through the block, so a port a finished test's server left in TIME_WAIT is not handed
    out again soon. Raises RuntimeError when the block has none left."""
    global _port_offset
    first = PORT_BASE + int(WORKER[2:]) * PORTS_PER_WORKER
    assert first + PORTS_PER_WORKER <= EPHEMERAL_LOW, f"worker {WORKER}'s ports reach the ephemeral range"
    picked = []
    with contextlib.ExitStack() as held:
        for _ in range(PORTS_PER_WORKER):
            port = first + _port_offset % PORTS_PER_WORKER
            _port_offset += 1
            probe = held.enter_context(socket.socket())
            try:
                probe.bind(("", port))
            except OSError:
                continue
            picked.append(port)
            if len(picked) == count:
                return picked
    raise RuntimeError(f"no {count} free ports in {first}..{first + PORTS_PER_WORKER - 1}")


def config_for(hosts=("algo-1",), current="algo-1", mpi: MpiConfig | None = None, hps=None, **kwargs) -> JobConfig:
    """The ``JobConfig`` ``config.load`` gives host ``current`` of ``hosts`` (sorted as SageMaker's
    ``resourceconfig.json`` is read), for the unit tier's plans and host parts: ``/opt/ml``, no GPU,
    ``hps`` as the user's hyperparameters, ``kwargs`` for the other fields (``strategy``, ``ports``)."""
    mpi = mpi or MpiConfig()
    hosts = tuple(sorted(hosts, key=natural_key))
    kwargs.setdefault("strategy", "mpi" if mpi.enabled else "single")
    kwargs.setdefault("num_gpus", 0)
    return JobConfig(
        base_dir="/opt/ml", current_host=current, hosts=hosts, distribution_hosts=hosts,
        master_host=hosts[0], network_interface="eth0", num_cpus=2,
        program="train.py", submit_dir="/opt/ml/code", code_dir="/opt/ml/code",
        user_hyperparameters=hps or {"epochs": 3, "name": "a b"}, framework_parameters={},
        mpi=mpi, sm_env={"SM_CURRENT_HOST": current, "SM_HOSTS": json.dumps(list(hosts)),
                         "SM_MODEL_DIR": "/opt/ml/model"},
        python="/usr/bin/python3", **kwargs)


# a user's train.py in /opt/ml/code, the program config_for's jobs run
PLAIN_SCRIPT = Program("train.py", True, ("/opt/ml/code/train.py",), "/opt/ml/code")


def free_port() -> int:
    """One port of ``free_ports``."""
    return free_ports(1)[0]


def own_ports() -> dict[str, str]:
    """Every ``DTC_*_PORT`` variable (``dtc_entrypoint.launchers.ports``) set to its own
    free port (``free_ports``), for a `train` job on this machine: its launchers bind those ports
    here, where pytest-xdist runs several jobs at once (a second job on a default port, 7777 for
    torchrun or 8890 for MultiWorkerMirroredStrategy, fails with EADDRINUSE or "Could not start
    gRPC server"; on SageMaker each host is a container of its own)."""
    from dtc_entrypoint import launchers

    variables = [port.variable for port in launchers.ports()]
    return {variable: str(port) for variable, port in zip(variables, free_ports(len(variables)), strict=True)}


def train_env(base_dir: Path, env: dict | None = None) -> dict[str, str]:
    """The environment `train` gets in a container: ``SAGEMAKER_BASE_DIR`` = ``base_dir``, this
    venv's bin first on PATH, plus ``env``."""
    full_env = {**os.environ, "SAGEMAKER_BASE_DIR": str(base_dir), "PATH": f"{BIN}:{os.environ['PATH']}"}
    full_env.pop("SAGEMAKER_PROGRAM", None)
    full_env.update(env or {})
    return full_env


def run_train(base_dir: Path, *args: str, env: dict | None = None, timeout_s: float = 900) -> TrainResult:
    """Runs the installed `train` command against ``base_dir`` like a container would. A run (not
    ``--plan``, which binds nothing and shows the default ports) gets its own ports (own_ports),
    under ``env``."""
    env = env or {}
    if "--plan" not in args:
        env = {**own_ports(), **env}
    try:
        done = subprocess.run([str(BIN / "train"), *args], env=train_env(base_dir, env), capture_output=True,
                              text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as expired:   # train is killed; say where its processes were, end them
        raise AssertionError(f"train did not end within {timeout_s:.0f} s: "
                             f"{hung_processes(base_dir / 'output' / '.stacks')}") from expired
    return TrainResult(done.returncode, done.stdout, done.stderr, base_dir)


def hung_processes(stacks_dir: Path) -> str:
    """Where the processes registered in ``stacks_dir`` are (dtc_entrypoint.stack_dump: every
    Python process started with ``DTC_STACKS_DIR`` set writes its stacks on request), first as
    one line (forensics.where_ranks_are), then each one's dump; then kills them: what a test
    that timed out reports, so that a hang seen once in CI says where it was."""
    from dtc_entrypoint import forensics, stack_dump

    paths = stack_dump.request(str(stacks_dir))
    dumps = [d for d in map(forensics.parse, paths) if d]
    for dump in dumps:
        try:
            os.kill(dump.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    text = "\n".join(f"--- {path}\n{Path(path).read_text()}" for path in paths)
    return f"{forensics.where_ranks_are(dumps)}\n{text}"


def processes_of_job(base_dir: Path) -> list[str]:
    """Processes still running for the job at ``base_dir`` (every process ``train`` starts has
    its ``SAGEMAKER_BASE_DIR``), as ``pid cmdline`` strings."""
    import psutil

    found = []
    for process in psutil.process_iter():
        try:
            if process.pid != os.getpid() and process.environ().get("SAGEMAKER_BASE_DIR") == str(base_dir):
                found.append(f"{process.pid} {' '.join(process.cmdline())}")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def job_tree_at(hyperparameters: dict, where: Path) -> Path:
    """A job tree at ``where``/opt/ml (kept between runs: channels and checkpoints stay)."""
    root = where / "opt" / "ml"
    job_tree.write(str(root), hyperparameters=hyperparameters, channels=("training", "validation"), clean=False)
    return root


def digits_job(where: Path, digits_channels: Path, hyperparameters: dict, stray_files: bool = False) -> Path:
    """A job tree at ``where``/opt/ml with the digits channels copied in (``stray_files``: plus
    what S3 channels often hold besides images, which the trainers must skip)."""
    root = job_tree_at(hyperparameters, where)
    for channel in ("training", "validation"):
        shutil.copytree(digits_channels / channel, root / "input" / "data" / channel, dirs_exist_ok=True)
        if stray_files:
            add_stray_files(root / "input" / "data" / channel)
    return root


def mpi_digits_job(where: Path, digits_channels: Path, framework: str, processes_per_host: int = 2,
                   epochs: int = 12, **hyperparameters) -> Path:
    """The main job (`make train`): builtin:<framework> on ``processes_per_host`` MPI ranks over
    the digits channels, stray files included."""
    return digits_job(where, digits_channels, {
        "sagemaker_program": f"builtin:{framework}", "sagemaker_mpi_enabled": True,
        "sagemaker_mpi_num_of_processes_per_host": processes_per_host, "sagemaker_mpi_custom_mpi_options": "",
        "epochs": epochs, **hyperparameters}, stray_files=True)


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


def json_objects(text: str) -> list[dict]:
    """Every JSON object in ``text`` (the ranks' result lines as mpirun forwards them: two ranks'
    lines can arrive on one line, ``{...}{...}``, as seen in CI on 2026-11-26)."""
    decoder, found, index = json.JSONDecoder(), [], text.find("{")
    while index != -1:
        value, end = decoder.raw_decode(text, index)
        found.append(value)
        index = text.find("{", end)
    return found


def read_json(path: Path):
    return json.loads(Path(path).read_text())


def versions_env(path: Path = REPO / "versions.env") -> dict[str, str]:
    """Every KEY=VALUE of a versions.env, pins and release dates (<KEY>_RELEASED)."""
    values = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            values[key] = value
    return values


def pins() -> dict[str, str]:
    """versions.env's pins as a dict (not their release dates)."""
    return {key: value for key, value in versions_env().items() if not key.endswith("_RELEASED")}


def torch_load(path: Path):
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def checkpoint_position(root: Path) -> tuple[int, int] | None:
    """(epochs done, steps of the next done) in the job's checkpoint (``root``/checkpoints), or None."""
    directory = root / "checkpoints"
    if (directory / "checkpoint.pt").exists():
        state = torch_load(directory / "checkpoint.pt")
        return state["epoch"], state["step"]
    if (directory / "checkpoint.npz").exists():
        import numpy as np

        with np.load(directory / "checkpoint.npz") as saved:
            return int(saved["epoch"]), int(saved["step"])
    return None


def final_digests(log: str, world_size: int) -> dict[int, str]:
    """rank -> final weight digest, for the ranks of a job of ``world_size``."""
    return {int(rank): digest for rank, size, digest in DIGEST.findall(log) if int(size) == world_size}


def assert_identical_weights(log: str, world_size: int) -> None:
    """Every rank of ``world_size`` printed its digest, and all are equal."""
    digests = final_digests(log, world_size)
    assert sorted(digests) == list(range(world_size)), log[-3000:]
    assert len(set(digests.values())) == 1, f"ranks finished with different weights: {digests}"


# ------------------------------------------------------------------------------ observability
def documented_metric_definitions() -> list[dict]:
    """The metric_definitions list docs/trainers.md gives users, as Python."""
    import ast

    text = (REPO / "docs" / "trainers.md").read_text()
    block = re.search(r"metric_definitions = (\[.*?\n\])", text, re.S).group(1)
    return ast.literal_eval(block)


def check_observability(log: str, output_dir: Path, epochs: list[int], world_size: int) -> None:
    """docs/trainers.md's metric regexes, applied line by line as CloudWatch does, read the values of
    ``epochs`` (the epochs this run reported: all of them, or those after a resumed checkpoint)
    from the real log; rank 0 wrote TensorBoard scalars and the report for the same epochs."""
    lines = [line for line in log.splitlines() if METRIC.search(line)]
    assert [int(METRIC.search(line).group(1)) for line in lines] == epochs
    definitions = documented_metric_definitions()
    assert {d["Name"] for d in definitions} >= {"validation:accuracy", "train:samples_per_second"}
    found = {d["Name"]: [float(m.group(1)) for line in log.splitlines() if (m := re.search(d["Regex"], line))]
             for d in definitions}
    assert all(len(values) == len(epochs) for values in found.values()), {k: len(v) for k, v in found.items()}
    assert found["validation:accuracy"] == [float(m.group(3)) for m in map(METRIC.search, lines)]

    # TensorBoard's own reader (TensorBoard 2 scalars are tensors with the scalars plugin's metadata)
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    events = EventAccumulator(str(output_dir / "tensorboard"))
    events.Reload()
    # the epochs' scalars, and the system metrics of rank 0's host (no GPU here: no GPU tags)
    system_tags = set(system_metrics.SCALAR_TAGS.values())
    assert set(events.Tags()["tensors"]) == SCALAR_TAGS | system_tags
    assert all(events.SummaryMetadata(tag).plugin_data.plugin_name == "scalars" for tag in SCALAR_TAGS | system_tags)
    cpu = [float(make_ndarray(e.tensor_proto)) for e in events.Tensors("system/cpu_percent")]
    assert cpu and all(0 <= value <= 100 for value in cpu), cpu
    accuracy = events.Tensors("validation/accuracy")
    assert [e.step for e in accuracy] == epochs
    assert [float(make_ndarray(e.tensor_proto)) for e in accuracy] == pytest.approx(found["validation:accuracy"],
                                                                                    abs=1e-4)

    report = output_dir / "data" / "report"
    summary = json.loads((report / "summary.json").read_text())
    assert summary["epochs_this_run"] == epochs and summary["world_size"] == world_size
    assert summary["final"]["val_accuracy"] == pytest.approx(found["validation:accuracy"][-1], abs=1e-4)
    assert sum(summary["phase_seconds"].values()) == pytest.approx(summary["wall_seconds"], rel=1e-3)
    assert summary["phase_seconds"]["training_steps"] > 0 and summary["mean_samples_per_second"] > 0
    assert "final validation accuracy" in (report / "summary.md").read_text()
    assert summary["system"]["samples"] >= 1 and summary["system"]["interval_s"] == 10.0
    assert set(summary["system"]["series"]) == {tag.removeprefix("system/") for tag in system_tags}
    assert "System metrics of this host" in (report / "summary.md").read_text()
    from PIL import Image

    for name in ("loss.png", "accuracy.png", "throughput.png"):
        with Image.open(report / name) as image:
            assert image.format == "PNG" and image.size == (600, 400)
    with Image.open(report / "system.png") as image:
        assert image.format == "PNG" and image.size == (600, 800)


# ------------------------------------------------------------------------------ images and containers
def flavor_image(flavor: str) -> str:
    """The image of ``flavor`` the run names (DTC_IMAGE, DTC_GPU_IMAGE); skips the test without one."""
    if not IMAGES[flavor]:
        who = "make test" if flavor == "cpu" else "make gpu-verify, or make test when the GPU build inputs changed,"
        pytest.skip(f"no {flavor} image named ({'DTC_IMAGE' if flavor == 'cpu' else 'DTC_GPU_IMAGE'}; {who} sets it)")
    return IMAGES[flavor]


def container(*argv: str, timeout_s: float = 900, check: bool = False, env: dict[str, str] | None = None,
              cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``docker``/``podman`` ``argv`` (scripts/container.sh picks the engine: Docker where ``env``'s
    DOCKER_HOST and DOCKER name one that answers, as ``docker_env`` gives; this process's by default),
    run in ``cwd`` (default this process's)."""
    return subprocess.run([CONTAINER, *argv], capture_output=True, text=True, timeout=timeout_s, check=check,
                          env=env, cwd=cwd)


def run_job_in(image: str, root: Path, timeout_s: float = 900) -> subprocess.CompletedProcess:
    """``train`` in ``image`` on the job tree ``root`` mounted at /opt/ml."""
    return container("run", "--rm", "--shm-size", "1g", "-v", f"{root}:/opt/ml", image, "train", timeout_s=timeout_s)


def check_in_image_suite(flavor: str, image: str | None = None, env: dict[str, str] | None = None) -> None:
    """The in-image sanity suite (tests/image/in_image) passes in the ``flavor`` image (``image``,
    default the run's; ``env`` picks the engine, as for ``container``)."""
    done = container("run", "--rm", "--network", "none", "-v", f"{TESTS / 'image' / 'in_image'}:/tests:ro",
                     image or flavor_image(flavor), "python", "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                     "/tests", env=env)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    if flavor == "gpu":
        assert " skipped" not in done.stdout.splitlines()[-1], done.stdout[-3000:]   # every GPU check ran


def image_sanity(image: str, flavor: str, *args: str) -> subprocess.CompletedProcess:
    """``python -m dtc_local.image_sanity IMAGE --flavor FLAVOR ARGS`` (docs/image.md, Checks)."""
    return subprocess.run([sys.executable, "-m", "dtc_local.image_sanity", image, "--flavor", flavor, *args],
                          capture_output=True, text=True, timeout=600)


def check_labels(flavor: str) -> None:
    """The image's labels carry the pinned versions of its flavor."""
    labels = json.loads(container("image", "inspect", flavor_image(flavor), check=True).stdout)[0]["Config"]["Labels"]
    pinned = pins()
    assert labels["ai.dtc.flavor"] == flavor
    assert labels["ai.dtc.tensorflow"] == pinned["TENSORFLOW_VERSION"]
    assert labels["ai.dtc.horovod"] == pinned["HOROVOD_VERSION"]
    assert labels["ai.dtc.python"] == pinned["PYTHON_VERSION"]
    if flavor == "cpu":
        assert labels["ai.dtc.pytorch"] == pinned["TORCH_VERSION"] and labels["ai.dtc.cuda"] == "none"
    else:
        assert labels["ai.dtc.pytorch"] == pinned["TORCH_GPU_VERSION"]
        assert labels["ai.dtc.cuda"] == pinned["CUDA_RUNTIME_VERSION"]


def docker_image() -> str:
    """The CPU image built by Docker's engine: ``DTC_DOCKER_IMAGE``, or, while ``make test``
    builds it beside the cluster tier, what its docker-image phase writes to
    ``DTC_DOCKER_IMAGE_FILE`` when it ends (scripts/test.sh: ``built <image>``, ``none <why>`` or
    ``failed <why>``), waited for up to ``DOCKER_BUILD_WAIT_S`` seconds. Skips the test where no
    Docker image is built (no engine on this machine, or no such build asked for); fails it where
    the build failed or never ended."""
    if os.environ.get("DTC_DOCKER_IMAGE"):
        return os.environ["DTC_DOCKER_IMAGE"]
    path = os.environ.get("DTC_DOCKER_IMAGE_FILE")
    if not path:
        pytest.skip("no Docker image named (DTC_DOCKER_IMAGE; make test builds the image with Docker where its "
                    "engine runs, and names it)")
    deadline = time.monotonic() + DOCKER_BUILD_WAIT_S
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            pytest.fail(f"make test's Docker image build did not end within {DOCKER_BUILD_WAIT_S} s ({path} was "
                        "never written; build/images.log)")
        time.sleep(5)
    status, _, detail = Path(path).read_text().strip().partition(" ")
    if status == "built":
        return detail
    if status == "failed":
        pytest.fail(f"make test's Docker image build failed: {detail}")
    pytest.skip(f"no Docker image: {detail}")


def docker_env() -> dict[str, str]:
    """``DOCKER_HOST`` and ``DOCKER`` for the project's Docker engine (scripts/docker-daemon.sh,
    started when it is not running); skips the test where this machine cannot run it."""
    script = REPO / "scripts" / "docker-daemon.sh"
    started = subprocess.run([str(script), "start"], capture_output=True, text=True)
    if started.returncode != 0:
        pytest.skip(f"the Docker engine does not run on this machine: {started.stderr.strip()[-800:]}")
    names = subprocess.run([str(script), "env"], capture_output=True, text=True, check=True).stdout.split()
    return dict(name.split("=", 1) for name in names)


# ------------------------------------------------------------------------------ the SageMaker SDKs' local modes
@contextlib.contextmanager
def exclusive(name: str):
    """Holds ``build/<name>.lock`` exclusively while the block runs, whichever pytest-xdist worker
    runs it (xdist_group marks are not applied under pytest 9 with pytest-xdist 3.8). For the SDKs'
    local modes, which name their compose projects and networks themselves, so two of their jobs on
    one engine meet (same container names: one kills the other's)."""
    lock_path = REPO / "build" / f"{name}.lock"
    lock_path.parent.mkdir(exist_ok=True)
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def deal_out(items: list, one_at_a_time) -> list:
    """``items`` (pytest's, in the order pytest-xdist hands them out) with those for which
    ``one_at_a_time(item)`` holds (tests that hold one ``exclusive`` lock) spread evenly among the
    others, the first half a gap in, each kind in its own order: a worker that takes one of them
    then seldom waits for another worker's (tests/conftest.py)."""
    serial = [item for item in items if one_at_a_time(item)]
    rest = [item for item in items if not one_at_a_time(item)]
    if not serial or not rest:
        return list(items)
    gap = len(rest) / len(serial)
    dealt = []
    for index, item in enumerate(rest):
        dealt += [test for n, test in enumerate(serial) if int((n + 0.5) * gap) == index]
        dealt.append(item)
    return dealt   # (n + 0.5) * gap < len(rest) for every n: each one is placed


ONE_AT_A_TIME = ("docker_api", "sdk_local_docker")   # the fixtures that hold one exclusive lock each


def handout_order(items: list, docker_build_running: bool) -> list:
    """The order pytest-xdist hands ``items`` out in (tests/conftest.py). The SDKs' local-mode jobs
    run one at a time, on podman's Docker API and on Docker's engine (``ONE_AT_A_TIME``): each kind
    dealt out among the other tests (``deal_out``), so that a worker seldom waits for another's. In
    a row near the end, as collected, two of the three workers waited, and the cores were 22 to 48 %
    idle in the tier's last 4 minutes (make test of 7e091d0, 2026-12-05). Tests marked docker go last,
    in their order, only while ``docker_build_running``: they would wait for the build. Last once it
    had ended, Docker's four SDK jobs ran in a row and the cores were 70 % idle in the tier's last 70
    seconds (a new machine's run of 0d5474b, 2026-12-07)."""
    for lock in ONE_AT_A_TIME:
        items = deal_out(items, lambda item, lock=lock: lock in item.fixturenames)
    if docker_build_running:
        items = sorted(items, key=lambda item: item.get_closest_marker("docker") is not None)
    return items


SDK_V2 = REPO / ".venv" / "sdk-v2" / "bin" / "python"
SDK_V3 = REPO / ".venv" / "sdk-v3" / "bin" / "python"


def sdk_env(tmp_path: Path, api_env: dict, sdk: Path = SDK_V2) -> dict:
    """The environment an SDK's local mode runs in: its own interpreter first on PATH, a home with
    the SDK's config (telemetry off), any region and credentials, and ``api_env`` (DOCKER_HOST)."""
    home = tmp_path / "home"
    (home / ".config" / "sagemaker").mkdir(parents=True, exist_ok=True)
    config = home / ".config" / "sagemaker" / "config.yaml"
    config.write_text("SchemaVersion: '1.0'\nSageMaker:\n  PythonSDK:\n    Modules:\n      TelemetryOptOut: true\n")
    return {"PATH": f"{sdk.parent}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home),
            "SAGEMAKER_USER_CONFIG_OVERRIDE": str(config), "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local", "SAGEMAKER_SUPPRESS_V2_WARNING": "1",
            **api_env}


# ------------------------------------------------------------------------------ local clusters
def podman_env() -> dict:
    """This environment plus the containers.conf scripts/podman-env.sh writes."""
    conf = subprocess.run(["bash", "-c", f". {REPO / 'scripts' / 'podman-env.sh'} && echo $CONTAINERS_CONF"],
                          capture_output=True, text=True, check=True).stdout.strip()
    return {**os.environ, "CONTAINERS_CONF": conf}


def cluster_argv(job_dir: Path, *args: str, image: str | None = None, timeout_s: float = 900) -> list[str]:
    """``python -m dtc_local.cluster`` (what `make cluster` runs) for a two-host job in ``job_dir``,
    named and addressed as ``CLUSTER``; the cluster gives up ``timeout_s`` - 60 s after it starts."""
    return [sys.executable, "-m", "dtc_local.cluster", "--image", image or flavor_image("cpu"), "--instance-count",
            "2", "--name", CLUSTER.name, "--subnet", CLUSTER.subnet, "--job-dir", str(job_dir),
            "--timeout-s", str(timeout_s - 60), *args]


def start_cluster(job_dir: Path, *args: str, image: str | None = None, timeout_s: float = 900) -> subprocess.Popen:
    """Starts a two-host job (``cluster_argv``) whose merged output is read from ``.stdout``."""
    return subprocess.Popen(cluster_argv(job_dir, *args, image=image, timeout_s=timeout_s), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=podman_env(), stdin=subprocess.DEVNULL)


def run_cluster(job_dir: Path, *args: str, image: str | None = None, timeout_s: float = 900
                ) -> tuple[subprocess.CompletedProcess, dict]:
    """Runs a two-host job (``cluster_argv``) to its end. Returns (the process, result.json)."""
    done = subprocess.run(cluster_argv(job_dir, *args, image=image, timeout_s=timeout_s), capture_output=True,
                          text=True, timeout=timeout_s, env=podman_env(), stdin=subprocess.DEVNULL)
    return done, read_json(job_dir / "result.json")


def check_two_host_job(name: str, tmp_path: Path, image: str | None = None,
                       extra_args: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """The strategy ``name`` (``STRATEGIES``) trains builtin:<framework> on two hosts from scratch
    (``extra_args``: more ``dtc_local.cluster`` flags) and finishes as
    ``check_finished_two_host_job`` says. Returns the cluster's process (its output)."""
    strategy = STRATEGIES[name]
    done, result = run_cluster(tmp_path / "job", *strategy.cluster_args(), "-p", f"epochs={strategy.cluster_epochs}",
                               *extra_args, image=image)
    check_finished_two_host_job(name, done, result, tmp_path / "job")
    return done


def check_finished_two_host_job(name: str, done: subprocess.CompletedProcess, result: dict, job_dir: Path,
                                first_epoch: int = 1) -> None:
    """A two-host job of the strategy ``name`` (``STRATEGIES``) that ran in ``job_dir`` up to its
    ``cluster_epochs``, reporting epochs ``first_epoch``.. (later than 1 when it resumed from a
    checkpoint): exit 0 on every host, >= 0.90 validation accuracy on all 360 validation images,
    bit-identical weights on every data-parallel rank, TensorBoard events and the report for
    those epochs from the master's rank 0 only, the model written once (by the master), every
    host naming algo-1 as master and every rank its own host."""
    strategy = STRATEGIES[name]
    epochs, world_size = list(range(first_epoch, strategy.cluster_epochs + 1)), strategy.two_host_world_size
    log = done.stdout + done.stderr
    assert done.returncode == 0 and result["exit_code"] == 0, log[-6000:]
    assert {h: result["hosts"][h]["exit_code"] for h in HOSTS} == {"algo-1": 0, "algo-2": 0}
    assert all((job_dir / h / "output" / "success").exists() for h in HOSTS)

    epochs_seen = METRIC.findall(log)
    assert [int(e[0]) for e in epochs_seen] == epochs and float(epochs_seen[-1][2]) >= 0.90, epochs_seen
    assert int(epochs_seen[-1][3]) == VALIDATION_IMAGES
    assert_identical_weights(log, world_size)

    # TensorBoard events and the report come from the master's rank 0 only
    check_observability(log, job_dir / "algo-1" / "output", epochs, world_size)   # PS: its 1 worker
    assert not (job_dir / "algo-2" / "output" / "data" / "report").exists()
    assert not any((job_dir / "algo-2" / "output" / "tensorboard").glob("events.*"))

    assert SAVED_MODEL[strategy.framework] in result["hosts"]["algo-1"]["model"]      # written once, by the master
    assert result["hosts"]["algo-2"]["model"] == []
    assert re.search(r"^\[algo-1\] .*master=algo-1", log, re.M) and re.search(r"^\[algo-2\] .*master=algo-1", log, re.M)
    if world_size == 4:   # every rank names the host it runs on (its own SM_CURRENT_HOST)
        for rank, host in ((0, "algo-1"), (1, "algo-1"), (2, "algo-2"), (3, "algo-2")):
            assert re.search(rf"rank {rank}/4 .*\(host {host}\)", log), f"rank {rank} did not report host {host}"
