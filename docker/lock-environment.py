"""Writes the lock of the builder stage's environment and keeps the wheels it was built from locally.

Usage (the builder stage, with the environment's own interpreter):
    python lock-environment.py OUT_DIR [--extra-index-url URL] --search DIR [--search DIR ...]

Writes OUT_DIR/requirements.lock: one line for every distribution installed in the running
interpreter's environment, sorted, after pip options (``--only-binary=:all:``, and
``--extra-index-url URL`` when given: the index the frameworks came from). A distribution that a
wheel under a ``--search`` directory holds, byte for byte (its RECORD's hashes equal the installed
files' hashes), is copied into OUT_DIR and locked as ``name @ file://OUT_DIR/<wheel>`` with its
sha256 in a comment: the wheels compiled in the builder stage (Horovod, mpi4py, the DALI
TensorFlow plugin, sagemaker-training's extension, pip's wheels of sdists, the CPU flavor's
patched torchvision where PyTorch's CPU index was not used) and a wheel handed in from the build
context (the CPU torch). A direct reference, because the index may hold a wheel of
the same version that pip would rank higher (PyPI's mpi4py, built for MPICH and Open MPI, not
against the image's Open MPI). Every other distribution is locked as ``name==version``.
``pip install --no-deps -r requirements.lock`` then rebuilds the same environment in the runtime
stage without a compiler, and a change to a locally built wheel changes the lock (the runtime
stage copies the lock, so its layer cache follows).

Also writes OUT_DIR/constraint.txt, the image's pip constraint file (/etc/pip/constraint.txt,
PIP_CONSTRAINT; NGC's PyTorch images have one at that path since 25.03): ``name==version`` for
every installed distribution that is compiled against another one or that Horovod, DALI and
mpi4py were built against (``PROTECTED``), so that no pip run in the container replaces them.

Raises SystemExit (exit 1) naming the distribution when two different wheels match one installed
distribution, or when an installed distribution has no RECORD.

Why: a layer of the builder's environment would hold 5 GB (cpu) to 11 GB (gpu) of disk that
the runtime stage then copies a second and third time (docs/image.md, Disk).
"""
from __future__ import annotations

import argparse
import csv
import fnmatch
import hashlib
import io
import shutil
import sys
import zipfile
from importlib import metadata
from pathlib import Path

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

# Distributions no pip run in the image may replace (fnmatch patterns of canonical names): the
# frameworks, what is compiled against them (torchvision, torchaudio, triton, tf-keras), what was
# built here against them or against the image's Open MPI (horovod, mpi4py, deepspeed, the DALI plugin), numpy
# (the frameworks' C API), and the CUDA libraries the GPU flavor's builds load (nvidia-*, DALI too).
PROTECTED = ("torch", "torchvision", "torchaudio", "triton", "tensorflow", "tf-keras", "horovod", "mpi4py",
             "deepspeed", "numpy", "nvidia-*")


def _record_hashes(lines: list[str]) -> dict[str, str]:
    """Path -> ``sha256=...`` for a RECORD's files that install where the wheel holds them (not its
    .dist-info, nor its .data scripts and headers, whose paths and shebangs change on install)."""
    def kept(path: str) -> bool:
        top = path.split("/", 1)[0]
        return not (top.endswith((".dist-info", ".data")) or top == "..")
    return {row[0]: row[1] for row in csv.reader(lines) if len(row) >= 2 and row[1] and kept(row[0])}


def _installed(dist: metadata.Distribution) -> dict[str, str]:
    record = dist.read_text("RECORD")
    if record is None:
        sys.exit(f"lock-environment: {dist.metadata['Name']} has no RECORD; it cannot be locked")
    return _record_hashes(record.splitlines())


def _wheel_record(path: Path) -> dict[str, str]:
    with zipfile.ZipFile(path) as wheel:
        name = next(n for n in wheel.namelist() if n.endswith(".dist-info/RECORD"))
        return _record_hashes(io.TextIOWrapper(wheel.open(name), encoding="utf-8").readlines())


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--search", type=Path, action="append", default=[])
    parser.add_argument("--extra-index-url", default="")
    args = parser.parse_args(argv)

    candidates: dict[tuple[str, str], list[Path]] = {}
    for root in args.search:
        for path in sorted(root.rglob("*.whl")) if root.is_dir() else []:
            try:
                name, version, _, _ = parse_wheel_filename(path.name)
            except InvalidWheelFilename:
                continue
            candidates.setdefault((name, str(version)), []).append(path)

    args.out_dir.mkdir(parents=True, exist_ok=True)
    pins, local, constraints = [], [], []
    for dist in sorted(metadata.distributions(), key=lambda d: canonicalize_name(d.metadata["Name"])):
        name, version = canonicalize_name(dist.metadata["Name"]), dist.version
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in PROTECTED):
            constraints.append(f"{name}=={version}")
        wanted = None
        for path in candidates.get((name, version), []):
            record, installed = _wheel_record(path), _installed(dist)
            if record and all(installed.get(path_) == hash_ for path_, hash_ in record.items()):
                if wanted is not None and _sha256(wanted) != _sha256(path):
                    sys.exit(f"lock-environment: two different wheels match the installed {name} {version}: "
                             f"{wanted} and {path}")
                wanted = path
        if wanted is None:
            pins.append(f"{name}=={version}")
        else:
            shutil.copy2(wanted, args.out_dir / wanted.name)
            local.append(f"# {wanted.name} sha256={_sha256(wanted)}")
            pins.append(f"{name} @ file://{(args.out_dir / wanted.name).resolve()}")

    options = ["--only-binary=:all:"]
    if args.extra_index_url:
        options.append(f"--extra-index-url {args.extra_index_url}")
    lock = ["# The image's environment: docker/lock-environment.py wrote it in the builder stage;",
            "# the runtime stage installs it with pip install --no-deps -r (docker/install-locked-environment.sh).",
            "# Wheels built or handed in locally, in the same directory:", *local, *options, *pins]
    (args.out_dir / "requirements.lock").write_text("\n".join(lock) + "\n")
    header = ["# The image's pip constraint file (PIP_CONSTRAINT): builds compiled against each other, which no",
              "# pip run may replace. docker/lock-environment.py wrote it; docs/versions.md, Protected pins, says",
              "# how to use another version (a derived image) or lift it (PIP_CONSTRAINT='', at your own risk)."]
    (args.out_dir / "constraint.txt").write_text("\n".join(header + sorted(constraints)) + "\n")
    print(f"lock-environment: {len(pins)} distributions, {len(local)} from local wheels, "
          f"{len(constraints)} constrained", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
