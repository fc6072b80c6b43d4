"""The job's configuration, parsed once from the SageMaker contract into a frozen object.

Sources, in the toolkit's order of precedence (aws/sagemaker-training-toolkit, ``environment.py``
and ``params.py``):
``<base>/input/config/{resourceconfig,inputdataconfig,hyperparameters}.json`` read through
sagemaker-training's ``Environment`` (``<base>`` is ``$SAGEMAKER_BASE_DIR`` or ``/opt/ml``),
``SAGEMAKER_PROGRAM`` over the ``sagemaker_program`` hyperparameter, and the ``sagemaker_*``
distribution hyperparameters the SageMaker Python SDK v2 writes.
"""

import json
import logging
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from . import fabric, launchers
from .errors import ConfigError
from .hyperparameters import parse_bool, parse_positive_int

DEFAULT_BASE_DIR = "/opt/ml"

# sagemaker_* keys this image reads; anything else starting with sagemaker_ is ignored with a
# warning by the CLI (it may belong to a newer SDK).
MPI_ENABLED = "sagemaker_mpi_enabled"
MPI_PROCESSES_PER_HOST = "sagemaker_mpi_num_of_processes_per_host"
MPI_NUM_PROCESSES = "sagemaker_mpi_num_processes"
MPI_CUSTOM_OPTIONS = "sagemaker_mpi_custom_mpi_options"
# The preflight (dtc_entrypoint.preflight): the hyperparameter wins over the variable.
PREFLIGHT = "sagemaker_preflight"
PREFLIGHT_VARIABLE = "DTC_PREFLIGHT"
PREFLIGHT_MODES = ("off", "quick", "full")
# Stall detection: seconds without progress (no output, no heartbeat; a collective waiting for a
# rank, in Horovod's stall inspector) before the job ends, and the extra seconds allowed from the
# start (a first step compiling, data downloading); the hyperparameter wins over the variable;
# a timeout of 0 turns detection off.
STALL_TIMEOUT = "sagemaker_stall_timeout_s"
STALL_TIMEOUT_VARIABLE = "DTC_STALL_TIMEOUT_S"
DEFAULT_STALL_TIMEOUT_S = 1800
STALL_STARTUP_GRACE = "sagemaker_stall_startup_grace_s"
STALL_STARTUP_GRACE_VARIABLE = "DTC_STALL_STARTUP_GRACE_S"
DEFAULT_STALL_STARTUP_GRACE_S = 600
# What a stall does: "end" the job (exit 5), or "dump" the stacks and let it run on.
STALL_ACTION = "sagemaker_stall_action"
STALL_ACTION_VARIABLE = "DTC_STALL_ACTION"
STALL_ACTIONS = ("end", "dump")

# Variables of the container's environment that launchers pass on to every process, by name
# (mpirun -x NAME), so their values never appear in a command line or a log.
FORWARDED_NAMES = frozenset({"PATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH", "TRAINING_JOB_NAME",
                             "TRAINING_JOB_ARN", "DTC_FAULT"})
FORWARDED_PREFIXES = ("NCCL_", "HOROVOD_", "FI_", "TF_", "AWS_", "SAGEMAKER_", "CUDA_", "NVIDIA_", "TORCH_")
# A channel's TrainingInputMode (inputdataconfig.json; CreateTrainingJob's Channel.InputMode).
INPUT_MODES = ("File", "FastFile", "Pipe")
# SageMaker sets this on a warm pool with the persistent cache on (docs: train-warm-pools); what
# is written there outlives the job and is there for the next job on the same instance.
WARM_POOL_CACHE_VAR = "SAGEMAKER_MANAGED_WARMPOOL_CACHE_DIRECTORY"
# What is worth keeping between jobs, as each tool's own variable -> a directory under the cache:
# pip's downloads and built wheels (requirements.txt), PyTorch's and DeepSpeed's JIT-compiled
# extensions, Triton's compiled kernels (torch.compile), Hugging Face downloads.
WARM_POOL_CACHES = {"PIP_CACHE_DIR": "pip", "TORCH_EXTENSIONS_DIR": "torch_extensions",
                    "TRITON_CACHE_DIR": "triton", "HF_HOME": "huggingface"}


