"""Writes the lock of the builder stage's environment and keeps the wheels it was built from locally.

Usage (the builder stage, with the environment's own interpreter):
    python lock-environment.py OUT_DIR [--extra-index-url URL] --search DIR [--search DIR ...]

Writes OUT_DIR/requirements.lock: one line for every distribution installed in the running
interpreter's environment, sorted, after pip options (``--only-binary=:all:``, and
``--extra-index-url URL`` when given: the index the frameworks came from), each with the sha256
of the wheel it was installed from (``--hash=sha256:<64 hex>``, pip's hash-checking mode). A
distribution that a wheel under a ``--search`` directory holds, byte for byte (its RECORD's hashes
equal the installed files' hashes, and its METADATA the installed one), is copied into OUT_DIR and locked as
``name @ file://OUT_DIR/<wheel> --hash=...`` (also listed in a ``# <wheel> sha256=<hex>`` comment):
the wheels compiled in the builder stage (Horovod, mpi4py, the DALI TensorFlow plugin,
sagemaker-training's extension, pip's wheels of sdists, the CPU flavor's patched torchvision where
PyTorch's CPU index was not used) and a wheel handed in from the build context (the CPU torch). A
direct reference, because the index may hold a wheel of the same version that pip would rank
higher (PyPI's mpi4py, built for MPICH and Open MPI, not against the image's Open MPI). Every
other distribution is locked as ``name==version --hash=...``, the hash of the wheel pip downloads
for that pin again here (from pip's cache, just filled by the install) after checking that its
RECORD equals the installed one, so the hash is that of the wheel really installed.
``pip install --no-deps --require-hashes -r requirements.lock`` then rebuilds the same environment
in the runtime stage without a compiler, and refuses any wheel whose bytes differ (a substituted
upload, a poisoned cache); a change to a locally built wheel changes the lock (the runtime stage
copies the lock, so its layer cache follows). pip's hash-checking mode: pip's documentation,
"Secure installs" (https://pip.pypa.io/en/stable/topics/secure-installs/).

Also writes OUT_DIR/constraint.txt, the image's pip constraint file (/etc/pip/constraint.txt,
PIP_CONSTRAINT; NGC's PyTorch images have one at that path since 25.03): ``name==version`` for
every installed distribution that is compiled against another one or that Horovod, DALI and
mpi4py were built against (``PROTECTED``), so that no pip run in the container replaces them.

Raises SystemExit (exit 1) naming the distribution when two different wheels match one installed
distribution, when an installed distribution has no RECORD, when pip cannot download a binary wheel
of a pin, or when the downloaded wheel is not the installed one.

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
import subprocess
import sys
import tempfile
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
    """Path in site-packages -> ``sha256=...`` for a RECORD's files that install there: a wheel's
    files at its top and under ``<name>.data/purelib/`` or ``platlib/`` (libclang's are all there),
    not its .dist-info (pip adds and rewrites files there), nor its other .data directories
    (scripts, headers: their paths and shebangs change on install)."""
    hashes = {}
    for row in csv.reader(lines):
        if len(row) < 2 or not row[1]:
            continue
        path = row[0]
        top, _, rest = path.partition("/")
        if top.endswith(".data") and rest.startswith(("purelib/", "platlib/")):
            path = rest.split("/", 1)[1]
        elif top.endswith((".dist-info", ".data")) or top == "..":
            continue
        hashes[path] = row[1]
    return hashes


def _installed(dist: metadata.Distribution) -> dict[str, str]:
    record = dist.read_text("RECORD")
    if record is None:
        sys.exit(f"lock-environment: {dist.metadata['Name']} has no RECORD; it cannot be locked")
    return _record_hashes(record.splitlines())


def _wheel_record(path: Path) -> tuple[dict[str, str], str]:
    """The wheel's RECORD hashes (as _record_hashes) and its METADATA's text (pip installs it verbatim)."""
    with zipfile.ZipFile(path) as wheel:
        names = wheel.namelist()
        # the wheel's own .dist-info, at its top (setuptools vendors packages with theirs deeper down)
        record = next(n for n in names if n.count("/") == 1 and n.endswith(".dist-info/RECORD"))
        metadata_text = io.TextIOWrapper(wheel.open(record[:-len("RECORD")] + "METADATA"), encoding="utf-8").read()
        return _record_hashes(io.TextIOWrapper(wheel.open(record), encoding="utf-8").readlines()), metadata_text


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _wheels(roots: list[Path]) -> dict[tuple[str, str], list[Path]]:
    """(canonical name, version) -> the wheel files under ``roots`` (recursively)."""
    found: dict[tuple[str, str], list[Path]] = {}
    for root in roots:
        for path in sorted(root.rglob("*.whl")) if root.is_dir() else []:
            try:
                name, version, _, _ = parse_wheel_filename(path.name)
            except InvalidWheelFilename:
                continue
            found.setdefault((canonicalize_name(name), str(version)), []).append(path)
    return found


def _matching_wheel(dist: metadata.Distribution, name: str, paths: list[Path]) -> Path | None:
    """The one wheel of ``paths`` whose METADATA equals the installed distribution's and whose RECORD's
    hashes all match the installed files, else None; exits when two different wheels match."""
    wanted = None
    for path in paths:
        (record, metadata_text), installed = _wheel_record(path), _installed(dist)
        if metadata_text == dist.read_text("METADATA") and all(
                installed.get(path_) == hash_ for path_, hash_ in record.items()):
            if wanted is not None and _sha256(wanted) != _sha256(path):
                sys.exit(f"lock-environment: two different wheels match the installed {name} {dist.version}: "
                         f"{wanted} and {path}")
            wanted = path
    return wanted


def _index_hashes(dists: list[metadata.Distribution], options: list[str], batch: int = 25) -> dict[str, str]:
    """Canonical name -> sha256 of the wheel pip downloads for ``name==version`` with ``options``
    (the lock's own), checked against the installed distribution's RECORD. In batches, each
    deleted once hashed, so that the GPU flavor's 7 GB of wheels are never on disk twice."""
    hashes: dict[str, str] = {}
    for start in range(0, len(dists), batch):
        part = dists[start:start + batch]
        with tempfile.TemporaryDirectory(prefix="lock-download-") as tmp:
            pins = [f"{canonicalize_name(d.metadata['Name'])}=={d.version}" for d in part]
            done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                                   "--no-deps", "-d", tmp, *" ".join(options).split(), *pins],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                sys.exit(f"lock-environment: pip cannot download a binary wheel of one of {' '.join(pins)}, "
                         f"so the runtime stage could not install it: {done.stderr.strip()[-2000:]}")
            wheels = _wheels([Path(tmp)])
            for dist in part:
                name = canonicalize_name(dist.metadata["Name"])
                wheel = _matching_wheel(dist, name, wheels.get((name, dist.version), []))
                if wheel is None:
                    sys.exit(f"lock-environment: the wheel pip downloads for {name}=={dist.version} is not the "
                             f"one installed (its RECORD differs): {sorted(p.name for p in Path(tmp).iterdir())}")
                hashes[name] = _sha256(wheel)
    return hashes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--search", type=Path, action="append", default=[])
    parser.add_argument("--extra-index-url", default="")
    args = parser.parse_args(argv)

    options = ["--only-binary=:all:"]
    if args.extra_index_url:
        options.append(f"--extra-index-url {args.extra_index_url}")
    candidates = _wheels(args.search)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    local, constraints, lines, from_index = [], [], {}, []
    for dist in sorted(metadata.distributions(), key=lambda d: canonicalize_name(d.metadata["Name"])):
        name, version = canonicalize_name(dist.metadata["Name"]), dist.version
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in PROTECTED):
            constraints.append(f"{name}=={version}")
        wanted = _matching_wheel(dist, name, candidates.get((name, version), []))
        if wanted is None:
            from_index.append(dist)
            lines[name] = f"{name}=={version}"
        else:
            shutil.copy2(wanted, args.out_dir / wanted.name)
            digest = _sha256(wanted)
            local.append(f"# {wanted.name} sha256={digest}")
            lines[name] = f"{name} @ file://{(args.out_dir / wanted.name).resolve()} --hash=sha256:{digest}"
    for name, digest in _index_hashes(from_index, options).items():
        lines[name] += f" --hash=sha256:{digest}"

    lock = ["# The image's environment: docker/lock-environment.py wrote it in the builder stage;",
            "# the runtime stage installs it with pip install --no-deps --require-hashes -r",
            "# (docker/install-locked-environment.sh). Wheels built or handed in locally, in the same directory:",
            *local, *options, *lines.values()]
    (args.out_dir / "requirements.lock").write_text("\n".join(lock) + "\n")
    header = ["# The image's pip constraint file (PIP_CONSTRAINT): builds compiled against each other, which no",
              "# pip run may replace. docker/lock-environment.py wrote it; docs/versions.md, Protected pins, says",
              "# how to use another version (a derived image) or lift it (PIP_CONSTRAINT='', at your own risk)."]
    (args.out_dir / "constraint.txt").write_text("\n".join(header + sorted(constraints)) + "\n")
    print(f"lock-environment: {len(lines)} distributions, {len(local)} from local wheels, "
          f"{len(from_index)} from the index, {len(constraints)} constrained", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
