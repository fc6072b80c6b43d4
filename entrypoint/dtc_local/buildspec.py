"""Runs a CodeBuild buildspec (``version: 0.2``) on this machine, the way CodeBuild runs it.

``make push`` uses it to run the project's ``buildspec.yml`` from a workstation, and
tests/image/test_delivery.py to run that file's own commands (not a copy of them). What it mirrors
of CodeBuild (AWS CodeBuild User Guide, "Build specification reference" and "Build phase
transitions"):

- ``env.variables`` are defaults: a variable already set in the environment wins, as a
  project's or ``start-build``'s environment overrides the buildspec;
- every command of every phase runs in one shell process (``env.shell``: ``bash`` or ``sh``,
  default ``sh``), so ``export``\\s and ``cd`` carry over, in phase order ``install``,
  ``pre_build``, ``build``, ``post_build``; a phase stops at its first failing command;
- a failed ``install`` or ``pre_build`` ends the build; a failed ``build`` still runs
  ``post_build``, with ``CODEBUILD_BUILD_SUCCEEDING=0`` (1 otherwise);
- after a successful build, ``artifacts.files`` (globs, relative to the source directory) are
  copied to the artifacts directory, flattened with ``discard-paths: yes``; a pattern that
  matches nothing fails the build, as CodeBuild's upload does;
- ``env.exported-variables`` are read at the end of the build and returned.

Keys it does not implement (``finally`` blocks, ``reports``, ``batch``, secrets-manager and
parameter-store variables, ``runtime-versions``) are refused with their name, never ignored.

Usage: ``python -m dtc_local.buildspec buildspec.yml [--artifacts-dir DIR]``; exits with the
build's status (0 when every phase succeeded).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

PHASES = ("install", "pre_build", "build", "post_build")
_TOP_KEYS = {"version", "env", "phases", "artifacts"}
_ENV_KEYS = {"shell", "variables", "exported-variables"}
_PHASE_KEYS = {"commands"}
_ARTIFACT_KEYS = {"files", "discard-paths", "base-directory"}


class BuildspecError(ValueError):
    """The buildspec is malformed or uses a key this runner does not implement."""


@dataclass(frozen=True)
class Buildspec:
    """A parsed buildspec.

    Attributes:
        shell: ``bash`` or ``sh``.
        variables: ``env.variables`` (defaults).
        exported_variables: ``env.exported-variables``.
        phases: ``(phase, commands)`` in execution order, only the phases present.
        artifact_files: ``artifacts.files`` globs.
        artifact_base_dir: ``artifacts.base-directory`` ("" for the source directory).
        discard_paths: ``artifacts.discard-paths``.
    """

    shell: str
    variables: dict[str, str]
    exported_variables: tuple[str, ...]
    phases: tuple[tuple[str, tuple[str, ...]], ...]
    artifact_files: tuple[str, ...]
    artifact_base_dir: str
    discard_paths: bool


def _refuse_unknown(where: str, found: dict, allowed: set[str]) -> None:
    unknown = sorted(set(found) - allowed)
    if unknown:
        raise BuildspecError(f"{where}: {', '.join(unknown)} not supported by this runner "
                             f"(supported: {', '.join(sorted(allowed))})")


def parse(text: str, source: str = "buildspec.yml") -> Buildspec:
    """Parses and checks a buildspec.

    Raises:
        BuildspecError: not YAML, not ``version: 0.2``, a wrong type, or an unsupported key
            (the message names the file and key).
    """
    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise BuildspecError(f"{source}: not valid YAML: {exc}") from exc
    if not isinstance(spec, dict):
        raise BuildspecError(f"{source}: the top level must be a mapping")
    _refuse_unknown(source, spec, _TOP_KEYS)
    if str(spec.get("version")) != "0.2":
        raise BuildspecError(f"{source}: version must be 0.2, got {spec.get('version')!r}")
    env = spec.get("env") or {}
    _refuse_unknown(f"{source}: env", env, _ENV_KEYS)
    shell = env.get("shell", "sh")
    if shell not in ("bash", "sh"):
        raise BuildspecError(f"{source}: env.shell must be bash or sh, got {shell!r}")
    variables = {str(k): str(v) for k, v in (env.get("variables") or {}).items()}
    phases = []
    for name, body in (spec.get("phases") or {}).items():
        if name not in PHASES:
            raise BuildspecError(f"{source}: phases.{name} is not a CodeBuild phase ({', '.join(PHASES)})")
        _refuse_unknown(f"{source}: phases.{name}", body or {}, _PHASE_KEYS)
        commands = (body or {}).get("commands") or []
        if not isinstance(commands, list) or not all(isinstance(c, str) for c in commands):
            raise BuildspecError(f"{source}: phases.{name}.commands must be a list of strings")
        phases.append((name, tuple(commands)))
    phases.sort(key=lambda item: PHASES.index(item[0]))
    artifacts = spec.get("artifacts") or {}
    _refuse_unknown(f"{source}: artifacts", artifacts, _ARTIFACT_KEYS)
    return Buildspec(
        shell=shell,
        variables=variables,
        exported_variables=tuple(env.get("exported-variables") or ()),
        phases=tuple(phases),
        artifact_files=tuple(artifacts.get("files") or ()),
        artifact_base_dir=str(artifacts.get("base-directory", "")),
        discard_paths=str(artifacts.get("discard-paths", "no")).lower() in ("yes", "true"),
    )


def script(spec: Buildspec, exports_file: str) -> str:
    """The one shell script that runs every phase with CodeBuild's phase transitions."""
    lines = ["CODEBUILD_BUILD_SUCCEEDING=1; export CODEBUILD_BUILD_SUCCEEDING"]
    for phase, commands in spec.phases:
        lines.append(f"__phase_{phase}() {{")
        lines.append(f"  echo '[buildspec] Entering phase {phase.upper()}' >&2")
        for command in commands:
            lines.append(f"  echo {shlex.quote('[buildspec] Running command ' + command)} >&2")
            lines.append(f"  eval {shlex.quote(command)} || {{ __rc=$?; "
                         f"echo \"[buildspec] Phase {phase.upper()} failed: command exited $__rc\" >&2; "
                         "return $__rc; }")
        lines.append("  return 0")
        lines.append("}")
    lines.append("__status=0")
    for phase, _ in spec.phases:
        if phase in ("install", "pre_build"):
            lines.append(f"__phase_{phase} || exit $?")
        elif phase == "build":
            lines.append("__phase_build || { __status=$?; CODEBUILD_BUILD_SUCCEEDING=0; }")
        else:
            lines.append("__phase_post_build || { [ $__status -ne 0 ] || __status=$?; }")
    for name in spec.exported_variables:
        lines.append(f"printf '%s=%s\\n' {shlex.quote(name)} \"${{{name}:-}}\" >> {shlex.quote(exports_file)}")
    lines.append("exit $__status")
    return "\n".join(lines) + "\n"


