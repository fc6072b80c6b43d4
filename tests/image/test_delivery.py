"""buildspec.yml end to end with real parts (issue #12): the buildspec's own commands, run by
dtc_local.buildspec (CodeBuild's phase semantics), against moto's ECR API in server mode (the
repository and login calls of the real AWS CLI) and Debian's docker-registry (Distribution 2.8)
on localhost, with htpasswd authentication whose password is the one moto's
`aws ecr get-login-password` hands out: the login is checked, not waved through.

The image is pushed, then pulled back and run. With podman (the default engine here) it is pulled
into an empty image store; with Docker's engine (scripts/docker-daemon.sh, as CodeBuild runs
Docker: `docker manifest inspect`, `docker login`, `docker push`) its pushed tags are removed and
it is pulled back by the immutable tag, and must be the image the build made. The release's SBOM
and lock are artifacts and an image of their own in the registry; a next release (another commit,
its push step alone) prints what changed in the lock since the previous one. With Docker's engine,
README's plain `docker build` line and its `aws ecr` + `docker push` lines run last, in the same
registry, and give the same layers and tags.
"""

import base64
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import warnings
from pathlib import Path

import pytest

from helpers import (
    BIN,
    BUILDSPEC_IMAGE,
    CONTAINER,
    REPO,
    docker_env,
    docker_image,
    exclusive,
    flavor_image,
    free_port,
    pins,
)

pytestmark = pytest.mark.image
ACCOUNT = "123456789012"          # moto's default account; its ECR token's password is "<account>-auth-token"


