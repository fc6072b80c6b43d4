"""One record per launcher (a way of starting a job's processes), all of them in ``registry()``.

A record holds everything about a launcher that the rest of the entrypoint reads: the strategy it
runs and the ``sagemaker_*`` hyperparameters SageMaker Python SDK v2 writes for it
(aws/sagemaker-python-sdk v2, ``fw_utils.py``), its plan function (``launch_*``: ``(JobConfig,
Program) -> LaunchPlan``), the ports it uses (``Port``), what its processes load
(the preflight's ``components_needed``), and its runtime on several hosts: whether every host
serves and watches a ``peers.Presence``, what the master watches, how a stall is judged and
where the other hosts' stacks come from, and a part some hosts run instead of the plan's
command. ``select`` reads the hyperparameters, ``launch.build`` the plan function, ``cli`` the
runtime fields, ``dtc_local.cluster`` the SDK's hyperparameters, the preflight the components;
docs/strategies.md's table lists them. Adding a launcher is a ``launch_*`` module with its plan
function and a record here (docs/development.md).

The stock toolkits let one flag silently win over another (PyTorch toolkit: mpi, then
pytorchddp, then torch_distributed; TensorFlow toolkit: parameter server, then mpi); here two
strategy flags are an error, and the flags of libraries this image does not ship fail with the
name of what to use instead.
"""

import functools
import importlib.metadata
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import TYPE_CHECKING

from . import launch_mpi, launch_single, launch_tf, launch_torch, mpi_hosts, mpi_job, ps_job, report
from .errors import ConfigError
from .hyperparameters import parse_bool

if TYPE_CHECKING:
    from .config import JobConfig
    from .plan import LaunchPlan
    from .program import Program


class Strategy(StrEnum):
    """The built-in launchers' names (``Launcher.strategy``): ``train --plan``'s ``strategy`` and
    the SDK v2 ``distribution`` key each stands for. A launcher's record may name itself with a
    plain string too: a ``StrEnum`` member equals, and hashes as, its value."""

    SINGLE = "single"
    MPI = "mpi"
    TORCH_DISTRIBUTED = "torch_distributed"
    MULTI_WORKER_MIRRORED = "multi_worker_mirrored_strategy"
    PARAMETER_SERVER = "parameter_server"


@dataclass(frozen=True)
class Port:
    """A TCP port a launcher's processes (or ``train`` itself) listen on.

    Attributes:
        name: its key in ``Ports`` (``torch_master``).
        variable: the ``DTC_*_PORT`` variable that overrides it.
        default: the port otherwise: the toolkits' where they have one
            (aws/sagemaker-training-toolkit ``mpi.py``, ``torch_distributed.py``;
            aws/sagemaker-tensorflow-training-toolkit ``training.py``).
        used_by: who listens there (docs/strategies.md's ports table).
    """

    name: str
    variable: str
    default: int
    used_by: str


# train's own ports, on every launcher's hosts
PRESENCE_PORT = Port("presence", "DTC_PRESENCE_PORT", 2226,
                     "the launchers with a presence (`torch_distributed`, `multi_worker_mirrored_strategy`) on "
                     "several hosts: each host's `train`, watched by the others")
PREFLIGHT_PORT = Port("preflight", "DTC_PREFLIGHT_PORT", 2227,
                      "the preflight's store on the master (every strategy, several hosts, before training)")


class Ports(Mapping[str, int]):
    """The job's TCP ports by ``Port.name`` (every launcher's and ``train``'s own), read once from
    the environment (``ports_from``); ``ports["presence"]``."""

    def __init__(self, values: Mapping[str, int]):
        self._values = dict(values)

    def __getitem__(self, name: str) -> int:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Ports({self._values!r})"


# the other hosts a host watches while its job runs: (host, port) -> what serves there
Endpoints = dict[tuple[str, int], str]


