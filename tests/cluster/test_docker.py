"""Docker for real (#21 item 2): the CPU image built by Docker's engine with BuildKit and the build
secret (scripts/test.sh's docker-image phase, helpers.docker_image), `make train` and a two-host
`make cluster` through compose on that engine, and SageMaker SDK v2 local mode reporting a failed
job as failed on one and two hosts (with podman's Docker API it does not: docs/sdk.md).

The engine is Debian's docker.io on the project's own socket (scripts/docker-daemon.sh), so the
podman path the other tests use is untouched; every command here gets DOCKER_HOST and DOCKER.
The buildspec under Docker: tests/image/test_delivery.py.
"""

import json
import os
import re
import subprocess

import pytest

from helpers import (
    BUILDSPEC_IMAGE,
    IMAGES,
    PROGRAMS,
    REPO,
    SDK_V2,
    SDK_V3,
    check_in_image_suite,
    container,
    docker_env,
    docker_image,
    exclusive,
    read_json,
    sdk_env,
)

# docker: while make test's Docker image build still runs when the tier starts, tests/conftest.py
# runs these last, so that the pytest-xdist workers start on other tests (helpers.docker_image)
pytestmark = [pytest.mark.image, pytest.mark.docker]


@pytest.fixture(scope="module")
def image() -> str:
    """The CPU image Docker built (helpers.docker_image: waits for make test's build; skips without one)."""
    return docker_image()


@pytest.fixture(scope="module")
def engine(image) -> dict[str, str]:
    """This process's environment with the project's Docker engine in DOCKER_HOST and DOCKER."""
    return {**os.environ, **docker_env()}


@pytest.fixture
def sdk_local_docker():
    """Holds ``exclusive("sdk-local-docker")`` while the test runs: the SDKs' compose projects and
    networks have fixed names, so two of their jobs on one engine meet (tests/conftest.py deals the
    tests that take it out among the others)."""
    with exclusive("sdk-local-docker"):
        yield


def test_the_image_docker_built_is_the_one_buildah_built(engine, image):
    """Docker's build (BuildKit, the build secret) of the CPU image: within its size budget, the
    environment of buildah's, lock for lock: Docker's builder stage took buildah's builder output
    (scripts/build-image.sh hands it over in build/builder/ under the key of the stage's inputs,
    docker/builder-key.sh) instead of resolving, compiling and locking it again. Two builds would
    differ in the sha256 of every wheel they compiled, and in unpinned dependencies resolved hours
    apart. Its in-image suite runs in the buildspec test's Docker half
    (tests/image/test_delivery.py) when the image is dtc:cpu, here otherwise."""
    report = read_json(REPO / "build" / "docker-build.json")
    assert report["image"] == image and report["size_gb"] <= report["size_budget_gb"]
    labels = json.loads(container("image", "inspect", image, env=engine).stdout)[0]["Config"]["Labels"]
    assert labels["ai.dtc.flavor"] == "cpu"
    lock = container("run", "--rm", "--network", "none", image, "cat", "/opt/dtc/requirements.lock", env=engine)
    podman_lock = container("run", "--rm", "--network", "none", IMAGES["cpu"] or image, "cat",
                            "/opt/dtc/requirements.lock", timeout_s=300)
    assert lock.returncode == 0 and podman_lock.returncode == 0
    assert lock.stdout == podman_lock.stdout
    compiled = re.findall(r"^# (\S+\.whl) sha256=[0-9a-f]{64}$", lock.stdout, re.M)
    assert {"horovod", "mpi4py", "deepspeed"} <= {name.split("-")[0] for name in compiled}, compiled
    pinned = [line for line in lock.stdout.splitlines() if "==" in line and not line.startswith("#")]
    assert len(pinned) > 100 and any(line.startswith("tensorflow==") for line in pinned)
    if image != BUILDSPEC_IMAGE:
        check_in_image_suite("cpu", image=image, env=engine)