def forwarded_names(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The names in ``environ`` that launchers forward to every rank (sorted)."""
    return tuple(sorted(n for n in environ if n in FORWARDED_NAMES or n.startswith(FORWARDED_PREFIXES)))


@dataclass(frozen=True)
class MpiConfig:
    """MPI settings (SDK v2 ``distribution={"mpi": {...}}``).

    Attributes:
        enabled: ``sagemaker_mpi_enabled``.
        processes_per_host: ``sagemaker_mpi_num_of_processes_per_host``; default: the host's GPU
            count, or 1 without GPUs (the toolkit's rule). The toolkit applies it to every
            launcher, torchrun included, and so does this image.
        num_processes: ``sagemaker_mpi_num_processes`` (``-np``); default processes_per_host x hosts.
        custom_options: ``sagemaker_mpi_custom_mpi_options``, split like a shell would split it.
    """

    enabled: bool = False
    processes_per_host: int = 1
    num_processes: int | None = None
    custom_options: str = ""


@dataclass(frozen=True)
class JobConfig:
    """Everything a launch plan needs, read once. Paths are absolute.

    Attributes:
        base_dir: ``$SAGEMAKER_BASE_DIR`` or ``/opt/ml``.
        current_host: this host's name (resourceconfig ``current_host``).
        hosts: every host of the job, in natural order (``algo-2`` before ``algo-10``).
        distribution_hosts: the hosts that take part in distributed training (all hosts, or those
            of ``sagemaker_distribution_instance_groups``), natural order.
        master_host: ``distribution_hosts[0]``. Every host applies this same rule, whatever
            order ``instance_groups[].hosts`` lists them in (the toolkit takes that unsorted
            list's first entry: ``Environment``'s master host name in the toolkit's
            ``environment.py``).
        network_interface: resourceconfig ``network_interface_name`` (default ``eth0``).
        num_gpus / num_cpus: as sagemaker-training counts them (``nvidia-smi``, ``os.cpu_count``).
        program: ``SAGEMAKER_PROGRAM`` or ``sagemaker_program``; ``builtin:<name>`` names a
            built-in trainer. ``None`` when unset.
        submit_dir: ``sagemaker_submit_directory`` (``s3://``, a directory or a ``.tar.gz``).
        code_dir: ``<base>/code``, where the submit directory is unpacked.
        user_hyperparameters: hyperparameters without ``sagemaker_*`` keys, in file order,
            JSON-decoded where possible.
        framework_parameters: the other ``sagemaker_*`` hyperparameters (distribution switches).
        mpi: see ``MpiConfig``.
        strategy: the launcher the hyperparameters select (``launchers.select``).
        ports: the job's TCP ports (``launchers.ports_from``).
        sm_env: the ``SM_*`` variables sagemaker-training's ``Environment.to_env_vars`` defines.
        inherited_names: variables of the container's environment to forward to every rank
            (``forwarded_names``).
        inherited_pythonpath: the container's ``PYTHONPATH`` (the estimator's ``environment``
            may set it); the launchers put the code directory in front of it.
        python: the interpreter that runs Python programs.
        log_level: ``sagemaker_container_log_level`` (Python logging level, default 20).
        channel_input_modes: channel -> ``File``, ``FastFile`` or ``Pipe`` (inputdataconfig.json
            ``TrainingInputMode``; ``File`` when absent), in file order.
        cache_env: ``warm_pool_cache_env``: the cache variables every process of the job gets.
        preflight: ``off``, ``quick`` (the default) or ``full``: ``sagemaker_preflight``, else
            ``$DTC_PREFLIGHT`` (``preflight_mode``).
        instance_type: this host's instance type (resourceconfig ``current_instance_type``), or ``""``.
        stall_timeout_s: seconds (int) without progress (no output, no heartbeat; a collective
            waiting for a rank that does not arrive) before the job ends, 0 for never:
            ``sagemaker_stall_timeout_s``, else ``$DTC_STALL_TIMEOUT_S`` (``seconds_setting``).
        stall_startup_grace_s: seconds (int) added to the first stall timeout after the start:
            ``sagemaker_stall_startup_grace_s``, else ``$DTC_STALL_STARTUP_GRACE_S``.
        stall_action: ``end`` (the default: a stall ends the job) or ``dump`` (its stacks are
            read and kept, and the job runs on): ``sagemaker_stall_action``, else
            ``$DTC_STALL_ACTION``.
        image_torch_version: the image's PyTorch version (``$DTC_TORCH_VERSION``, set by the
            Dockerfile), or ``""`` outside the image.
    """

    base_dir: str
    current_host: str
    hosts: tuple[str, ...]
    distribution_hosts: tuple[str, ...]
    master_host: str
    network_interface: str
    num_gpus: int
    num_cpus: int
    program: str | None
    submit_dir: str
    code_dir: str
    user_hyperparameters: Mapping[str, object]
    framework_parameters: Mapping[str, object]
    mpi: MpiConfig
    strategy: str = launchers.Strategy.SINGLE
    ports: launchers.Ports = field(default_factory=lambda: launchers.ports_from({}))
    sm_env: Mapping[str, str] = field(default_factory=dict)
    inherited_names: tuple[str, ...] = ("PATH",)
    inherited_pythonpath: str = ""
    python: str = sys.executable
    log_level: int = 20
    channel_input_modes: Mapping[str, str] = field(default_factory=dict)
    cache_env: Mapping[str, str] = field(default_factory=dict)
    preflight: str = "quick"
    instance_type: str = ""
    stall_timeout_s: int = DEFAULT_STALL_TIMEOUT_S
    stall_startup_grace_s: int = DEFAULT_STALL_STARTUP_GRACE_S
    stall_action: str = "end"
    image_torch_version: str = ""

    @property
    def model_dir(self) -> str:
        return os.path.join(self.base_dir, "model")

    @property
    def output_dir(self) -> str:
        return os.path.join(self.base_dir, "output")

    @property
    def is_distributed_host(self) -> bool:
        """Whether this host takes part in the distributed job (heterogeneous clusters)."""
        return self.current_host in self.distribution_hosts

    @property
    def is_master(self) -> bool:
        return self.current_host == self.master_host

    @property
    def processes_per_host(self) -> int:
        """Processes per host for every launcher (``sagemaker_mpi_num_of_processes_per_host``)."""
        return self.mpi.processes_per_host

    @property
    def host_index(self) -> int:
        """This host's position in ``distribution_hosts`` (its node rank); -1 outside them."""
        return self.distribution_hosts.index(self.current_host) if self.is_distributed_host else -1


def base_dir_from(environ: Mapping[str, str]) -> str:
    """``$SAGEMAKER_BASE_DIR`` or ``/opt/ml``, as sagemaker-training's ``environment.base_dir``."""
    return os.path.abspath(environ.get("SAGEMAKER_BASE_DIR") or DEFAULT_BASE_DIR)


def relocate(path: str, base_dir: str) -> str:
    """Maps a container path under ``/opt/ml`` into ``base_dir`` (the SDK writes container paths
    such as ``/opt/ml/code`` or ``/opt/ml/input/data/code/sourcedir.tar.gz`` into
    hyperparameters.json; a tree moved by ``SAGEMAKER_BASE_DIR`` keeps them meaningful)."""
    prefix = DEFAULT_BASE_DIR + "/"
    if base_dir != DEFAULT_BASE_DIR and (path == DEFAULT_BASE_DIR or path.startswith(prefix)):
        return os.path.join(base_dir, path[len(prefix):])
    return path


def natural_key(host: str) -> list:
    """Sort key that orders ``algo-2`` before ``algo-10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", host)]


def aligned_sm_env(sm_env: Mapping[str, str], hosts: Sequence[str], master_host: str,
                   current_host: str) -> dict[str, str]:
    """The toolkit's ``SM_*`` variables made to agree with this image's host order and master.

    sagemaker-training sorts ``SM_HOSTS`` as strings (``algo-10`` before ``algo-2``) and takes
    ``master_hostname`` from the unsorted ``instance_groups[].hosts``, so its ``is_master`` in
    ``SM_TRAINING_ENV`` can be true on a host that is not rank 0's, or on none (issue #10). Here
    ``SM_HOSTS`` and ``SM_TRAINING_ENV["hosts"]`` list ``hosts`` (natural order, the node-rank
    order), and ``master_hostname`` / ``is_master`` name ``master_host``, the host of rank 0.
    """
    env = dict(sm_env)
    env["SM_HOSTS"] = json.dumps(list(hosts))
    if "SM_TRAINING_ENV" in env:
        training_env = json.loads(env["SM_TRAINING_ENV"])
        training_env.update(hosts=list(hosts), master_hostname=master_host, is_master=current_host == master_host)
        env["SM_TRAINING_ENV"] = json.dumps(training_env)
    return env


def mpi_config(framework_parameters: Mapping[str, object], num_gpus: int) -> MpiConfig:
    """Reads the MPI hyperparameters (already JSON-decoded where they could be).

    Raises:
        ConfigError: a flag that is not a boolean, a count that is not a positive integer,
            or options that are not a string.
    """
    options = framework_parameters.get(MPI_CUSTOM_OPTIONS) or ""
    if not isinstance(options, str):
        raise ConfigError(
            f"hyperparameter {MPI_CUSTOM_OPTIONS}={options!r} must be a string of mpirun options",
            key=MPI_CUSTOM_OPTIONS,
        )
    per_host = parse_positive_int(MPI_PROCESSES_PER_HOST, framework_parameters.get(MPI_PROCESSES_PER_HOST))
    return MpiConfig(
        enabled=parse_bool(MPI_ENABLED, framework_parameters.get(MPI_ENABLED)),
        processes_per_host=per_host or max(num_gpus, 1),
        num_processes=parse_positive_int(MPI_NUM_PROCESSES, framework_parameters.get(MPI_NUM_PROCESSES)),
        custom_options=options,
    )


def warm_pool_cache_env(environ: Mapping[str, str]) -> dict[str, str]:
    """``WARM_POOL_CACHES`` under ``$SAGEMAKER_MANAGED_WARMPOOL_CACHE_DIRECTORY`` (``{}`` when
    the job has no persistent cache), leaving out each variable ``environ`` sets already (the
    estimator's ``environment`` wins)."""
    root = environ.get(WARM_POOL_CACHE_VAR)
    if not root:
        return {}
    return {name: os.path.join(root, sub) for name, sub in WARM_POOL_CACHES.items() if name not in environ}


def choice_setting(framework_parameters: Mapping[str, object], environ: Mapping[str, str], key: str,
                   variable: str, choices: Sequence[str], default: str, what: str) -> str:
    """One of ``choices`` (lower-cased): the hyperparameter ``key``, else the environment
    variable ``variable``, else ``default``: the preflight's mode (``PREFLIGHT``: ``off``,
    ``quick``, ``full``; default ``quick``) and what a stall does (``STALL_ACTION``: ``end``,
    ``dump``; default ``end``).

    Raises:
        ConfigError: another value, naming where it came from and ``what`` it should be.
    """
    for name, value in ((key, framework_parameters.get(key)), (variable, environ.get(variable))):
        if value in (None, ""):
            continue
        choice = str(value).strip().lower()
        if choice not in choices:
            where = "hyperparameter" if name == key else "environment variable"
            raise ConfigError(f"{where} {name}={value!r} is not {what}: use one of {', '.join(choices)}", key=name)
        return choice
    return default


def preflight_mode(framework_parameters: Mapping[str, object], environ: Mapping[str, str]) -> str:
    """``sagemaker_preflight``, else ``$DTC_PREFLIGHT``, else ``quick`` (``choice_setting``)."""
    return choice_setting(framework_parameters, environ, PREFLIGHT, PREFLIGHT_VARIABLE, PREFLIGHT_MODES, "quick",
                          "a preflight mode")


def stall_action(framework_parameters: Mapping[str, object], environ: Mapping[str, str]) -> str:
    """``sagemaker_stall_action``, else ``$DTC_STALL_ACTION``, else ``end`` (``choice_setting``)."""
    return choice_setting(framework_parameters, environ, STALL_ACTION, STALL_ACTION_VARIABLE, STALL_ACTIONS, "end",
                          "a stall action")


def seconds_setting(framework_parameters: Mapping[str, object], environ: Mapping[str, str], key: str,
                    variable: str, default: int) -> int:
    """A whole number of seconds >= 0: the hyperparameter ``key``, else the environment variable
    ``variable``, else ``default`` (the stall settings: ``STALL_TIMEOUT``, where 0 turns the
    check off, and ``STALL_STARTUP_GRACE``).

    Raises:
        ConfigError: a value that is not a whole number of seconds >= 0, naming where it came from.
    """
    for name, value in ((key, framework_parameters.get(key)), (variable, environ.get(variable))):
        if value in (None, ""):
            continue
        try:
            seconds = int(str(value).strip())
        except ValueError:
            seconds = -1
        if seconds < 0:
            where = "hyperparameter" if name == key else "environment variable"
            raise ConfigError(f"{where} {name}={value!r} is not a whole number of seconds >= 0"
                              + (" (0 turns the stall check off)" if key == STALL_TIMEOUT else ""), key=name)
        return seconds
    return default


def from_environment(env, base_dir: str, environ: Mapping[str, str], python: str = sys.executable,
                     network_interface: str | None = None) -> JobConfig:
    """Builds the config from a sagemaker-training ``Environment`` and the process environment
    (pure: reads only its arguments). ``network_interface`` replaces resourceconfig's
    ``network_interface_name`` (``load`` passes ``fabric.choose_interface``'s choice).

    Raises:
        ConfigError: on invalid distribution hyperparameters or host lists.
    """
    hosts = tuple(sorted(env.hosts, key=natural_key))
    if env.current_host not in hosts:
        raise ConfigError(
            f"resourceconfig.json: current_host {env.current_host!r} is not in hosts {list(hosts)}",
            key="current_host",
        )
    distribution_hosts = tuple(sorted(env.distribution_hosts or hosts, key=natural_key))
    unknown = set(distribution_hosts) - set(hosts)
    if unknown:
        raise ConfigError(
            f"resourceconfig.json: instance_groups name hosts {sorted(unknown)} missing from hosts",
            key="instance_groups",
        )
    framework_parameters = dict(env.additional_framework_parameters)
    user_hyperparameters = dict(env.hyperparameters)
    program = env.user_entry_point
    return JobConfig(
        base_dir=base_dir,
        current_host=env.current_host,
        hosts=hosts,
        distribution_hosts=distribution_hosts,
        master_host=distribution_hosts[0],
        network_interface=network_interface or env.network_interface_name,
        num_gpus=env.num_gpus,
        num_cpus=env.num_cpus,
        program=str(program) if program not in (None, "", "None") else None,
        submit_dir=relocate(str(env.module_dir), base_dir),
        code_dir=os.path.join(base_dir, "code"),
        user_hyperparameters=MappingProxyType(user_hyperparameters),
        framework_parameters=MappingProxyType(framework_parameters),
        mpi=mpi_config(framework_parameters, env.num_gpus),
        strategy=launchers.select(framework_parameters, user_hyperparameters),
        ports=launchers.ports_from(environ),
        sm_env=MappingProxyType(aligned_sm_env(env.to_env_vars(), hosts, distribution_hosts[0], env.current_host)),
        inherited_names=forwarded_names(environ),
        inherited_pythonpath=environ.get("PYTHONPATH", ""),
        python=python,
        log_level=int(env.log_level),
        channel_input_modes=MappingProxyType({name: settings.get("TrainingInputMode") or "File"
                                              for name, settings in env.input_data_config.items()}),
        cache_env=MappingProxyType(warm_pool_cache_env(environ)),
        preflight=preflight_mode(framework_parameters, environ),
        stall_action=stall_action(framework_parameters, environ),
        image_torch_version=environ.get("DTC_TORCH_VERSION", ""),
        stall_timeout_s=seconds_setting(framework_parameters, environ, STALL_TIMEOUT, STALL_TIMEOUT_VARIABLE,
                                        DEFAULT_STALL_TIMEOUT_S),
        stall_startup_grace_s=seconds_setting(framework_parameters, environ, STALL_STARTUP_GRACE,
                                              STALL_STARTUP_GRACE_VARIABLE, DEFAULT_STALL_STARTUP_GRACE_S),
        instance_type=str(getattr(env, "current_instance_type", "") or ""),
    )


CONFIG_FILES = ("resourceconfig.json", "inputdataconfig.json", "hyperparameters.json")


def check_config_files(config_dir: str) -> None:
    """Checks the shape of the three config files before the toolkit reads them, so a bad file
    is named rather than surfacing as the toolkit's ``AttributeError`` or ``IndexError``: each
    exists and holds a JSON object; ``resourceconfig.json`` has a non-empty ``hosts`` list of
    names and a ``current_host`` (the layout of the SageMaker doc
    your-algorithms-training-algo-running-container, "Distributed Training Configuration").

    Raises:
        ConfigError: naming the file (and key) to fix.
    """
    documents = {}
    for name in CONFIG_FILES:
        path = os.path.join(config_dir, name)
        if not os.path.isfile(path):
            raise ConfigError(
                f"{path} is missing: run inside a SageMaker training job, mount a /opt/ml tree, "
                "or point SAGEMAKER_BASE_DIR at one",
                key="SAGEMAKER_BASE_DIR",
            )
        try:
            with open(path, encoding="utf-8") as handle:
                documents[name] = json.load(handle)
        except (ValueError, UnicodeDecodeError) as error:
            raise ConfigError(f"{path} is not valid JSON: {error}", key=name) from error
        if not isinstance(documents[name], dict):
            raise ConfigError(f"{path} must hold a JSON object ({{...}}), not a {type(documents[name]).__name__}",
                              key=name)
    resources, path = documents["resourceconfig.json"], os.path.join(config_dir, "resourceconfig.json")
    hosts = resources.get("hosts")
    if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) and h for h in hosts):
        raise ConfigError(f'{path}: "hosts" must be a non-empty list of host names, got {hosts!r}', key="hosts")
    if len(set(hosts)) != len(hosts):
        raise ConfigError(f'{path}: "hosts" lists a host twice: {hosts!r}', key="hosts")
    if not isinstance(resources.get("current_host"), str):
        raise ConfigError(f'{path}: "current_host" must be this host\'s name, got {resources.get("current_host")!r}',
                          key="current_host")
    for group in resources.get("instance_groups") or []:
        if not isinstance(group, dict) or not isinstance(group.get("hosts"), list):
            raise ConfigError(f'{path}: each of "instance_groups" must be an object with a "hosts" list, got {group!r}',
                              key="instance_groups")
    for name, channel in documents["inputdataconfig.json"].items():
        if not isinstance(channel, dict):
            raise ConfigError(f"{os.path.join(config_dir, 'inputdataconfig.json')}: channel {name!r} must be "
                              f"an object of settings, got {channel!r}", key=name)
        mode = channel.get("TrainingInputMode")
        if mode is not None and mode not in INPUT_MODES:
            raise ConfigError(f"{os.path.join(config_dir, 'inputdataconfig.json')}: channel {name!r} has "
                              f"TrainingInputMode {mode!r}: use one of {', '.join(INPUT_MODES)}", key=name)


