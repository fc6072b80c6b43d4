"""docker/lock-environment.py and the runtime stage's install of its lock, on small real wheels: every
line carries its wheel's sha256, the lock rebuilds the environment, and a wheel of the same name and
version with other bytes is refused (pip's hash-checking mode)."""

import ensurepip
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import REPO, pins

LOCK_ENVIRONMENT = REPO / "docker" / "lock-environment.py"


def make_wheel(where: Path, name: str, version: str, body: str) -> Path:
    """A pure-Python wheel of one module, built with pip from a tiny setuptools project."""
    project = where / f"src-{name}-{version}-{hashlib.sha256(body.encode()).hexdigest()[:8]}"
    project.mkdir(parents=True)
    (project / "pyproject.toml").write_text(
        f'[project]\nname = "{name}"\nversion = "{version}"\n[tool.setuptools]\npy-modules = ["{name}"]\n')
    (project / f"{name}.py").write_text(body)
    out = where / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(out), str(project)], check=True, capture_output=True, timeout=300)
    [wheel] = out.glob(f"{name}-{version}-*.whl")
    target = where / wheel.name
    wheel.rename(target)
    return target


def venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=300)
    return path / "bin" / "python"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def installed(python: Path) -> set[tuple[str, str]]:
    """(name, version) of every distribution in the environment of ``python``."""
    listed = subprocess.run([str(python), "-m", "pip", "list", "--format", "json"], capture_output=True, text=True,
                            check=True).stdout
    return {(d["name"].lower(), d["version"]) for d in json.loads(listed)}


def test_the_lock_hashes_every_wheel_and_refuses_a_substituted_one(tmp_path):
    index, built = tmp_path / "index", tmp_path / "built"
    index.mkdir()
    built.mkdir()
    # "the index": a find-links directory, with the wheels venv's bundled pip and setuptools came from
    bundled = Path(ensurepip.__file__).parent / "_bundled"
    for wheel in bundled.glob("*.whl"):
        (index / wheel.name).write_bytes(wheel.read_bytes())
    # lock-environment.py's own requirement, from PyPI (pip's cache after the host setup)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "-d",
                    str(index), f"packaging=={pins()['PACKAGING_VERSION']}"], check=True, timeout=300)
    alpha = make_wheel(index, "alpha", "1.0", "VALUE = 1\n")
    beta = make_wheel(index, "beta", "2.0", "VALUE = 2\n")
    gamma = make_wheel(built, "gamma", "3.0", "VALUE = 3\n")   # "compiled in the builder stage"
    offline = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(index), "PIP_CONSTRAINT": "",
               "PIP_DISABLE_PIP_VERSION_CHECK": "1"}

    builder = venv(tmp_path / "builder")
    subprocess.run([str(builder), "-m", "pip", "install", "--quiet", "alpha==1.0", "beta==2.0", "packaging",
                    str(gamma)], check=True, env=offline, timeout=300)
    out = tmp_path / "wheels"
    done = subprocess.run([str(builder), str(LOCK_ENVIRONMENT), str(out), "--search", str(built)],
                          capture_output=True, text=True, env=offline, timeout=300)
    assert done.returncode == 0, done.stderr
    lock = (out / "requirements.lock").read_text().splitlines()
    requirements = [line for line in lock if not line.startswith(("#", "-"))]
    assert f"alpha==1.0 --hash=sha256:{sha256(alpha)}" in requirements
    assert f"beta==2.0 --hash=sha256:{sha256(beta)}" in requirements
    assert f"gamma @ file://{out / gamma.name} --hash=sha256:{sha256(gamma)}" in requirements
    assert f"# {gamma.name} sha256={sha256(gamma)}" in lock
    assert len(requirements) == len(installed(builder)) and all(" --hash=sha256:" in line for line in requirements)
    assert "6 distributions, 1 from local wheels, 5 from the index" in done.stderr

    runtime = venv(tmp_path / "runtime")
    subprocess.run([str(runtime), "-m", "pip", "install", "--quiet", "--no-deps", "--require-hashes", "-r",
                    str(out / "requirements.lock")], check=True, env=offline, timeout=300)
    assert installed(runtime) == installed(builder)

    # the same name and version, other bytes, where the install looks: refused, nothing installed
    substituted = tmp_path / "substituted"
    substituted.mkdir()
    for wheel in index.glob("*.whl"):
        if not wheel.name.startswith("alpha-"):
            (substituted / wheel.name).write_bytes(wheel.read_bytes())
    forged = make_wheel(substituted, "alpha", "1.0", "VALUE = 'forged'\n")
    assert forged.name == alpha.name and sha256(forged) != sha256(alpha)
    third = venv(tmp_path / "third")
    done = subprocess.run([str(third), "-m", "pip", "install", "--no-deps", "--require-hashes", "-r",
                           str(out / "requirements.lock")], capture_output=True, text=True,
                          env={**offline, "PIP_FIND_LINKS": str(substituted)}, timeout=300)
    assert done.returncode == 1
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in done.stderr
    assert f"Expected sha256 {sha256(alpha)}" in done.stderr and f"Got        {sha256(forged)}" in done.stderr
    assert "alpha" not in {name for name, _ in installed(third)}