def wait_for_port(port: int, process: subprocess.Popen, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, f"server exited with {process.returncode}"
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on port {port} after {timeout_s} s")


@contextlib.contextmanager
def ecr_api(tmp_path: Path):
    """moto's server on a free port; yields the AWS CLI environment that points at it."""
    port = free_port()
    log = open(tmp_path / "moto.log", "w")
    server = subprocess.Popen([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log)
    wait_for_port(port, server)
    try:
        yield {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
               "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1"}
    finally:
        server.terminate()
        server.wait(timeout=10)


@contextlib.contextmanager
def registry(tmp_path: Path):
    """docker-registry with htpasswd auth on a free port; yields (address, podman environment)."""
    if not shutil.which("docker-registry"):
        pytest.fail("docker-registry is missing: scripts/setup-host.sh installs it")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt
        hashed = crypt.crypt(f"{ACCOUNT}-auth-token", crypt.mksalt(crypt.METHOD_BLOWFISH))
    root = tmp_path / "registry"
    root.mkdir()
    (root / "htpasswd").write_text(f"AWS:{hashed}\n")
    port = free_port()
    address = f"127.0.0.1:{port}"
    (root / "config.yml").write_text(
        f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
        f"http:\n  addr: {address}\n  secret: test-only\n"
        f"auth:\n  htpasswd:\n    realm: dtc-test\n    path: {root / 'htpasswd'}\n")
    (root / "registries.conf").write_text(f'[[registry]]\nlocation = "{address}"\ninsecure = true\n')
    log = open(tmp_path / "registry.log", "w")
    server = subprocess.Popen(["docker-registry", "serve", str(root / "config.yml")], stdout=log, stderr=log)
    wait_for_port(port, server)
    env = {"CONTAINERS_REGISTRIES_CONF": str(root / "registries.conf"), "REGISTRY_AUTH_FILE": str(root / "auth.json")}
    try:
        yield address, env
    finally:
        server.terminate()
        server.wait(timeout=10)
        shutil.rmtree(root / "data", ignore_errors=True)      # the pushed layers, about 2 GB
        # the local tags the push made (also when the test failed half way)
        names = subprocess.run([CONTAINER, "images", "--format", "{{.Repository}}:{{.Tag}}"], capture_output=True,
                               text=True).stdout.split()
        for name in names:
            if name.startswith(address + "/"):
                subprocess.run([CONTAINER, "rmi", name], capture_output=True)


def registry_get(repository: str, path: str, accept: str | None = None) -> dict:
    """GET ``/v2/<name>/<path>`` from ``repository``'s registry (its own API, as the login's user), as JSON."""
    address, _, name = repository.partition("/")
    headers = {"Authorization": "Basic " + base64.b64encode(f"AWS:{ACCOUNT}-auth-token".encode()).decode()}
    if accept:
        headers["Accept"] = accept
    request = urllib.request.Request(f"http://{address}/v2/{name}/{path}", headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def registry_tags(repository: str) -> set[str]:
    """The repository's tags (``/v2/<name>/tags/list``); none when the registry does not know it."""
    try:
        return set(registry_get(repository, "tags/list").get("tags") or [])
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return set()
        raise


def registry_layers(repository: str, tag: str) -> list[str]:
    """The layer digests of ``repository:tag``'s manifest in the registry."""
    accept = "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json"
    manifest = registry_get(repository, f"manifests/{tag}", accept=accept)
    return [layer["digest"] for layer in manifest["layers"]]


def run_buildspec(env: dict, artifacts_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dtc_local.buildspec", str(REPO / "buildspec.yml"),
                           "--artifacts-dir", str(artifacts_dir)],
                          cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=3000)


def aws(env: dict, *argv: str) -> dict:
    done = subprocess.run([str(BIN / "aws"), *argv, "--output", "json"], env={**os.environ, **env},
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_buildspec_creates_the_repository_logs_in_tests_and_pushes_an_image_that_pulls_back_and_runs(tmp_path):
    """With podman's engine, then with the project's Docker engine where the run built the image
    with it (helpers.docker_image), each against its own ECR API and registry. One test, so that one
    pytest-xdist worker runs both in turn (buildspec.yml writes build/release/ in the checkout:
    one buildspec at a time) while the others go on with other tests."""
    if flavor_image("cpu") != BUILDSPEC_IMAGE:
        pytest.skip("buildspec.yml builds dtc:<flavor>; this run's image is named otherwise")
    with exclusive("buildspec"):
        for engine in ("podman", "docker"):
            if engine == "docker":
                docker_image()   # waits for make test's Docker build; skips saying why where there is none
            work = tmp_path / engine
            work.mkdir()
            with ecr_api(work) as aws_env, registry(work) as (address, podman_env):
                check_buildspec_release(aws_env, address, podman_env, {} if engine == "podman" else docker_env(),
                                        work)


def check_buildspec_release(ecr_api: dict, address: str, podman_env: dict, engine: dict, tmp_path: Path) -> None:
    """buildspec.yml run by dtc_local.buildspec with the engine ``engine`` selects (``{}``: podman;
    ``docker_env()``: Docker's) against the ECR API ``ecr_api`` and the registry at ``address``:
    repository, login, in-image suite, tags, artifacts, the image pulled back and run, a second
    push of the same commit refused, an image over its size budget not pushed (podman's run), the
    next release's lock changes (the previous release's files image read and not kept in the
    engine's store), README's plain Docker commands (Docker's run)."""
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout.strip()
    env = {**ecr_api, **podman_env, **engine, "REPOSITORY": "team/dtc", "FLAVORS": "cpu", "PUSH_REGISTRY": address,
           "GIT_SHA": sha}   # the commit this test began at, whatever is committed meanwhile
    container = [engine.get("DOCKER", CONTAINER)]
    repository = f"{address}/team/dtc"
    shutil.rmtree(REPO / "build" / "release", ignore_errors=True)

    done = run_buildspec(env, tmp_path / "artifacts")
    assert done.returncode == 0, done.stderr[-6000:]
    # Every phase's commands ran, in CodeBuild's order, from the YAML.
    log = done.stderr
    assert log.index("Entering phase PRE_BUILD") < log.index("release.sh login") < log.index("Entering phase BUILD")
    assert log.index("release.sh build") < log.index("release.sh test") < log.index("release.sh push")
    assert " passed" in done.stdout and "logged in to " + address in log   # the in-image suite's summary

    # The repository was created through the ECR API, scanning on push.
    [created] = aws(ecr_api, "ecr", "describe-repositories", "--repository-names", "team/dtc")["repositories"]
    assert created["repositoryUri"] == f"{ACCOUNT}.dkr.ecr.us-east-1.amazonaws.com/team/dtc"
    assert created["imageScanningConfiguration"]["scanOnPush"] is True

    # An immutable and a descriptive tag; the URI as an artifact and an exported variable.
    pinned = pins()
    immutable = f"cpu-{sha[:12]}"
    descriptive = f"cpu-tf{pinned['TENSORFLOW_VERSION']}-pt{pinned['TORCH_VERSION']}-py{pinned['PYTHON_VERSION']}"
    tags = {immutable, descriptive, f"{immutable}-files", "cpu-files-latest"}   # the last two: SBOM and lock
    assert registry_tags(repository) == tags
    assert json.loads(done.stdout.splitlines()[-1])["exported_variables"] == {"IMAGE_URI": f"{repository}:{immutable}"}
    artifacts = tmp_path / "artifacts"
    assert sorted(p.name for p in artifacts.iterdir()) == [
        "build-cpu.json", "image-uri.txt", "images.json", "lock-changes-cpu.txt", "requirements-cpu.lock",
        "sbom-cpu.cdx.json"]
    in_image = {name: subprocess.run([*container, "run", "--rm", "--network", "none", "dtc:cpu", "cat",
                                      f"/opt/dtc/{name}"], capture_output=True, text=True, check=True,
                                     env={**os.environ, **podman_env, **engine}).stdout
                for name in ("sbom.cdx.json", "requirements.lock")}
    assert (artifacts / "sbom-cpu.cdx.json").read_text() == in_image["sbom.cdx.json"]
    assert (artifacts / "requirements-cpu.lock").read_text() == in_image["requirements.lock"]
    assert (artifacts / "lock-changes-cpu.txt").read_text() == f"first release of cpu in {repository}\n"
    assert (artifacts / "image-uri.txt").read_text().strip() == f"{repository}:{immutable}"
    assert json.loads((artifacts / "images.json").read_text()) == [
        {"flavor": "cpu", "uri": f"{repository}:{immutable}", "descriptive_uri": f"{repository}:{descriptive}"}]
    assert json.loads((artifacts / "build-cpu.json").read_text())["size_gb"] <= 7

    # Pulled back, the image is the one built, and it runs.
    pull_env = {**os.environ, **podman_env, **engine}
    built_id = subprocess.run([*container, "image", "inspect", "--format", "{{.Id}}", "dtc:cpu"],
                              capture_output=True, text=True, check=True, env=pull_env).stdout.strip()
    runroot = tempfile.mkdtemp(prefix="dtc-rr-")           # podman wants a runroot under 50 characters
    if engine:   # Docker: one store; the pushed tags go, and the immutable one comes back from the registry
        fresh = container
        for tag in (immutable, descriptive):
            subprocess.run([*container, "rmi", f"{repository}:{tag}"], capture_output=True, env=pull_env)
        pulled = subprocess.run([*container, "pull", f"{repository}:{immutable}"], capture_output=True, text=True,
                                env=pull_env, timeout=1200)
        pulled_id = subprocess.run([*container, "image", "inspect", "--format", "{{.Id}}", f"{repository}:{immutable}"],
                                   capture_output=True, text=True, env=pull_env).stdout.strip()
    else:        # podman: into an empty image store
        fresh = [CONTAINER, "--root", str(tmp_path / "store"), "--runroot", runroot]
        pulled = subprocess.run([*fresh, "pull", "-q", f"{repository}:{immutable}"], capture_output=True, text=True,
                                env=pull_env, timeout=1200)
        pulled_id = pulled.stdout.strip()
    assert pulled.returncode == 0, pulled.stderr[-3000:]
    assert pulled_id == built_id
    ran = subprocess.run([*fresh, "run", "--rm", "--network", "none", f"{repository}:{immutable}", "python", "-c",
                          "import horovod.torch, horovod.tensorflow, dtc_entrypoint; print('ok')"],
                         capture_output=True, text=True, env=pull_env, timeout=300)
    assert ran.returncode == 0 and ran.stdout.strip().endswith("ok"), ran.stderr[-3000:]
    if engine:
        subprocess.run([*container, "rmi", f"{repository}:{immutable}"], capture_output=True, env=pull_env)
    else:
        subprocess.run([*fresh, "rmi", "-a", "-f"], capture_output=True, env=pull_env)
        shutil.rmtree(tmp_path / "store", ignore_errors=True)
    shutil.rmtree(runroot, ignore_errors=True)

    # The same commit again: the immutable tag is never overwritten, and the build stops after the
    # login (pre_build), before building or testing anything.
    again = run_buildspec(env, tmp_path / "again")
    assert again.returncode != 0
    assert f"{repository}:{immutable} is already in the registry and is never overwritten" in again.stderr
    assert "Entering phase BUILD" not in again.stderr and "release.sh build" not in again.stderr
    assert not (tmp_path / "again").exists()

    # Over the size budget: the build phase fails and nothing is pushed (scripts/build-image.sh's
    # check, whichever engine built: once, with podman's)
    if not engine:
        over = run_buildspec({**env, "GIT_SHA": "0" * 40, "IMAGE_SIZE_BUDGET_GB": "1"}, tmp_path / "over")
        assert over.returncode != 0 and "image is over its size budget" in over.stderr, over.stderr[-3000:]
        assert "release.sh test" not in over.stderr
        assert registry_tags(repository) == tags

    # The next release (another commit): its push pulls the previous release's files back and prints
    # what changed in the lock. Here the previous lock had numpy from other bytes at the same version
    # (its files image replaced in the registry by one whose lock says so).
    lock = in_image["requirements.lock"]
    requirements = [line for line in lock.splitlines() if not line.startswith(("#", "-"))]
    [numpy] = [line for line in requirements if line.startswith("numpy==")]
    pin, real_hash = numpy.split(" --hash=sha256:")
    previous = tmp_path / "previous"
    previous.mkdir()
    (previous / "requirements.lock").write_text(lock.replace(numpy, f"{pin} --hash=sha256:{'f' * 64}"))
    (previous / "sbom.cdx.json").write_text(in_image["sbom.cdx.json"])
    (previous / "Containerfile").write_text("FROM scratch\nCOPY sbom.cdx.json requirements.lock /\n")
    engine_env = {**os.environ, **podman_env, **engine}
    built = subprocess.run([*container, "build", "-q", "--label", "org.opencontainers.image.revision=previous", "-t",
                            f"{repository}:cpu-files-latest", "-f", str(previous / "Containerfile"), str(previous)],
                           check=True, capture_output=True, text=True, env=engine_env, timeout=300)
    previous_id = built.stdout.split()[-1]
    subprocess.run([*container, "push", f"{repository}:cpu-files-latest"], check=True, capture_output=True,
                   env=engine_env, timeout=300)
    release_dir = tmp_path / "next"
    release_dir.mkdir()
    shutil.copy(REPO / "build" / "release" / "repository-uri", release_dir)
    following = subprocess.run(["scripts/release.sh", "push"], cwd=REPO, capture_output=True, text=True,
                               env={**os.environ, **env, "GIT_SHA": "1" * 40, "RELEASE_DIR": str(release_dir)},
                               timeout=1800)
    assert following.returncode == 0, following.stderr[-4000:]
    change = (f"! numpy {pin.split('==')[1]}: another wheel at the same version on the index "
              f"(sha256 {'f' * 12} -> {real_hash[:12]})")
    assert (release_dir / "lock-changes-cpu.txt").read_text() == (
        f"{change}\n1 of {len(requirements)} distributions changed\n")
    assert "changes since the previous release (previous):" in following.stderr and change in following.stderr
    assert registry_tags(repository) == tags | {"cpu-111111111111", "cpu-111111111111-files"}
    # The previous release's files, pulled to read their lock, keep no name in this registry in the
    # engine's store, so nothing holds them there for this release (without the release's rmi they
    # stayed, named by the digest the push gave them). Where no other name holds them, they are gone.
    kept = subprocess.run([*container, "image", "inspect", "--format", "{{json .RepoTags}} {{json .RepoDigests}}",
                           previous_id], capture_output=True, text=True, env=engine_env)
    names = [] if kept.returncode else [name for part in kept.stdout.split() for name in json.loads(part) or []]
    assert not [name for name in names if name.startswith(f"{address}/")], names
    # (the descriptive tag again: the next release's push tagged it anew, and left here it would keep
    # this image's 5 GB of layers in the engine's store after the next build)
    for tag in (f"{immutable}-files", "cpu-files-latest", "cpu-111111111111", "cpu-111111111111-files", descriptive):
        subprocess.run([*container, "rmi", f"{repository}:{tag}"], capture_output=True, env=pull_env)
    if engine:
        check_readme_docker_commands(ecr_api, address, engine, tmp_path, {immutable, descriptive})


def readme_block(first: str) -> str:
    """README.md's fenced bash block whose first line starts with ``first``."""
    blocks = re.findall(r"^```bash\n(.*?)^```", (REPO / "README.md").read_text(), re.S | re.M)
    [block] = [block for block in blocks if block.startswith(first)]
    return block


def check_readme_docker_commands(ecr_api: dict, address: str, engine: dict, tmp_path: Path,
                                 release_tags: set[str]) -> None:
    """README's plain Docker commands for the CPU flavor (1. Build the image, 2. Push it to Amazon
    ECR), after the buildspec's release with Docker's engine, against the same ECR API and registry.
    The build line, the image named dtc-readme:cpu (the tests' dtc:cpu keeps its labels), reuses
    every layer of scripts/build-image.sh's Docker build: the same layer digests. The push lines, run
    as written with FLAVOR=cpu, REGISTRY checked to be moto's account's ECR address and then set to
    the local registry's, give the repository `dtc` the release's two image tags, on the same image."""
    work = tmp_path / "readme"
    (work / "bin").mkdir(parents=True)
    (work / "bin" / "docker").symlink_to(engine["DOCKER"])
    (work / "bin" / "aws").symlink_to(BIN / "aws")
    env = {**os.environ, **ecr_api, **engine, "PATH": f"{work / 'bin'}:{os.environ['PATH']}",
           "DOCKER_CONFIG": str(work / "docker-config")}

    def layers(image: str) -> list[str]:
        return json.loads(subprocess.run([engine["DOCKER"], "image", "inspect", "--format", "{{json .RootFS.Layers}}",
                                          image], capture_output=True, text=True, check=True, env=env).stdout)

    [build] = [line.split("#")[0].strip() for line in readme_block("DOCKER_BUILDKIT=1 docker build").splitlines()
               if "FLAVOR=cpu" in line]
    assert build.endswith(" -t dtc:cpu ."), build
    # build/wheels as the buildspec's build staged it: builds in this checkout take its lock
    with exclusive("build-image"):
        (REPO / "build" / "build-image.owner").write_text("tests/image/test_delivery.py: README's build line\n")
        built = subprocess.run(["bash", "-c", build.replace(" -t dtc:cpu ", " -t dtc-readme:cpu ")], cwd=REPO,
                               env=env, capture_output=True, text=True, timeout=1200)
    assert built.returncode == 0, built.stderr[-4000:]
    try:
        assert layers("dtc-readme:cpu") == layers(docker_image())

        lines = readme_block("FLAVOR=gpu").splitlines()
        assert lines[0].startswith("FLAVOR=gpu ") and lines[2].startswith("REGISTRY=")
        computed = subprocess.run(["bash", "-c", f"REGION=us-east-1; {lines[2]}; echo \"$REGISTRY\""],
                                  env=env, capture_output=True, text=True, check=True).stdout.strip()
        assert computed == f"{ACCOUNT}.dkr.ecr.us-east-1.amazonaws.com"
        script = "\n".join(["set -euo pipefail", "FLAVOR=cpu", *lines[1:2], f"REGISTRY={address}", *lines[3:]])
        pushed = subprocess.run(["bash", "-c", script.replace('"dtc:$FLAVOR"', '"dtc-readme:$FLAVOR"')], cwd=REPO,
                                env=env, capture_output=True, text=True, timeout=1200)
        assert pushed.returncode == 0, pushed.stderr[-4000:]
        assert registry_tags(f"{address}/dtc") == release_tags
        [repository] = aws(ecr_api, "ecr", "describe-repositories", "--repository-names", "dtc")["repositories"]
        assert repository["imageScanningConfiguration"]["scanOnPush"] is True
        released = registry_layers(f"{address}/team/dtc", sorted(release_tags)[0])
        assert {tag: registry_layers(f"{address}/dtc", tag) for tag in release_tags} == \
            {tag: released for tag in release_tags}
    finally:
        for image in ("dtc-readme:cpu", *(f"{address}/dtc:{tag}" for tag in release_tags)):
            subprocess.run([engine["DOCKER"], "rmi", image], capture_output=True, env=env)


def test_make_push_needs_a_region_and_takes_aws_region_by_default():
    unset = {k: v for k, v in os.environ.items() if k not in ("AWS_REGION", "AWS_DEFAULT_REGION")}
    done = subprocess.run(["make", "-s", "push", "REGION="], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 2 and "make push needs REGION=" in done.stderr
    done = subprocess.run(["make", "-s", "push"], cwd=REPO, capture_output=True, text=True, env=unset)
    assert done.returncode == 2 and "make push needs REGION=" in done.stderr
    planned = subprocess.run(["make", "-n", "push"], cwd=REPO, capture_output=True, text=True,
                             env={**unset, "AWS_REGION": "eu-west-1"})
    assert planned.returncode == 0 and "REGION=eu-west-1 REPOSITORY=dtc" in planned.stdout, planned.stdout