def load(environ: Mapping[str, str] = os.environ) -> JobConfig:
    """Reads the contract from disk (through sagemaker-training) and parses it.

    Raises:
        ConfigError: the base directory or a config file is missing or malformed, or a value
            is invalid.
    """
    base_dir = base_dir_from(environ)
    config_dir = os.path.join(base_dir, "input", "config")
    check_config_files(config_dir)
    # sagemaker_training.environment fixes its paths at import time from SAGEMAKER_BASE_DIR.
    os.environ.setdefault("SAGEMAKER_BASE_DIR", base_dir)
    from sagemaker_training import environment  # noqa: PLC0415  (import after the variable is set)

    if os.path.abspath(environment.base_dir) != base_dir:
        raise RuntimeError(  # one process serves one job: the toolkit fixed its paths at import
            f"sagemaker_training was imported for {environment.base_dir}, not {base_dir}")

    try:
        env = environment.Environment()
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as error:  # shapes check_config_files misses
        raise ConfigError(
            f"cannot read the job configuration under {config_dir}: {type(error).__name__}: {error}",
            key="input/config",
        ) from error
    interface, warning = fabric.choose_interface(env.network_interface_name, fabric.usable_interfaces())
    if warning:
        logging.getLogger("dtc").warning("%s", warning)
    return from_environment(env, base_dir, environ, network_interface=interface)
