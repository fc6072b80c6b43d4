"""The training program: a built-in trainer or the user's code from the submit directory.

``sagemaker_program`` / ``SAGEMAKER_PROGRAM`` names it:

* ``builtin:pytorch`` or ``builtin:tensorflow``: this image's trainers (``dtc_train``), the one
  written for the job's strategy (``builtin_trainers``, from ``dtc_train.trainers``);
* ``train.py``: a Python script in the submit directory (its ``requirements.txt`` is installed);
* a name next to a ``setup.py``: the package is installed and run as ``python -m <name>``;
* ``train.sh`` or any other file: run as an executable (``/bin/sh`` when it has no ``#!``).

This classification is sagemaker-training's ``_entry_point_type.get``; the toolkit's
``files.download_and_extract`` fetches the code (S3, a directory or a tarball); requirements
are installed as its ``entry_point.install`` does, with pip's own error reported
(``install_dependencies``). Running happens without a shell, so arguments
reach the program exactly as given (the toolkit's shell path does not; toolkit #128).
"""

from __future__ import annotations

import logging
import os
import re
import tarfile
from dataclasses import dataclass
from typing import TYPE_CHECKING

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from dtc_train import trainers

from . import supervise
from .errors import ConfigError, DependencyError, ProgramNotFoundError, StoppedBeforeLaunch
from .launchers import Strategy

if TYPE_CHECKING:
    from .config import JobConfig

BUILTIN_PREFIX = "builtin:"


def builtin_trainers() -> dict[str, dict[str, str]]:
    """framework -> strategy -> trainer module, from the trainers' records (``dtc_train.trainers``,
    which imports neither framework). Hosts outside a heterogeneous job's distribution groups run
    the ``single`` entry.

    Raises:
        ConfigError: a trainer another distribution registers does not load, naming it.
    """
    try:
        return {framework: {strategy: trainer.module for strategy, trainer in trainers.for_program(framework).items()}
                for framework in trainers.frameworks()}
    except Exception as error:   # a registered trainer's own error
        raise ConfigError(f"the built-in trainers' registry (dtc_train.trainers) does not load: "
                          f"{type(error).__name__}: {error}") from error


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Program:
    """How to start the program, before launcher and user arguments are added.

    Attributes:
        name: as configured (``train.py``, ``builtin:pytorch``).
        is_python: run by the Python interpreter (``python -m mpi4py`` wraps it under MPI).
        argv: the program part of the command: ``("-m", "pkg")`` or ``("/opt/ml/code/train.py",)``
            for Python (the interpreter is added by the launch plan); the full command otherwise.
        workdir: the directory it runs in (the code directory for user code).
    """

    name: str
    is_python: bool
    argv: tuple[str, ...]
    workdir: str


def builtin(config: JobConfig) -> Program | None:
    """The built-in trainer named by ``config.program`` for the job's strategy, or ``None`` for
    user code.

    Raises:
        ConfigError: ``builtin:`` with an unknown name, or a framework without a trainer for
            the strategy (``builtin:pytorch`` under parameter_server).
    """
    if not config.program or not config.program.startswith(BUILTIN_PREFIX):
        return None
    name = config.program[len(BUILTIN_PREFIX):]
    by_framework = builtin_trainers()
    if name not in by_framework:
        raise ConfigError(
            f"sagemaker_program {config.program!r} names no built-in trainer: use one of "
            + ", ".join(BUILTIN_PREFIX + n for n in by_framework),
            key="sagemaker_program",
        )
    strategy = config.strategy if config.is_distributed_host else Strategy.SINGLE
    modules = by_framework[name]
    if strategy not in modules:
        fits = [f"{BUILTIN_PREFIX}{n}" for n, by_strategy in by_framework.items() if strategy in by_strategy]
        raise ConfigError(
            f"sagemaker_program {config.program!r} has no trainer for the {strategy} strategy: use "
            f"{' or '.join(fits)}, or one of the strategies {', '.join(s for s in modules if s != Strategy.SINGLE)}",
            key="sagemaker_program",
        )
    return Program(config.program, True, ("-m", modules[strategy]), config.code_dir)