def test_make_train_runs_the_main_job_with_docker(engine, image, tmp_path):
    job = tmp_path / "job" / "opt" / "ml"
    done = subprocess.run(["make", "-s", "train", f"IMAGE={image}", f"JOB_DIR={job}", "EPOCHS=3"],
                          cwd=REPO, capture_output=True, text=True, env=engine, timeout=1800)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-6000:]
    assert "with env DOCKER_BUILDKIT=1" in log            # make image's build step went to Docker (a cache hit)
    assert (job / "model" / "model.pth").exists() and (job / "output" / "success").exists()
    assert "epoch=3/3" in log


def test_make_cluster_trains_on_two_hosts_through_docker_compose(engine, image, tmp_path):
    cluster_dir = tmp_path / "cluster"
    done = subprocess.run(["make", "-s", "cluster", f"IMAGE={image}", f"CLUSTER_DIR={cluster_dir}",
                           "EPOCHS=3", "CLUSTER_ARGS=--name dtc-docker --subnet 10.213.40.0/24 --engine docker"],
                          cwd=REPO, capture_output=True, text=True, env=engine, timeout=1800)
    log = done.stdout + done.stderr
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-1000:]
    assert re.search(r"with (docker-compose|\S+ compose); trees in", log), log[:3000]   # compose, not podman
    result = read_json(cluster_dir / "result.json")
    assert result["exit_code"] == 0 and all(h["exit_code"] == 0 for h in result["hosts"].values()), result
    assert "model.pth" in result["hosts"]["algo-1"]["model"]
    described = json.loads((cluster_dir / "algo-1" / "model" / "model.json").read_text())
    assert described["world_size"] == 4


FAILING_SCRIPT = """import os, time
time.sleep(5)   # fails after compose has attached: what podman's Docker API loses
if os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0")) == "0":
    raise ValueError("learning rate must be positive")
time.sleep(30)
"""


@pytest.mark.parametrize("sdk", [SDK_V2, SDK_V3], ids=["sdk-v2", "sdk-v3"])
@pytest.mark.parametrize("instance_count", [1, 2])
def test_sdk_local_mode_reports_a_failed_job_as_failed_with_docker(engine, image, sdk, instance_count,
                                                                   digits_channels, sdk_local_docker, tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    (source / "train.py").write_text(FAILING_SCRIPT)
    program, style = (("sdk_v2_local.py", ["--estimator", "pytorch"]) if sdk == SDK_V2
                      else ("sdk_v3_local.py", ["--driver", "torchrun"]))
    done = subprocess.run([str(sdk), str(PROGRAMS / program), "--image", image, "--work",
                           str(tmp_path / "work"), *style, "--source-dir", str(source), "--instance-count",
                           str(instance_count), "--epochs", "1", "--data", str(digits_channels)],
                          env=sdk_env(tmp_path, {"DOCKER_HOST": engine["DOCKER_HOST"]}, sdk),
                          capture_output=True, text=True, timeout=900)
    # docker-compose leaves exited containers, each pinning its image: this job's go (only its
    # own: the compose file is under tmp_path; make cluster's run on another worker meanwhile)
    listed = container("ps", "-a", "--filter", "label=com.docker.compose.project", "--format",
                       '{{.ID}} {{.Label "com.docker.compose.project.working_dir"}}', env=engine)
    listed = listed.stdout.splitlines()
    left = [line.split()[0] for line in listed if line.partition(" ")[2].startswith(str(tmp_path))]
    if left:
        container("rm", "-f", *left, env=engine)
    log = done.stdout + done.stderr
    assert done.returncode != 0, log[-6000:]              # the SDK raised: the job failed, and it says so
    # the containers' output (compose prefixes each line with the host's container; the SDK's own
    # traceback, which fills the end of the log, is left out of the message)
    containers = "\n".join(line for line in log.splitlines() if "algo-" in line)
    # mpirun --tag-output tags each piece it reads, and Python writes a traceback's line in pieces
    # (seen: "[1,0]<stderr>:    [1,0]<stderr>:main()"): the line is looked for with the tags removed
    untagged = re.sub(r"\[\d+,\d+\]<std(?:err|out)>:", "", log)
    assert "ValueError: learning rate must be positive" in untagged, containers[-8000:]
    assert not [line for line in done.stdout.splitlines() if line.startswith("{")]   # no result printed
