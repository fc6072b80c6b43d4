"""What a built image must not contain, read from its files: the sanity checks trusted images run.

    python -m dtc_local.image_sanity IMAGE --flavor cpu

mounts IMAGE read-only from podman's store (``podman image mount``), reads its configuration
(``podman image inspect``), and checks, following AWS's Deep Learning Containers sanity suite
(aws/deep-learning-containers: ``test/sanity/scripts/check_credentials.sh``,
``test_sanity_training.py``) and checksec's ELF rules:

- ``credentials``: no credential file of a known tool (``~/.aws/credentials``, ``.netrc``,
  ``.docker/config.json``, ...), no ``.git`` directory or ``.env`` file at the top, no
  ``.gitconfig`` holding a credential helper or header; no private key in a file that no Debian
  package or wheel ships, except the ssh host keys and the job key docs/image.md documents
  ("The ssh key"), and those readable by root alone (mode 0600).
- ``environment``: no variable of the image's configuration named like a secret (``*_API_KEY``,
  ``*_SECRET``, ``*_TOKEN``, ``*_PASSWORD``, ``AWS_*KEY*``; ``SAGEMAKER_*`` excepted, as AWS's check
  does) with a value.
- ``hardening``: every ELF file this build compiled (the wheels the lock's header lists with the
  platform tag ``linux_x86_64``, which no index serves, and any ELF file that neither a Debian
  package nor a wheel ships) has a stack protector (imports ``__stack_chk_fail``), FORTIFY where
  it calls a fortifiable libc function (imports a ``__*_chk`` function), full RELRO (``GNU_RELRO``
  and ``BIND_NOW``) and a non-executable stack (``GNU_STACK`` without ``E``), as read by binutils'
  ``readelf``. Debian's packages (built under Debian's hardening policy) and the index's
  wheels are their publishers' builds. FORTIFY leaves a trace only where a call's buffer size is
  known when compiling: a file built with it whose calls all have sizes unknown until run time
  imports no ``__*_chk`` and reads as not fortified, as checksec reports it too.
- ``labels``: the OCI annotations ``org.opencontainers.image.{source,version,revision,licenses,
  base.name}`` (https://github.com/opencontainers/image-spec/blob/main/annotations.md) are set.
- ``cuda`` (CPU flavor): no ``/usr/local/cuda``, and every CUDA library (``libcudart``,
  ``libnvjpeg``, ...) is one a wheel bundles and the exceptions list names with why.

Each finding is a :class:`Finding`. A finding the exceptions file (``image_sanity_exceptions.toml``
beside this module) lists for the flavor, with why and a ``review_by`` date, is excepted until
that date, as the allowlist of AWS's ECR scan (``test/security/scripts/ecr_scan.py``: an entry
past its review date fails the run); an entry that matches no finding fails too, so the list
stays exact. The image's size is checked by scripts/build-image.sh at every build.

Exit status: 0 when every finding is excepted, 1 otherwise, 2 on bad arguments. Raises
``subprocess.CalledProcessError`` when podman cannot mount or inspect the image.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import re
import stat
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Iterator
from importlib import metadata
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

EXCEPTIONS = Path(__file__).with_name("image_sanity_exceptions.toml")
SITE_PACKAGES = "opt/dtc/venv/lib/python3.11/site-packages"
LOCK = "opt/dtc/requirements.lock"

# check_credentials.sh's files, under /root and every /home/<user>
CREDENTIAL_FILES = (".aws/credentials", ".git-credentials", ".netrc", ".docker/config.json", ".npmrc", ".pypirc",
                    ".boto", ".s3cfg", ".kube/config", ".cache/huggingface/token", ".huggingface/token")
TOP_DIRECTORIES = ("", "root", "opt", "src", "opt/dtc")          # no .git or .env in these
# docs/image.md, "The ssh key": made by docker/configure-sshd.sh at build time
DOCUMENTED_KEYS = frozenset({"etc/ssh/ssh_host_rsa_key", "etc/ssh/ssh_host_ecdsa_key",
                             "etc/ssh/ssh_host_ed25519_key", "root/.ssh/id_ed25519"})
PRIVATE_KEY = re.compile(rb"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----\s+[A-Za-z0-9+/=\s:,-]{40,}?-----END")
SECRET_VARIABLE = re.compile(r"^(AWS_\w*KEY\w*|\w*_API_KEY|\w*_SECRET(_KEY)?|\w*_TOKEN|\w*_PASSWORD|\w*_PASSWD|"
                             r"GITHUB_TOKEN|HF_TOKEN)$")
OCI_LABELS = tuple(f"org.opencontainers.image.{key}" for key in ("source", "version", "revision", "licenses",
                                                                 "base.name"))
CUDA_LIBRARY = re.compile(r"^lib(cuda|cudart|cublas|cublasLt|cudnn\w*|cufft\w*|curand|cusolver\w*|cusparse\w*|nccl|"
                          r"nvrtc\w*|nvJitLink|nvjpeg\w*|npp\w*|cupti|nvToolsExt)\b[.\w]*\.so")
LOCK_WHEEL = re.compile(r"^# (\S+\.whl) sha256=", re.M)      # docker/lock-environment.py's header lines
USR_MERGED = ("/bin/", "/sbin/", "/lib/", "/lib32/", "/lib64/", "/libx32/")
MAX_SCANNED_BYTES = 1 << 20          # private keys are small; larger files are not read


@dataclasses.dataclass(frozen=True)
class Finding:
    """One thing the image must not have: ``check`` (credentials, environment, hardening, labels,
    cuda, exceptions), ``subject`` (a path in the image without its leading ``/``, a variable, a
    label, or a distribution's normalized name; for hardening, the owner and the missing property,
    ``mpi4py (not fortified)``) and ``detail`` (one line)."""

    check: str
    subject: str
    detail: str

    def line(self) -> str:
        return f"{self.check} {self.subject}: {self.detail}"


@dataclasses.dataclass(frozen=True)
class Exception_:
    """An entry of the exceptions file: a finding (``check``, ``subject``) accepted in ``flavors``
    until ``review_by``, because ``why``."""

    check: str
    subject: str
    flavors: tuple[str, ...]
    why: str
    review_by: datetime.date


@dataclasses.dataclass(frozen=True)
class Verdict:
    """``failed``: findings not excepted, expired and stale exceptions; ``excepted``: the rest."""

    failed: tuple[Finding, ...]
    excepted: tuple[tuple[Finding, Exception_], ...]


def load_exceptions(path: Path = EXCEPTIONS) -> list[Exception_]:
    """The ``[[exception]]`` tables of the TOML file ``path``. Raises ``ValueError`` naming the
    entry and key when one lacks a key or ``review_by`` is not a date."""
    entries = tomllib.loads(path.read_text()).get("exception", [])
    loaded = []
    for number, entry in enumerate(entries, 1):
        missing = {"check", "subject", "flavors", "why", "review_by"} - set(entry)
        if missing or not isinstance(entry["review_by"], datetime.date):
            wrong = sorted(missing) or "review_by"
            raise ValueError(f"{path}: exception {number} ({entry.get('subject')}) needs check, subject, flavors, "
                             f"why and review_by (a date, YYYY-MM-DD); missing or wrong: {wrong}")
        loaded.append(Exception_(entry["check"], entry["subject"], tuple(entry["flavors"]), entry["why"],
                                 entry["review_by"]))
    return loaded


def judge(findings: Iterable[Finding], exceptions: Iterable[Exception_], flavor: str,
          today: datetime.date) -> Verdict:
    """Pure: which findings the exceptions for ``flavor`` accept on ``today``. An exception past
    its ``review_by`` date, or one that matches no finding, is itself a failed finding."""
    applying = {(e.check, e.subject): e for e in exceptions if flavor in e.flavors}
    failed, excepted, used = [], [], set()
    for finding in findings:
        entry = applying.get((finding.check, finding.subject))
        if entry is None:
            failed.append(finding)
            continue
        used.add((entry.check, entry.subject))
        if entry.review_by < today:
            failed.append(Finding("exceptions", entry.subject, f"the exception for this {entry.check} finding "
                                  f"expired on {entry.review_by}: fix it or review the entry ({finding.detail})"))
        else:
            excepted.append((finding, entry))
    for key, entry in applying.items():
        if key not in used:
            failed.append(Finding("exceptions", entry.subject, f"the {entry.check} exception matches nothing in the "
                                  f"{flavor} image: remove it from {EXCEPTIONS.name}"))
    return Verdict(tuple(failed), tuple(excepted))


@dataclasses.dataclass(frozen=True)
class Ownership:
    """Who ships each file of an image root: ``debian`` (paths of the dpkg file lists), ``wheels``
    (path -> the normalized name of the distribution whose RECORD lists it) and ``built_here``
    (distributions the lock's header lists as wheels of platform ``linux_x86_64``). Paths are
    relative to the root, without a leading ``/``."""

    debian: frozenset[str]
    wheels: dict[str, str]
    built_here: frozenset[str]

    def ours(self, path: str) -> str | None:
        """The owner this build answers for: the distribution built here, the path itself when
        nobody ships it, or None (a Debian package's, or an index wheel's)."""
        owner = self.wheels.get(path)
        if owner is not None:
            return owner if owner in self.built_here else None
        return None if path in self.debian else path


def ownership(root: Path) -> Ownership:
    debian = set()
    for listing in (root / "var/lib/dpkg/info").glob("*.list"):
        for line in listing.read_text(errors="replace").splitlines():
            debian.add(line.lstrip("/"))
            if line.startswith(USR_MERGED):
                debian.add("usr" + line)
    wheels = {}
    site = root / SITE_PACKAGES
    for dist in metadata.distributions(path=[str(site)]):
        name = canonicalize_name(dist.metadata["Name"])
        for file in dist.files or ():
            wheels[os.path.normpath(os.path.join(SITE_PACKAGES, str(file)))] = name
    lock = (root / LOCK).read_text() if (root / LOCK).exists() else ""
    built_here = set()
    for wheel in LOCK_WHEEL.findall(lock):
        name, _, _, tags = parse_wheel_filename(wheel)
        if any(tag.platform == "linux_x86_64" for tag in tags):    # no index serves this platform tag
            built_here.add(name)
    return Ownership(frozenset(debian), wheels, frozenset(built_here))


def files(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    """Every regular file under ``root`` (no symbolic links followed), as (relative path, lstat)."""
    for directory, _, names in os.walk(root):
        for name in names:
            full = os.path.join(directory, name)
            info = os.lstat(full)
            if stat.S_ISREG(info.st_mode):
                yield os.path.relpath(full, root), info


def credential_findings(root: Path, owners: Ownership, listed: list[tuple[str, os.stat_result]]) -> list[Finding]:
    found = []
    homes = [root / "root", *sorted((root / "home").glob("*"))]
    for home in homes:
        for name in CREDENTIAL_FILES:
            if (home / name).exists():
                found.append(Finding("credentials", str((home / name).relative_to(root)), "a credential file"))
        gitconfig = home / ".gitconfig"
        if gitconfig.is_file() and re.search(r"credential|extraheader", gitconfig.read_text(errors="replace"), re.I):
            found.append(Finding("credentials", str(gitconfig.relative_to(root)),
                                 "holds a credential helper or header"))
    for top in TOP_DIRECTORIES:
        for name, what in ((".git", "a git directory"), (".env", "an environment file")):
            if (root / top / name).exists():
                found.append(Finding("credentials", os.path.join(top, name), what))
    for path, info in listed:
        if owners.ours(path) != path or info.st_size > MAX_SCANNED_BYTES:
            continue
        with open(root / path, "rb") as handle:
            if not PRIVATE_KEY.search(handle.read()):
                continue
        if path not in DOCUMENTED_KEYS:
            found.append(Finding("credentials", path, "a private key that no package ships and docs/image.md does "
                                 "not document"))
        elif info.st_uid != 0 or info.st_mode & 0o077:
            found.append(Finding("credentials", path, f"a documented key readable beyond root "
                                 f"(mode {stat.S_IMODE(info.st_mode):04o}, uid {info.st_uid}; want 0600, root)"))
    return found


def environment_findings(env: Iterable[str]) -> list[Finding]:
    found = []
    for entry in env:
        name, _, value = entry.partition("=")
        if value and SECRET_VARIABLE.match(name) and not name.startswith("SAGEMAKER_"):
            found.append(Finding("environment", name, "a secret-looking variable with a value in the image's "
                                 "configuration"))
    return found


def elf_weaknesses(path: Path) -> list[str]:
    """checksec's properties of the ELF file ``path`` that are missing: ``no canary``,
    ``not fortified``, ``partial RELRO``/``no RELRO``, ``executable stack`` (or ``unreadable by
    readelf``). checksec's rules (github.com/slimm609/checksec): a canary is an import of
    ``__stack_chk_fail``; FORTIFY, an import of a ``__*_chk`` function where a fortifiable one is
    imported."""
    done = subprocess.run(["readelf", "-W", "--program-headers", "--dynamic", "--dyn-syms", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return ["unreadable by readelf"]
    text = done.stdout
    imported = set(re.findall(r" UND (\S+?)(?:@\S*)?(?: \(\d+\))?$", text, re.M))
    weak = []
    if "__stack_chk_fail" not in imported:
        weak.append("no canary")
    fortified = any(re.fullmatch(r"__\w+_chk", s) and s != "__stack_chk_fail" for s in imported)
    fortifiable = imported & {"memcpy", "memmove", "memset", "strcpy", "strncpy", "strcat", "strncat", "sprintf",
                              "snprintf", "vsprintf", "vsnprintf", "printf", "fprintf", "read", "fgets", "realpath"}
    if fortifiable and not fortified:
        weak.append("not fortified")
    if "GNU_RELRO" not in text:
        weak.append("no RELRO")
    elif not re.search(r"\(FLAGS\)\s+.*BIND_NOW|\(FLAGS_1\)\s+Flags:.*\bNOW\b", text):
        weak.append("partial RELRO")
    stack = re.search(r"GNU_STACK(?:\s+\S+){5}\s+(\S+)", text)
    if stack and "E" in stack.group(1):
        weak.append("executable stack")
    return weak


def hardening_findings(root: Path, owners: Ownership, listed: list[tuple[str, os.stat_result]]) -> list[Finding]:
    by_owner: dict[str, dict[str, int]] = {}
    counted: dict[str, int] = {}
    for path, _ in listed:
        owner = owners.ours(path)
        if owner is None:
            continue
        with open(root / path, "rb") as handle:
            if handle.read(4) != b"\x7fELF":
                continue
        counted[owner] = counted.get(owner, 0) + 1
        for weakness in elf_weaknesses(root / path):
            tally = by_owner.setdefault(owner, {})
            tally[weakness] = tally.get(weakness, 0) + 1
    return [Finding("hardening", f"{owner} ({weak})", f"{count} of {counted[owner]} ELF files")
            for owner, tally in sorted(by_owner.items()) for weak, count in sorted(tally.items())]


def label_findings(labels: dict[str, str] | None) -> list[Finding]:
    return [Finding("labels", key, "OCI annotation missing or empty")
            for key in OCI_LABELS if not (labels or {}).get(key)]


def cuda_findings(root: Path, owners: Ownership, listed: list[tuple[str, os.stat_result]]) -> list[Finding]:
    found = []
    if (root / "usr/local/cuda").exists():
        found.append(Finding("cuda", "usr/local/cuda", "a CUDA toolkit in the CPU flavor"))
    bundled: dict[str, list[str]] = {}
    for path, _ in listed:
        if CUDA_LIBRARY.match(os.path.basename(path)):
            owner = owners.wheels.get(path)
            if owner is None:
                found.append(Finding("cuda", path, "a CUDA library that no wheel bundles, in the CPU flavor"))
            else:
                bundled.setdefault(owner, []).append(os.path.basename(path))
    found += [Finding("cuda", owner, "bundles " + ", ".join(sorted(names))) for owner, names in sorted(bundled.items())]
    return found


def check(root: Path, config: dict, flavor: str) -> list[Finding]:
    """Every finding of the image whose root file system is ``root`` and whose configuration
    (``podman image inspect``'s ``Config``: ``Env``, ``Labels``) is ``config``."""
    owners, listed = ownership(root), list(files(root))       # one walk of the image for every check
    found = credential_findings(root, owners, listed) + environment_findings(config.get("Env") or [])
    found += hardening_findings(root, owners, listed) + label_findings(config.get("Labels"))
    if flavor == "cpu":
        found += cuda_findings(root, owners, listed)
    return found


@contextlib.contextmanager
def mounted(image: str) -> Iterator[tuple[Path, dict]]:
    """``image``'s root file system (podman's mount, read it only) and its configuration. Mounted
    and unmounted by its ID: a build may move the tag meanwhile."""
    inspected = json.loads(subprocess.run(["podman", "image", "inspect", image], capture_output=True, text=True,
                                          check=True).stdout)[0]
    root = subprocess.run(["podman", "image", "mount", inspected["Id"]], capture_output=True, text=True,
                          check=True).stdout.strip()
    try:
        yield Path(root), inspected["Config"]
    finally:
        subprocess.run(["podman", "image", "unmount", inspected["Id"]], capture_output=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("image", help="an image in podman's store, e.g. dtc:cpu")
    parser.add_argument("--flavor", required=True, choices=("cpu", "gpu"))
    parser.add_argument("--exceptions", type=Path, default=EXCEPTIONS, help="TOML file of accepted findings")
    parser.add_argument("--today", type=datetime.date.fromisoformat, default=datetime.date.today(),
                        help="the date the exceptions' review_by dates are read against (YYYY-MM-DD)")
    args = parser.parse_args(argv)
    exceptions = load_exceptions(args.exceptions)
    with mounted(args.image) as (root, config):
        verdict = judge(check(root, config, args.flavor), exceptions, args.flavor, args.today)
    for finding, entry in verdict.excepted:
        print(f"excepted {finding.line()} (until {entry.review_by}: {entry.why})")
    for finding in verdict.failed:
        print(f"FAILED {finding.line()}")
    print(f"{args.image}: {len(verdict.failed)} failed, {len(verdict.excepted)} excepted")
    return 1 if verdict.failed else 0


if __name__ == "__main__":
    sys.exit(main())