def classify(config: JobConfig) -> Program:
    """Classifies the user program already present in ``config.code_dir`` (no side effects).

    Raises:
        ConfigError: no program configured.
        ProgramNotFoundError: the file is not in the code directory.
    """
    found = builtin(config)
    if found:
        return found
    if not config.program:
        raise ConfigError(
            "no training program: set the sagemaker_program hyperparameter (or SAGEMAKER_PROGRAM) "
            "to a script in sagemaker_submit_directory, or to "
            + " / ".join(BUILTIN_PREFIX + n for n in builtin_trainers()),
            key="sagemaker_program",
        )
    from sagemaker_training import _entry_point_type  # noqa: PLC0415

    path = os.path.join(config.code_dir, config.program)
    kind = _entry_point_type.get(config.code_dir, config.program)
    if kind is _entry_point_type.PYTHON_PACKAGE:
        module = config.program[:-3] if config.program.endswith(".py") else config.program
        return Program(config.program, True, ("-m", module.replace("/", ".")), config.code_dir)
    if not os.path.isfile(path):
        raise ProgramNotFoundError(
            f"training program {config.program!r} not found in {config.code_dir}: check "
            "sagemaker_program and the contents of sagemaker_submit_directory",
            key="sagemaker_program",
        )
    if kind is _entry_point_type.PYTHON_PROGRAM:
        return Program(config.program, True, (path,), config.code_dir)
    with open(path, "rb") as handle:
        has_shebang = handle.read(2) == b"#!"
    return Program(config.program, False, (path,) if has_shebang else ("/bin/sh", path), config.code_dir)


def fetch(config: JobConfig) -> Program:
    """Brings the user's code into the code directory, installs what it needs, and classifies it.

    Built-in trainers need nothing fetched. For user code: unpacks ``config.submit_dir`` into
    ``config.code_dir`` when that is empty (toolkit ``files.download_and_extract``); if it is not
    empty and the program is missing there, fails with the reason instead of the toolkit's silent
    skip (toolkit #85, #222). Then installs ``requirements.txt`` or the ``setup.py`` package.

    Raises:
        ConfigError / ProgramNotFoundError: as ``classify``, or when the code cannot be fetched.
    """
    found = builtin(config)
    if found:
        os.makedirs(config.code_dir, exist_ok=True)
        return found
    if not config.program:
        return classify(config)  # raises the 'no training program' error before any download
    from sagemaker_training import files, process  # noqa: PLC0415

    try:
        process.validate_entry_point(config.program)
    except Exception as error:  # toolkit raises its ClientError with a precise reason
        raise ConfigError(f"sagemaker_program: {error}", key="sagemaker_program") from error

    submit_dir = config.submit_dir
    code_dir_had_files = os.path.isdir(config.code_dir) and bool(os.listdir(config.code_dir))
    if os.path.abspath(submit_dir) != os.path.abspath(config.code_dir):
        if code_dir_had_files:
            log.warning(
                "%s already holds files, so sagemaker_submit_directory %s is not unpacked "
                "(images must leave /opt/ml/code empty)", config.code_dir, submit_dir)
        else:
            if submit_dir.endswith((".tar.gz", ".tgz", ".tar")) and os.path.isfile(submit_dir) \
                    and not tarfile.is_tarfile(submit_dir):   # the toolkit would copy it as a file
                raise ConfigError(f"sagemaker_submit_directory {submit_dir!r} is not a tar archive: "
                                  "point it at a directory or a .tar.gz of one", key="sagemaker_submit_directory")
            try:
                files.download_and_extract(submit_dir, config.code_dir)
            except Exception as error:
                raise ConfigError(
                    f"cannot fetch sagemaker_submit_directory {submit_dir!r}: "
                    f"{type(error).__name__}: {error}",
                    key="sagemaker_submit_directory",
                ) from error
    program = classify(config)
    install_dependencies(config)
    return program