@dataclass(frozen=True)
class Launcher:
    """One way of starting a job's processes.

    Attributes:
        strategy: its name (``train --plan``'s ``strategy``; ``dtc_local.cluster``'s distribution).
        plan: this host's plan: ``(JobConfig, Program) -> LaunchPlan``, pure.
        describes: what it runs, for messages (``Horovod``).
        flag: the ``sagemaker_*_enabled`` hyperparameter that selects it (``None``: the default).
        estimator_argument: the SDK v2 estimator argument that writes ``flag``.
        sdk_hyperparameters: every ``sagemaker_*`` key SDK v2 writes for it, ``flag`` included.
        sdk_instance_type: SDK v2 also writes ``sagemaker_instance_type`` (the job's; it checks
            the instance type before it allows the launcher).
        ports: the ports its processes listen on, besides ``train``'s own (``PRESENCE_PORT``,
            ``PREFLIGHT_PORT``); one host's ports must differ (``ports_from``).
        needs: the preflight's components its processes load for sure (``preflight.checks``).
        presence: on several hosts, every host's ``train`` serves a ``peers.Presence`` and watches
            the others' (a failure's line, a stall's word and stacks reach every host; the other
            hosts wait for the master's end), and only the master judges stalls; the others read
            their ranks' stacks when the master reports one.
        presence_close_is_loss: under ``presence``, a host whose presence closes counts as lost
            (after ``cli.PEER_END_GRACE_S``); otherwise only its notices count.
        master_watch: on several hosts, the other hosts' servers the master watches for loss:
            ``(plan, current_host) -> {(host, port): what}`` (``None``: none). The master's
            ``host_part`` waits for every one of them to answer before the command, so the watch
            counts them as seen up from its start (``peers.watch_until_one_closes``'s ``seen_up``):
            one cut off before the watch's first poll is still reported.
        output_is_progress: the stall rule counts only output as progress (its waiting ranks spin
            on a core), not a busy CPU.
        quiet: a stderr line that is not progress (``None``: every line is).
        peer_stacks: ``(other hosts, folder) -> paths``: copies the other hosts' stacks on a stall
            (``None``: they come through the presence, or there are none).
        host_part: ``(config, plan, program name) -> exit code | None``: what a host does before
            the plan's command on several hosts; an exit code ends this host's part there.
    """

    strategy: str
    plan: "Callable[[JobConfig, Program], LaunchPlan]"
    describes: str
    flag: str | None = None
    estimator_argument: str | None = None
    sdk_hyperparameters: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))
    sdk_instance_type: bool = False
    ports: tuple[Port, ...] = ()
    needs: frozenset[str] = frozenset()
    presence: bool = False
    presence_close_is_loss: bool = False
    master_watch: "Callable[[LaunchPlan, str], Endpoints] | None" = None
    output_is_progress: bool = False
    quiet: Callable[[str], bool] | None = None
    peer_stacks: Callable[[list[str], str], list[str]] | None = None
    host_part: "Callable[[JobConfig, LaunchPlan, str], int | None] | None" = None


def _enabled(flag: str, **extra: object) -> Mapping[str, object]:
    return MappingProxyType({flag: True, **extra})


