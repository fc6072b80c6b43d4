"""Writes the image's SBOM: CycloneDX 1.6 JSON of what is really installed in it.

Usage (the runtime stage's last step, run by docker/write-sbom.sh with an interpreter that has
cyclonedx-bom, the CycloneDX project's generator for Python environments):
    python sbom.py --python /opt/dtc/venv/bin/python --lock /opt/dtc/requirements.lock \
        --versions /opt/dtc/src/versions.env --pyproject /opt/dtc/src/pyproject.toml \
        --patches /opt/dtc/src/docker/patches --flavor cpu|gpu OUT

What it holds:
- every Python distribution of the image's environment, as ``cyclonedx-py environment`` reads it
  (name, version, purl ``pkg:pypi/...``, with ``?file_name=<wheel>`` for a wheel installed from a
  file, declared licenses, project URLs, dependencies), with the
  sha256 of the wheel it was installed from (``hashes``, SHA-256: the lock's ``--hash``, which pip
  checked when it installed the wheel: docker/lock-environment.py); this project (``dtc``) is the
  BOM's ``metadata.component``, installed from source;
- every Debian package (``dpkg-query``), purl ``pkg:deb/debian/<name>@<version>?arch=..&distro=debian-<N>``
  (purl spec, https://github.com/package-url/purl-spec), with its source package; Open MPI is Debian's;
- for each component compiled here (a ``linux_x86_64`` wheel of the lock: Horovod, mpi4py,
  DeepSpeed with its prebuilt CPU op, the DALI TF plugin, sagemaker-training's extension) or
  patched here (torchvision, build tag 1), its source distribution as an external reference
  (``source-distribution``), the docker/ script that built it, the hardening flags, and, for
  Horovod and torchvision, every patch file applied in ``pedigree.patches`` (type ``unofficial``,
  the diff's text, whose header names the upstream issue or PR);
- every pin of versions.env (``metadata.properties``, ``dtc:pin:<KEY>`` and
  ``dtc:pin:<KEY>:released``), and on each component a pin names, ``dtc:pin:released`` with the
  pin's release date: the age of every pin.

The result is validated against CycloneDX 1.6's JSON schema (cyclonedx-python-lib's strict
validator) before it is written. Raises SystemExit (exit 1) on a schema error, or when a Python
distribution other than this project has no hash in the lock. Output is reproducible (no serial
number, no timestamp: the image's own creation date dates it).
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from packageurl import PackageURL
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

# Pins whose distributions are not named after the key (<NAME>_VERSION -> <name>).
PIN_NAMES = {
    "DALI_VERSION": ("nvidia-dali-cuda120", "nvidia-dali-tf-plugin-cuda120"),
    "TORCH_GPU_VERSION": ("torch",), "TORCHVISION_GPU_VERSION": ("torchvision",),
    "TORCHAUDIO_GPU_VERSION": ("torchaudio",), "TF_NVCC_CU12_VERSION": ("nvidia-cuda-nvcc-cu12",),
    "NCCL_VERSION": ("nvidia-nccl-cu12",), "OPENMPI_DEB_VERSION": ("openmpi-bin", "libopenmpi3", "openmpi-common"),
}
# Components compiled or patched here: the docker/ script that does it, and the patch directories.
BUILT_BY = {
    "horovod": ("docker/build-horovod.sh", ("", "gpu")), "mpi4py": ("docker/install-mpi4py.sh", ()),
    "deepspeed": ("docker/install-deepspeed.sh", ()), "sagemaker-training": ("docker/install-python-packages.sh", ()),
    "nvidia-dali-tf-plugin-cuda120": ("docker/install-dali.sh", ()),
    "torchvision": ("docker/install-python-packages.sh", ("torchvision",)),
}
HARDENING = "-O2 -fstack-protector-strong -D_FORTIFY_SOURCE=2 -Wl,-z,relro,-z,now (docker/lib.sh)"
LOCK_LINE = re.compile(r"^(?P<name>[A-Za-z0-9._-]+)(?:==\S+| @ file://(?P<wheel>\S+))"
                       r" --hash=sha256:(?P<sha256>[0-9a-f]{64})$")


def read_lock(path: Path) -> dict[str, tuple[str, str | None]]:
    """Canonical name -> (sha256 of its wheel, the local wheel's file name or None), from a lock
    docker/lock-environment.py wrote."""
    found = {}
    for line in path.read_text().splitlines():
        if match := LOCK_LINE.match(line):
            wheel = Path(match["wheel"]).name if match["wheel"] else None
            found[canonicalize_name(match["name"])] = (match["sha256"], wheel)
    return found


def read_versions(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """(pins, release dates by pin key) of a versions.env."""
    values = dict(line.split("=", 1) for line in path.read_text().splitlines()
                  if re.match(r"^[A-Z][A-Z0-9_]*=", line))
    dates = {key[:-len("_RELEASED")]: value for key, value in values.items() if key.endswith("_RELEASED")}
    return {key: value for key, value in values.items() if not key.endswith("_RELEASED")}, dates


def debian_components() -> list[dict]:
    """Every installed Debian package as a CycloneDX component (dpkg-query)."""
    os_release = {key: value.strip('"') for key, value in
                  (line.split("=", 1) for line in Path("/etc/os-release").read_text().splitlines() if "=" in line)}
    distro = f"{os_release.get('ID', 'debian')}-{os_release.get('VERSION_ID', '')}"
    out = subprocess.run(["dpkg-query", "-W", "-f", "${db:Status-Status}\t${Package}\t${Version}\t${Architecture}\t"
                          "${source:Package}\t${source:Version}\n"], capture_output=True, text=True, check=True).stdout
    components = []
    for line in sorted(out.splitlines()):
        status, name, version, arch, source, source_version = line.split("\t")
        if status != "installed":
            continue
        purl = PackageURL(type="deb", namespace="debian", name=name, version=version,
                          qualifiers={"arch": arch, "distro": distro}).to_string()
        components.append({"type": "library", "bom-ref": purl, "name": name, "version": version, "purl": purl,
                           "properties": [{"name": "dtc:debian:source", "value": f"{source} {source_version}"}]})
    return components


def python_bom(python: str, pyproject: Path) -> dict:
    """cyclonedx-py's BOM of the environment of the interpreter ``python``."""
    done = subprocess.run([sys.executable, "-m", "cyclonedx_py", "environment", "--output-reproducible",
                           "--pyproject", str(pyproject), "--mc-type", "application", "--sv", "1.6",
                           "--of", "JSON", "-o", "-", python], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"sbom: cyclonedx-py failed on {python}: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout)


def built_here(wheel: str | None) -> bool:
    """A local wheel no index serves: compiled here (platform linux_x86_64) or repacked with a build tag."""
    if wheel is None:
        return False
    _, _, build, tags = parse_wheel_filename(wheel)
    return bool(build) or any(tag.platform == "linux_x86_64" for tag in tags)


def add_pedigree(component: dict, name: str, version: str, patches: Path, flavor: str) -> None:
    script, patch_dirs = BUILT_BY.get(name, ("docker/ (a wheel built from its sdist)", ()))
    component.setdefault("externalReferences", []).append(
        {"type": "source-distribution", "url": f"https://pypi.org/project/{name}/{version}/#files",
         "comment": f"built here by {script}"})
    component.setdefault("properties", []).extend(
        [{"name": "dtc:built-by", "value": script}, {"name": "dtc:hardening", "value": HARDENING}])
    diffs = []
    for sub in patch_dirs:
        if sub == "gpu" and flavor != "gpu":
            continue
        for patch in sorted((patches / sub).glob("*.patch")):
            diffs.append({"type": "unofficial", "diff": {
                "text": {"contentType": "text/x-diff", "content": patch.read_text()},
                "url": f"file:///opt/dtc/src/docker/patches/{patch.relative_to(patches)}"}})
    if diffs:
        component["pedigree"] = {"patches": diffs}


def pin_dates(components: list[dict], pins: dict[str, str], dates: dict[str, str]) -> None:
    """Adds ``dtc:pin:released`` to each component a pin names (name and public version equal)."""
    by_name: dict[str, list[dict]] = {}
    for component in components:
        by_name.setdefault(canonicalize_name(component["name"]), []).append(component)
    for key, value in pins.items():
        if not key.endswith("_VERSION") or key not in dates:
            continue
        names = PIN_NAMES.get(key, (canonicalize_name(key[:-len("_VERSION")].replace("_", "-")),))
        for name in names:
            for component in by_name.get(name, []):
                same = (component["version"] == value if component.get("purl", "").startswith("pkg:deb/")
                        else Version(component["version"]).public == Version(value).public)
                if same:
                    component.setdefault("properties", []).append(
                        {"name": "dtc:pin:released", "value": f"{dates[key]} ({key}={value}, versions.env)"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--python", required=True)
    parser.add_argument("--lock", type=Path, required=True)
    parser.add_argument("--versions", type=Path, required=True)
    parser.add_argument("--pyproject", type=Path, required=True)
    parser.add_argument("--patches", type=Path, required=True)
    parser.add_argument("--flavor", choices=("cpu", "gpu"), required=True)
    args = parser.parse_args(argv)

    bom = python_bom(args.python, args.pyproject)
    lock = read_lock(args.lock)
    for component in bom["components"]:
        name = canonicalize_name(component["name"])
        if name not in lock:
            sys.exit(f"sbom: {name} {component['version']} is installed but not in {args.lock}: "
                     "the environment is not the lock's (docker/install-locked-environment.sh)")
        sha256, wheel = lock[name]
        component["hashes"] = [{"alg": "SHA-256", "content": sha256}]
        if "purl" not in component:    # cyclonedx-py gives none for a wheel installed from a file
            component["purl"] = PackageURL(type="pypi", name=name, version=component["version"],
                                           qualifiers={"file_name": wheel} if wheel else None).to_string()
        if built_here(wheel):
            add_pedigree(component, name, component["version"], args.patches, args.flavor)
    debian = debian_components()
    bom["components"] += debian
    bom["dependencies"] += [{"ref": component["bom-ref"]} for component in debian]
    pins, dates = read_versions(args.versions)
    pin_dates(bom["components"], pins, dates)
    bom["metadata"].setdefault("properties", []).extend(
        [{"name": "dtc:flavor", "value": args.flavor}]
        + [{"name": f"dtc:pin:{key}", "value": value} for key, value in pins.items()]
        + [{"name": f"dtc:pin:{key}:released", "value": value} for key, value in dates.items()])

    text = json.dumps(bom, indent=1, sort_keys=True) + "\n"
    if error := JsonStrictValidator(SchemaVersion.V1_6).validate_str(text):
        sys.exit(f"sbom: the SBOM is not valid CycloneDX 1.6: {error}")
    args.out.write_text(text)
    python_count = len(bom["components"]) - len(debian)
    print(f"sbom: {python_count} Python distributions, {len(debian)} Debian packages -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
