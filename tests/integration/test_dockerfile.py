"""The Dockerfile without building it: lint, pins as build arguments, and the resolved builds."""

import os
import re
import shlex
import shutil
import subprocess

import pytest

from helpers import BIN, REPO, pins, versions_env


def test_make_lints_the_dockerfile_with_a_config_under_which_any_finding_fails(tmp_path):
    """make lint's hadolint line, with .hadolint.yaml: the Dockerfile has no finding at all, and a
    Dockerfile with only style- and warning-level ones (unpinned apt packages, a cd) fails."""
    hadolint = shutil.which("hadolint", path=str(BIN)) or shutil.which("hadolint")
    lint = subprocess.run(["make", "-n", "lint"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    [line] = [line for line in lint.splitlines() if "hadolint" in line]
    assert line.endswith("hadolint --config .hadolint.yaml Dockerfile"), line
    done = subprocess.run([hadolint, "--config", ".hadolint.yaml", "Dockerfile"], cwd=REPO, capture_output=True,
                          text=True)
    assert done.returncode == 0 and done.stdout == "", done.stdout + done.stderr
    careless = tmp_path / "Dockerfile"
    careless.write_text("FROM debian:bookworm-slim\nRUN cd /tmp && apt-get update && apt-get install -y curl\n")
    done = subprocess.run([hadolint, "--config", ".hadolint.yaml", str(careless)], cwd=REPO, capture_output=True,
                          text=True)
    assert done.returncode == 1, done.stdout
    assert {"DL3003", "DL3008"} <= set(re.findall(r"\b(DL\d{4})\b", done.stdout)), done.stdout


def test_every_pin_is_a_build_argument_and_label_defaults_equal_the_pins():
    text = (REPO / "Dockerfile").read_text()
    builder = text[text.index("AS builder"):text.index("AS runtime")]
    declared = set(re.findall(r"^ARG ([A-Z][A-Z0-9_]*)", builder, re.M))
    pinned = pins()
    missing = set(pinned) - declared
    assert not missing, f"pins the builder stage cannot take as build arguments: {missing}"
    defaults = dict(re.findall(r"^ARG ([A-Z_]+)=(\S+)$", text, re.M))
    checked = {k: v for k, v in defaults.items() if k in pinned}
    assert len(checked) >= 6 and all(pinned[k] == v for k, v in checked.items()), checked


def test_no_base_image_outside_the_local_debian_base():
    """Both flavors build on the base scripts/make-base-image.sh makes; no registry image."""
    text = (REPO / "Dockerfile").read_text()
    bases = set(re.findall(r"^FROM (\S+)", text, re.M))
    assert bases == {"${BASE_IMAGE}", "flavor-${FLAVOR}"}, bases
    assert pins()["BASE_IMAGE"] == "debian:bookworm-slim"


@pytest.mark.parametrize("flavor", ["cpu", "gpu"])
def test_dry_run_prints_the_plain_build_with_no_pin_as_a_build_argument(flavor):
    """The pins come from versions.env inside the build; scripts/build-image.sh's only build
    argument is the flavor, so its Docker build and README's plain `docker build` share layers."""
    env = {k: v for k, v in os.environ.items() if k != "IMAGE"}     # make test sets IMAGE=dtc:cpu
    done = subprocess.run([str(REPO / "scripts" / "build-image.sh")], capture_output=True, text=True,
                          env={**env, "DRY_RUN": "1", "FLAVOR": flavor}, timeout=60)
    assert done.returncode == 0, done.stderr
    command = shlex.split(done.stdout)
    build_args = [command[at + 1] for at, word in enumerate(command) if word == "--build-arg"]
    assert build_args == [f"FLAVOR={flavor}"], build_args
    assert command[-5:] == ["-t", f"dtc:{flavor}", "-f", "Dockerfile", "."]


def test_a_build_argument_overrides_its_pin_in_the_images_versions_env(tmp_path):
    """docker/resolve-pins.sh: what the Dockerfile runs first, so `--build-arg X=...` takes effect;
    the release date beside the overridden pin becomes `unknown`, every other line stays."""
    target = tmp_path / "versions.env"
    shutil.copy(REPO / "versions.env", target)
    env = {k: v for k, v in os.environ.items() if k not in pins()}
    done = subprocess.run([str(REPO / "docker" / "resolve-pins.sh"), str(target)], capture_output=True, text=True,
                          env={**env, "TORCH_GPU_VERSION": "2.13.0+cu129", "NCCL_VERSION": ""}, check=True)
    resolved, committed = versions_env(target), versions_env()
    changed = {"TORCH_GPU_VERSION", "TORCH_GPU_VERSION_RELEASED"}
    assert (resolved["TORCH_GPU_VERSION"], resolved["TORCH_GPU_VERSION_RELEASED"]) == ("2.13.0+cu129", "unknown")
    assert committed["TORCH_GPU_VERSION_RELEASED"] != "unknown"
    assert {k: v for k, v in resolved.items() if k not in changed} == \
        {k: v for k, v in committed.items() if k not in changed}
    assert "TORCH_GPU_VERSION=2.13.0+cu129 (build argument" in done.stderr


def test_the_builder_key_follows_every_input_of_the_builder_stage(tmp_path):
    """docker/builder-key.sh, run as the builder stage runs it (in a copy of /opt/dtc/src: versions.env
    and docker/, the context's build/wheels mounted): the same inputs give the same key; a change
    to the flavor, the torch index, a pin, a docker/ script, or a handed-over wheel gives another,
    so a build never takes an earlier builder output that other inputs made (Dockerfile, builder)."""
    src, wheels = tmp_path / "src", tmp_path / "wheels"
    shutil.copytree(REPO / "docker", src / "docker", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "versions.env", src)
    (wheels / "horovod" / "entry").mkdir(parents=True)
    (wheels / ".gitkeep").write_text("")
    wheel = wheels / "horovod" / "entry" / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl"
    wheel.write_bytes(b"one build")

    def key(**env: str) -> str:
        done = subprocess.run([str(src / "docker" / "builder-key.sh"), str(wheels)], capture_output=True, text=True,
                              env={**os.environ, "FLAVOR": "cpu", "TORCH_INDEX_URL": "auto", **env}, check=True)
        return done.stdout.strip()

    first = key()
    assert re.fullmatch(r"[0-9a-f]{16}", first) and key() == first
    assert key(FLAVOR="gpu") != first and key(TORCH_INDEX_URL="https://download.pytorch.org/whl/cpu") != first
    wheel.write_bytes(b"another build")
    assert key() != first
    wheel.write_bytes(b"one build")
    (src / "docker" / "install-dali.sh").write_text((REPO / "docker" / "install-dali.sh").read_text() + "# changed\n")
    assert key() != first
    shutil.copy(REPO / "docker" / "install-dali.sh", src / "docker")
    assert key() == first
    (src / "versions.env").write_text((REPO / "versions.env").read_text() + "NUMPY_VERSION=0.0.1\n")
    assert key() != first


def test_a_build_with_less_free_disk_than_it_needs_is_refused_in_seconds_naming_the_directory():
    """scripts/build-image.sh's check before anything is built (docs/image.md, Disk): below the free
    disk it needs where the images live (IMAGE_BUILD_FREE_GB here: more than any disk has), exit 3
    within seconds, the first line naming the flavor, the need, the directory and what it has, then
    what frees space and the override; no build started."""
    env = {k: v for k, v in os.environ.items() if k not in ("IMAGE", "DOCKER_HOST")}
    env.update(FLAVOR="cpu", IMAGE="dtc:refused-for-disk", IMAGE_BUILD_FREE_GB="1000000")
    done = subprocess.run([str(REPO / "scripts" / "build-image.sh")], capture_output=True, text=True, timeout=120,
                          env=env)
    assert done.returncode == 3, done.stderr[-3000:]
    [first, *rest] = [line for line in done.stderr.splitlines() if line.startswith("[build-image] ")]
    found = re.fullmatch(r"\[build-image\] error: building the cpu image needs about 1000000 GB free in (\S+), "
                         r"which has (\d+) GB:", first)
    assert found and os.path.isdir(found[1]) and int(found[2]) < 1000000, first
    assert "IMAGE_BUILD_FREE_GB" in "\n".join(rest) and "building dtc:refused-for-disk" not in done.stderr