BUILT_IN = (
    Launcher(Strategy.SINGLE, launch_single.single_process_plan, "one process per host"),
    Launcher(Strategy.MPI, launch_mpi.mpi_plan, "Horovod",
             flag="sagemaker_mpi_enabled", estimator_argument='distribution={"mpi": {"enabled": True}}',
             sdk_hyperparameters=_enabled("sagemaker_mpi_enabled", sagemaker_mpi_custom_mpi_options=""),
             needs=frozenset({"horovod", "nccl"}), master_watch=mpi_job.ssh_daemons, output_is_progress=True,
             quiet=report.horovod_stall_line, peer_stacks=mpi_hosts.fetch_stacks, host_part=mpi_job.host_part),
    Launcher(Strategy.TORCH_DISTRIBUTED, launch_torch.torchrun_plan, "PyTorch DDP on torch's own kernels",
             flag="sagemaker_torch_distributed_enabled",
             estimator_argument='distribution={"torch_distributed": {"enabled": True}}',
             sdk_hyperparameters=_enabled("sagemaker_torch_distributed_enabled"), sdk_instance_type=True,
             ports=(Port("torch_master", "DTC_TORCH_MASTER_PORT", 7777,
                         "torchrun's rendezvous on the master (`torch_distributed`)"),),
             needs=frozenset({"torch", "nccl"}),
             presence=True, presence_close_is_loss=True),
    Launcher(Strategy.MULTI_WORKER_MIRRORED, launch_tf.multi_worker_mirrored_plan, "TensorFlow MultiWorkerMirrored",
             flag="sagemaker_multi_worker_mirrored_strategy_enabled",
             estimator_argument='distribution={"multi_worker_mirrored_strategy": {"enabled": True}}',
             sdk_hyperparameters=_enabled("sagemaker_multi_worker_mirrored_strategy_enabled"),
             ports=(Port("tf_worker", "DTC_TF_WORKER_PORT", 8890, "every MultiWorkerMirroredStrategy worker"),),
             needs=frozenset({"tensorflow"}), presence=True),
    Launcher(Strategy.PARAMETER_SERVER, launch_tf.parameter_server_plan, "TensorFlow parameter server",
             flag="sagemaker_parameter_server_enabled",
             estimator_argument='distribution={"parameter_server": {"enabled": True}}',
             sdk_hyperparameters=_enabled("sagemaker_parameter_server_enabled"),
             ports=(Port("tf_task", "DTC_TF_TASK_PORT", 2222, "parameter server: the chief and the workers"),
                    Port("tf_ps", "DTC_TF_PS_PORT", 2223,
                         "parameter server: the parameter servers (2224: the worker on a one-host job)"),
                    Port("tf_end", "DTC_TF_END_PORT", 2225,
                         "parameter server on several hosts: the master's end notice to the other hosts")),
             needs=frozenset({"tensorflow"}), master_watch=ps_job.tensorflow_servers, host_part=ps_job.host_part),
)
# Launchers other installed distributions add: entry points in this group, each naming a
# ``Launcher`` (packaging.python.org, "Creating and discovering plugins"; importlib.metadata).
ENTRY_POINT_GROUP = "dtc.launchers"


@functools.cache
def registry() -> Mapping[str, Launcher]:
    """Every launcher by name: the built-in ones (``BUILT_IN``), then those registered under
    ``ENTRY_POINT_GROUP``, read once.

    Raises:
        ConfigError: a registered entry point fails to load, is not a ``Launcher``, or takes a
            name, a flag or a port variable another launcher has, naming the entry point.
    """
    launchers = list(BUILT_IN)
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        where = f"entry point {entry.name} = {entry.value} (group {ENTRY_POINT_GROUP})"
        try:
            launcher = entry.load()
        except Exception as error:   # a plugin's own import error: name it
            raise ConfigError(f"{where} does not load: {type(error).__name__}: {error}") from error
        if not isinstance(launcher, Launcher):
            raise ConfigError(f"{where} is a {type(launcher).__name__}, not a dtc_entrypoint.launchers.Launcher")
        variables = {PRESENCE_PORT.variable, PREFLIGHT_PORT.variable,
                     *(port.variable for other in launchers for port in other.ports)}
        clashes = [f"port variable {port.variable}" for port in launcher.ports if port.variable in variables]
        if launcher.strategy in {other.strategy for other in launchers}:
            clashes.append(f"name {launcher.strategy}")
        if launcher.flag and launcher.flag in {other.flag for other in launchers}:
            clashes.append(f"flag {launcher.flag}")
        if clashes:
            raise ConfigError(f"{where}: its {', '.join(clashes)} belongs to another launcher (or to train)")
        launchers.append(launcher)
    return MappingProxyType({launcher.strategy: launcher for launcher in launchers})


def distributed() -> tuple[Launcher, ...]:
    """The launchers a distribution selects (all but ``single``: those with a ``flag``)."""
    return tuple(launcher for launcher in registry().values() if launcher.flag)

_INSTEAD = ('use distribution={"torch_distributed": {"enabled": True}} (PyTorch DDP) or '
            'distribution={"mpi": {"enabled": True}} (Horovod)')
