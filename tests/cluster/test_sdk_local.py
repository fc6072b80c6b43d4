"""The SageMaker Python SDKs' local modes against the image, for real (issue #12).

SDK v2: ``Estimator``/``PyTorch`` with ``instance_type="local"`` and ``image_uri``; SDK v3:
``ModelTrainer(training_mode=Mode.LOCAL_CONTAINER, training_image=...)``, with no
``source_code`` (the image's own ``train``) or with the SDK's ``Torchrun()`` driver. The SDK
itself writes the /opt/ml trees and its compose file and starts the containers with
docker-compose through podman's Docker-compatible API; nothing of the SDK is imitated.
Telemetry is off in the SDK's own config (``TelemetryOptOut``), so nothing tries to leave the
machine. docs/sdk.md gives users the same steps, and what the image does about SDK v3 local
mode's ``ethwe`` interface (its ``mpirun`` falls back to one that exists).
"""

import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import pytest

from helpers import DIGEST, PROGRAMS, SDK_V2, SDK_V3, exclusive, podman_env, run_cluster, sdk_env

IMAGE = os.environ.get("DTC_IMAGE")
pytestmark = [pytest.mark.image,
              pytest.mark.skipif(not IMAGE, reason="DTC_IMAGE is not set (make test builds the image and sets it)")]