def install_dependencies(config: JobConfig) -> None:
    """What sagemaker-training's ``entry_point.install`` does for the program, with pip's own
    error as the failure's first line: ``pip install .`` (plus ``-r requirements.txt``) when the
    code directory is a package (``setup.py``), ``pip install -r requirements.txt`` for a Python
    program that has one, execute permission for a command. pip runs under ``supervise.run``, so
    a stop signal reaches it and its stderr is relayed as it comes. The CodeArtifact index of
    ``CA_REPOSITORY_ARN`` is used as the toolkit uses it (``modules._get_codeartifact_index``).
    On a warm pool with a persistent cache, pip keeps its downloads and wheels there
    (``PIP_CACHE_DIR``, ``config.cache_env``) for the next job on the instance to reuse.

    Raises:
        DependencyError: pip failed; the message starts with pip's last ``ERROR:`` line.
    """
    from sagemaker_training import _entry_point_type, modules  # noqa: PLC0415

    kind = _entry_point_type.get(config.code_dir, config.program)
    if kind is _entry_point_type.COMMAND:
        os.chmod(os.path.join(config.code_dir, config.program), 0o777)
        return
    requirements = ["-r", "requirements.txt"] if modules.has_requirements(config.code_dir) else []
    if kind is _entry_point_type.PYTHON_PACKAGE:
        targets = [".", *requirements]
    elif kind is _entry_point_type.PYTHON_PROGRAM and requirements:
        targets = requirements
    else:
        return
    argv = [config.python, "-m", "pip", "install", "--no-input", *targets]
    if os.environ.get(modules.CA_REPOSITORY_ARN_ENV):
        argv += ["-i", modules._get_codeartifact_index()]
    log.info("installing the program's dependencies (%s)", " ".join(targets))
    # pip explains conflicts on stdout; a warm pool's cache keeps its downloads for the next job
    result = supervise.run(argv, dict(config.cache_env), config.code_dir, merge_stdout=True)
    if result.signal_received:   # stopped while pip ran: a stop, not a pip failure
        raise StoppedBeforeLaunch(result.signal_received, "installing the program's dependencies")
    if result.returncode != 0:
        errors = [line.strip() for line in result.stderr_tail if line.strip().startswith("ERROR:")]
        what = "requirements.txt" if kind is _entry_point_type.PYTHON_PROGRAM else "the package (setup.py)"
        first = (pinned_conflict(result.stderr_tail, what, os.environ.get("PIP_CONSTRAINT", ""))
                 or (errors[-1] if errors else f"pip install exited with code {result.exit_code}"))
        raise DependencyError(
            f"{first}\n\nInstalling {what} in {config.code_dir} failed (pip exit code {result.exit_code}): "
            "fix requirements.txt in the submit directory (sagemaker_submit_directory / source_dir), or the "
            "package or index it names. Last lines of pip's output:\n" + "\n".join(result.stderr_tail[-20:]),
            key="requirements.txt")


_CONSTRAINT_LINE = re.compile(r"^The user requested \(constraint\) (?P<pin>(?P<name>[A-Za-z0-9._-]+)\S*)$")
_REQUESTED_LINE = re.compile(r"^The user requested (?P<spec>(?P<name>[A-Za-z0-9._-]+).*)$")
_DEPENDS_LINE = re.compile(r"^(?P<parent>\S+ \S+) depends on (?P<spec>(?P<name>[A-Za-z0-9._-]+).*)$")


def pinned_conflict(pip_stderr: list[str] | tuple[str, ...], what: str, constraint_file: str) -> str | None:
    """The failure's first line when pip refused a requirement because the image's constraint file
    pins the same distribution (``PIP_CONSTRAINT``: docker/lock-environment.py's ``PROTECTED``), or
    ``None`` when pip failed for another reason.

    Reads pip's ResolutionImpossible report (pip 25: ``The conflict is caused by:`` followed by
    ``The user requested (constraint) torch==2.13.0+cpu`` and either ``The user requested
    torch==2.5.0`` or ``scipy 1.10.0 depends on numpy<1.27.0``). The line names the package, what
    ``what`` (``requirements.txt`` or the package) asked for, the pinned version, and the three
    ways out (docs/versions.md, Protected pins)."""
    lines = [line.strip() for line in pip_stderr]
    pins = {}
    for line in lines:
        if match := _CONSTRAINT_LINE.match(line):
            pins[canonicalize_name(match["name"])] = match["pin"]
    for line in lines:
        if "(constraint)" in line:
            continue
        if match := _REQUESTED_LINE.match(line):
            asks = f"asks for {match['spec']}"
        elif match := _DEPENDS_LINE.match(line):
            asks = f"asks for {match['parent']}, which depends on {match['spec']}"
        else:
            continue
        name = canonicalize_name(match["name"])
        if name not in pins:
            continue
        source = f" ({constraint_file})" if constraint_file else ""
        if _admits(match["spec"][len(match["name"]):], pins[name].partition("==")[2]):
            # the requirement accepts the pinned build, which pip could not find: this image's build lacks it
            return (f"{what} {asks}; this image pins {pins[name]}{source} but does not have it, and pip found no "
                    f"such build: use the GPU flavor, or a derived image that has it (docs/versions.md, "
                    f"Companion libraries)")
        return (f"{what} {asks}, but this image pins {pins[name]}{source}: use the image's version, "
                f"build a derived image with the one you need, or set PIP_CONSTRAINT='' in the job's "
                f"environment to lift the image's pins at your own risk (docs/versions.md, Protected pins)")
    return None


def _admits(specifier: str, version: str) -> bool:
    """Whether pip's rendering of a requirement's version range (``<1.27.0 and >=1.19.5``, or
    nothing) admits ``version``; ``False`` when it does not parse."""
    try:
        return SpecifierSet(specifier.replace(" and ", ",").strip()).contains(Version(version), prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return False