# Flags of libraries this image does not ship -> what the user should do instead.
UNSUPPORTED_FLAGS = {
    "sagemaker_distributed_dataparallel_enabled": (
        "SageMaker distributed data parallel (smdistributed.dataparallel; the SDK also writes it for "
        "PyTorch's pytorchddp) is not in this image: " + _INSTEAD),
    "sagemaker_pytorch_ddp_enabled": "pytorchddp (run through smddprun/mpirun) is not in this image: " + _INSTEAD,
    "sagemaker_pytorch_xla_multi_worker_enabled": (
        "PyTorch/XLA (pytorchxla) is not in this image: " + _INSTEAD),
}
MODEL_PARALLEL_KEY = "mp_parameters"   # SDK v2 smdistributed.modelparallel writes it as a user hyperparameter
MODEL_PARALLEL_MESSAGE = (
    "SageMaker model parallel (smdistributed.modelparallel, hyperparameter mp_parameters) is not in "
    "this image: remove it from distribution= and " + _INSTEAD + ", or use an AWS SMP image")


def flags() -> frozenset[str]:
    """Every ``sagemaker_*`` key the selection reads (``select``)."""
    return frozenset({*(launcher.flag for launcher in distributed()), *UNSUPPORTED_FLAGS})


def ports() -> tuple[Port, ...]:
    """Every port: ``train``'s own, then each launcher's."""
    return (PRESENCE_PORT, PREFLIGHT_PORT, *(port for launcher in registry().values() for port in launcher.ports))


def of(strategy: str) -> Launcher:
    """The record of ``strategy`` (``registry``)."""
    return registry()[strategy]


def ports_from(environ: Mapping[str, str]) -> Ports:
    """Reads the ``DTC_*_PORT`` variables (``ports()``).

    Raises:
        ConfigError: a value that is not a port number (1-65535), or two ports one launcher's
            host may use at once on one number (``train``'s own and the launcher's), naming both
            variables.
    """
    values = {}
    for port in ports():
        raw = environ.get(port.variable, "").strip()
        if raw and (not raw.isdigit() or not 1 <= int(raw) <= 65535):
            raise ConfigError(f"{port.variable}={raw!r} is not a TCP port: set it to a number from 1 to 65535",
                              key=port.variable)
        values[port.name] = int(raw) if raw else port.default
    for launcher in registry().values():
        taken: dict[int, Port] = {}
        for port in (PRESENCE_PORT, PREFLIGHT_PORT, *launcher.ports):
            if values[port.name] in taken:
                other = taken[values[port.name]]
                raise ConfigError(f"{other.variable} and {port.variable} are both {values[port.name]}: a host under "
                                  f"{launcher.strategy} listens on both, so give them different ports",
                                  key=port.variable)
            taken[values[port.name]] = port
    return Ports(values)


def select(framework_parameters: Mapping[str, object], user_hyperparameters: Mapping[str, object]) -> Strategy:
    """The strategy the hyperparameters ask for (``Strategy.SINGLE`` when none).

    Args:
        framework_parameters: the ``sagemaker_*`` hyperparameters other than the toolkit's own,
            JSON-decoded where they could be (``Environment.additional_framework_parameters``).
        user_hyperparameters: the others (checked for ``mp_parameters``).

    Raises:
        ConfigError: a flag is not a boolean; an unsupported library's flag is on; or two
            strategy flags are on (naming both).
    """
    for key, message in UNSUPPORTED_FLAGS.items():
        if parse_bool(key, framework_parameters.get(key)):
            raise ConfigError(f"hyperparameter {key} is set: {message}", key=key)
    if MODEL_PARALLEL_KEY in user_hyperparameters:
        raise ConfigError(MODEL_PARALLEL_MESSAGE, key=MODEL_PARALLEL_KEY)
    enabled = [launcher for launcher in distributed()
               if parse_bool(launcher.flag, framework_parameters.get(launcher.flag))]
    if len(enabled) > 1:
        described = " and ".join(f"{launcher.flag} ({launcher.estimator_argument})" for launcher in enabled)
        raise ConfigError(
            f"conflicting distribution strategies: {described} are both enabled; pass exactly one "
            "strategy in the estimator's distribution=", key=enabled[1].flag)
    return enabled[0].strategy if enabled else Strategy.SINGLE