def collect_artifacts(spec: Buildspec, source_dir: Path, artifacts_dir: Path) -> list[Path]:
    """Copies ``artifacts.files`` to ``artifacts_dir``; returns the copies.

    Raises:
        BuildspecError: a pattern matches no file.
    """
    base = source_dir / spec.artifact_base_dir
    copied = []
    for pattern in spec.artifact_files:
        matches = sorted(p for p in glob.glob(str(base / pattern), recursive=True) if os.path.isfile(p))
        if not matches:
            raise BuildspecError(f"artifacts.files: {pattern!r} matched no file under {base}")
        for match in matches:
            relative = Path(match).relative_to(base)
            target = artifacts_dir / (relative.name if spec.discard_paths else relative)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(match, target)
            copied.append(target)
    return copied


def run(path: Path, artifacts_dir: Path) -> tuple[int, dict[str, str]]:
    """Runs the buildspec at ``path`` from its directory (the source directory).

    Returns:
        ``(exit status, exported variables)``; the status is the first failing phase's.

    Raises:
        BuildspecError: malformed buildspec, or an artifact pattern that matches nothing.
    """
    spec = parse(path.read_text(), str(path))
    source_dir = path.resolve().parent
    env = dict(os.environ)
    for name, value in spec.variables.items():
        env.setdefault(name, value)
    with tempfile.TemporaryDirectory(prefix="buildspec-") as tmp:
        exports_file = os.path.join(tmp, "exported")
        Path(exports_file).touch()
        status = subprocess.run([spec.shell, "-c", script(spec, exports_file)], cwd=source_dir, env=env).returncode
        exported = dict(line.split("=", 1) for line in Path(exports_file).read_text().splitlines() if "=" in line)
    if status == 0 and spec.artifact_files:
        for copy in collect_artifacts(spec, source_dir, artifacts_dir):
            print(f"[buildspec] artifact {copy}", file=sys.stderr)
    return status, exported


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("buildspec", type=Path, help="the buildspec file (its directory is the source directory)")
    parser.add_argument("--artifacts-dir", type=Path, default=Path("build/artifacts"),
                        help="where artifacts.files are copied (default build/artifacts)")
    args = parser.parse_args(argv)
    try:
        status, exported = run(args.buildspec, args.artifacts_dir.resolve())
    except BuildspecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"status": status, "exported_variables": exported}))
    return status


if __name__ == "__main__":
    sys.exit(main())
