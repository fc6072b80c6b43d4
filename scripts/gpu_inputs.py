#!/usr/bin/env python3
"""The GPU flavor's build inputs, and the record of their last verification.

The GPU image takes about 35 minutes to build on this project's 2-core machines, too long for
every CI run, so CI re-verifies it exactly when its inputs change: `make test` compares the hash
of the files below with ``tests/fixtures/gpu-verified.json`` and, when they differ, builds the
GPU image and runs its checks too (tests/unit/test_gpu_verified.py fails a run that skipped them).
`make gpu-verify` builds and checks it and writes the record.

Inputs: everything that decides what the GPU build does or what its checks assert (the
Dockerfile, the pins, the install scripts and patches, the build scripts, the in-image suite
and the host-side GPU image tests). This project's own Python code is flavor-independent and
is tested in the CPU image on every run.

Usage: ``gpu_inputs.py hash`` | ``check`` (exit 1 when the record is stale) |
``record --build-report build/gpu-build.json --checks "N passed"``.
"""

import argparse
import hashlib
import json
import os
import platform
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECORD = REPO / "tests" / "fixtures" / "gpu-verified.json"
INPUTS = ("Dockerfile", ".dockerignore", "versions.env", "docker", "scripts/build-image.sh", "scripts/image-files.sh",
          "scripts/make-base-image.sh", "scripts/gpu-verify.sh", "tests/image/in_image",
          "tests/image/test_gpu_image.py")


def input_files(repo: Path = REPO) -> list[str]:
    """The input files, relative to the repository, sorted (caches and bytecode excluded)."""
    files = []
    for name in INPUTS:
        path = repo / name
        candidates = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        files += [str(p.relative_to(repo)) for p in candidates
                  if "__pycache__" not in p.parts and not p.name.endswith(".pyc")]
    return sorted(files)


def inputs_sha256(repo: Path = REPO) -> str:
    """sha256 over every input file's path and content."""
    digest = hashlib.sha256()
    for name in input_files(repo):
        digest.update(name.encode() + b"\0" + (repo / name).read_bytes() + b"\0")
    return digest.hexdigest()


def recorded_sha256(record: Path = RECORD) -> str | None:
    return json.loads(record.read_text())["inputs_sha256"] if record.exists() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("hash")
    sub.add_parser("check")
    record = sub.add_parser("record")
    record.add_argument("--build-report", required=True, help="scripts/build-image.sh's BUILD_REPORT")
    record.add_argument("--checks", required=True, help="pytest's summary of the GPU image checks")
    args = parser.parse_args(argv)
    current = inputs_sha256()
    if args.command == "hash":
        print(current)
        return 0
    if args.command == "check":
        recorded = recorded_sha256()
        if recorded == current:
            print(f"GPU build verified for these inputs ({RECORD.relative_to(REPO)})")
            return 0
        print(f"GPU build inputs changed since the last verification ({recorded} -> {current}): "
              "the GPU image must be built and checked (make gpu-verify)", file=sys.stderr)
        return 1
    build = json.loads(Path(args.build_report).read_text())
    RECORD.write_text(json.dumps({
        "inputs_sha256": current, "inputs": INPUTS, "verified": build["date"],
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, no GPU",
        "build_s": build["build_s"], "build_budget_s": build["build_budget_s"],
        "size_gb": build["size_gb"], "size_budget_gb": build["size_budget_gb"], "checks": args.checks,
    }, indent=2) + "\n")
    print(f"recorded {RECORD.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