@pytest.fixture(scope="module")
def docker_api():
    """podman's Docker-compatible API on a private socket; yields the SDK process's environment."""
    assert SDK_V2.exists() and SDK_V3.exists(), "scripts/setup-host.sh creates .venv/sdk-v2 and .venv/sdk-v3"
    directory = tempfile.mkdtemp(prefix="dtc-api-")
    socket_path = f"{directory}/podman.sock"
    env = podman_env()
    service = subprocess.Popen(["podman", "system", "service", "--time=0", f"unix://{socket_path}"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    api_env = {"DOCKER_HOST": f"unix://{socket_path}"}
    deadline = time.monotonic() + 30
    while subprocess.run(["docker", "version"], env={**os.environ, **api_env}, capture_output=True).returncode:
        assert service.poll() is None and time.monotonic() < deadline, "podman's API service did not start"
        time.sleep(0.5)
    yield api_env
    service.terminate()
    service.wait(timeout=30)
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(autouse=True)
def one_sdk_job_at_a_time(request):
    """The SDKs name their compose networks themselves, so two of their jobs on one machine meet:
    each test that runs an SDK's local mode (through ``docker_api``) holds ``exclusive("sdk-local")``
    while it runs (tests/conftest.py deals these tests out among the others). docker-compose also
    leaves its exited containers behind (each pins the image it ran, layers and all): after each
    such test, every compose container is removed (only these tests use compose on podman). The
    tests of SDK v3's drivers on dtc_local's cluster use no compose, and wait for no lock."""
    if "docker_api" not in request.fixturenames:
        yield
        return
    with exclusive("sdk-local"):
        try:
            yield
        finally:
            remove_compose_containers()


def remove_compose_containers() -> None:
    env = podman_env()
    left = subprocess.run(["podman", "ps", "-a", "-q", "--filter", "label=com.docker.compose.project"],
                          capture_output=True, text=True, env=env).stdout.split()
    if left:
        subprocess.run(["podman", "rm", "-f", *left], capture_output=True, env=env)


def run_sdk(tmp_path, api_env, *args: str, sdk: Path = SDK_V2) -> tuple[subprocess.CompletedProcess, dict]:
    image = IMAGE if "/" in IMAGE.split(":")[0] else f"localhost/{IMAGE}"
    program = PROGRAMS / ("sdk_v2_local.py" if sdk == SDK_V2 else "sdk_v3_local.py")
    env = sdk_env(tmp_path, api_env, sdk)
    if sdk == SDK_V3:
        # SDK v3 names its compose project after its working directory, "work" in every test. Once
        # podman 4.3 rotates its events log, an events stream replays the events the log kept
        # (containers/podman#17665, fixed in podman 4.5), and docker-compose 1.29 ends the job on a
        # replayed start of a container removed since ("'NoneType' object has no attribute
        # 'log_stream'"): an earlier test's, under the same project name (make test of 908ebfc,
        # 2026-12-06). A project of its own: compose's label filter leaves the others' events out.
        env["COMPOSE_PROJECT_NAME"] = f"dtc-v3-{os.urandom(4).hex()}"
    done = subprocess.run([str(sdk), str(program), "--image", image, "--work", str(tmp_path / "work"), *args],
                          env=env, capture_output=True, text=True, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return done, (json.loads(lines[-1]) if lines else {})


def members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name.removeprefix("./"): tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


@pytest.mark.parametrize("instance_count", [1, 2])
def test_sdk_v2_local_mode_trains_a_builtin_trainer_with_the_generic_estimator(
        instance_count, docker_api, digits_channels, tmp_path):
    done, result = run_sdk(tmp_path, docker_api, "--estimator", "generic", "--instance-count", str(instance_count),
                           "--epochs", "8", "--data", str(digits_channels))
    log = done.stdout + done.stderr
    assert done.returncode == 0 and result, log[-6000:]
    assert "Applied value from config key = SageMaker.PythonSDK.Modules.TelemetryOptOut" in log
    # the SDK's own compose file started the containers, named its way
    compose = next((tmp_path / "work" / "containers").rglob("docker-compose.yaml")).read_text()
    assert compose.count("command: train") == instance_count

    assert result["model_data"].startswith("file://") and result["model_data"].endswith("/model.tar.gz")
    model = members(Path(result["model_data"].removeprefix("file://")))
    assert {"model.pth", "model.json"} <= set(model)
    described = json.loads(model["model.json"])
    assert described["world_size"] == 2 * instance_count and described["val_accuracy"] >= 0.90

    output = members(Path(result["model_data"].removeprefix("file://")).parent / "output.tar.gz")
    summary = json.loads(output["data/report/summary.json"])
    assert summary["world_size"] == 2 * instance_count and summary["epochs_this_run"] == list(range(1, 9))
    assert "success" in output


def test_sdk_v2_local_mode_runs_a_users_script_with_the_pytorch_estimator(docker_api, digits_channels, tmp_path):
    """Script mode: the SDK mounts source_dir, passes sagemaker_program/sagemaker_submit_directory
    and the mpi distribution's hyperparameters; the user's train.py wraps a built-in trainer."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "train.py").write_text("from dtc_train.pytorch_horovod import main\n\nraise SystemExit(main())\n")
    done, result = run_sdk(tmp_path, docker_api, "--estimator", "pytorch", "--source-dir", str(source),
                           "--epochs", "8", "--data", str(digits_channels))
    assert done.returncode == 0 and result, (done.stdout + done.stderr)[-6000:]
    model = members(Path(result["model_data"].removeprefix("file://")))
    described = json.loads(model["model.json"])
    assert described["world_size"] == 2 and described["val_accuracy"] >= 0.90


@pytest.mark.parametrize("driver, instance_count", [("none", 2), ("torchrun", 1), ("torchrun", 2), ("mpi", 2)])
def test_sdk_v3_local_container_mode_trains_in_the_image(driver, instance_count, docker_api, digits_channels,
                                                         tmp_path):
    """No source_code: the SDK starts the image with no command, which runs `train` (the
    built-in trainer named in the hyperparameters, under our MPI launcher). Torchrun(): the SDK's
    own driver, mounted from its package, runs the user's train.py (DDP) in the image. MPI(): the
    SDK's driver runs its own `mpirun -mca btl_tcp_if_include ethwe ...`; no local container has
    ethwe, and the image's mpirun falls back to eth0 with a warning (docker/install-openmpi.sh).
    The SDK passes `-np` = processes per host; the image's mpirun runs them on every host, with a
    warning naming the SDK's bug, so its MPI job has 4 ranks on two hosts as asked."""
    source = tmp_path / "src"
    source.mkdir()
    trainer = "pytorch_horovod" if driver == "mpi" else "pytorch_ddp"
    (source / "train.py").write_text(f"from dtc_train.{trainer} import main\n\nraise SystemExit(main())\n")
    done, result = run_sdk(tmp_path, docker_api, "--driver", driver, "--source-dir", str(source),
                           "--instance-count", str(instance_count), "--epochs", "8", "--data", str(digits_channels),
                           sdk=SDK_V3)
    log = done.stdout + done.stderr
    assert done.returncode == 0 and result, log[-6000:]
    assert "Applied value from config key = SageMaker.PythonSDK.Modules.TelemetryOptOut" in log
    compose = (tmp_path / "work" / "docker-compose.yaml").read_text()
    assert ("entrypoint" in compose) == (driver != "none")       # no command: the image decides
    world_size = 2 * instance_count
    if driver == "mpi":
        assert "mpirun: network interface 'ethwe' does not exist in this container; using 'eth0' instead" in log
        assert "mpirun: -np 2 with --host algo-1:2,algo-2:2 is the SageMaker SDK MPI() driver" in log
    digests = {d for _, size, d in DIGEST.findall(log) if int(size) == world_size}
    assert len(digests) == 1, log[-4000:]                          # every rank ends with the same weights
    model = members(tmp_path / "work" / "compressed_artifacts" / "model.tar.gz")
    described = json.loads(model["model.json"])
    assert described["world_size"] == world_size and described["val_accuracy"] >= 0.90



@pytest.mark.parametrize("driver", ["mpi", "torchrun"])
def test_sdk_v3_drivers_run_on_a_two_host_cluster_as_on_sagemaker(driver, digits_channels, tmp_path):
    """SDK v3's own drivers outside its local mode (which names a network interface, ethwe, that
    no local container has): the SDK's code writes its sm_drivers channel
    (programs/sdk_v3_drivers.py), and a two-host cluster (dtc_local.cluster, interface eth0 as
    resourceconfig says) runs the SDK's sm_train.sh in the image with the code and data channels,
    as a SageMaker job would. The SDK's MPI driver passes `-np` = processes per host (2) with
    `--host algo-1:2,algo-2:2`; the image's mpirun runs 2 on each host as asked (with a warning
    naming the SDK's bug), as Torchrun does, and its ranks on these hosts with no GPU yield while
    they wait in MPI, on both hosts (the driver's own mpirun command does not ask it)."""

    source = tmp_path / "src"
    source.mkdir()
    trainer = "pytorch_horovod" if driver == "mpi" else "pytorch_ddp"
    (source / "train.py").write_text(
        "import os, socket\n"
        "print(f\"mpi_yield_when_idle={os.environ.get('OMPI_MCA_mpi_yield_when_idle')} on {socket.gethostname()}\","
        " flush=True)\n"
        f"from dtc_train.{trainer} import main\n\nraise SystemExit(main())\n")
    made = subprocess.run([str(SDK_V3), str(PROGRAMS / "sdk_v3_drivers.py"), str(tmp_path / "sm_drivers"),
                           "--driver", driver, "--source-dir", str(source)],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr[-3000:]
    command = json.loads(made.stdout.splitlines()[-1])["command"]
    assert command[:2] == ["/bin/bash", "-c"] and command[2].endswith("/opt/ml/input/data/sm_drivers/sm_train.sh")
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps({
        # the SDK's command but its `chmod +x`, which a read-only channel mount refuses (SageMaker's are copies)
        "command": ["/bin/bash", "/opt/ml/input/data/sm_drivers/sm_train.sh"],
        "distribution": "none", "hyperparameters": {"epochs": 8}, "peer_grace_s": 60,
        "channels": {"training": str(digits_channels / "training"), "validation": str(digits_channels / "validation"),
                     "code": str(source), "sm_drivers": str(tmp_path / "sm_drivers")}}))
    done, result = run_cluster(tmp_path / "job", "--job-file", str(job_file), timeout_s=600)
    log = done.stdout + done.stderr
    assert done.returncode == 0 and result["exit_code"] == 0, log[-6000:]
    assert {h: result["hosts"][h]["exit_code"] for h in ("algo-1", "algo-2")} == {"algo-1": 0, "algo-2": 0}
    assert f"Running {'MPI' if driver == 'mpi' else 'Torchrun'} Driver" in log
    world_size = 4
    if driver == "mpi":
        assert "running 4 processes, 2 on each of the 2 hosts" in log, log[-4000:]
        yielding = sorted(re.findall(r"mpi_yield_when_idle=(\S+) on (algo-\d)", log))
        assert yielding == [("1", "algo-1"), ("1", "algo-1"), ("1", "algo-2"), ("1", "algo-2")], log[-4000:]
    digests = {int(rank): digest for rank, size, digest in DIGEST.findall(log) if int(size) == world_size}
    assert sorted(digests) == list(range(world_size)) and len(set(digests.values())) == 1, log[-4000:]
    ranks_on = {host: re.findall(rf"rank (\d+)/{world_size} .*\(host {host}\)", log) for host in ("algo-1", "algo-2")}
    assert len(ranks_on["algo-1"]) == len(ranks_on["algo-2"]) == 2, ranks_on
    described = json.loads((tmp_path / "job" / "algo-1" / "model" / "model.json").read_text())
    assert described["world_size"] == world_size and described["val_accuracy"] >= 0.90
