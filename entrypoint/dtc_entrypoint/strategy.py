"""Which distribution strategy a job asked for, and the ports its launchers use.

The SageMaker Python SDK v2 turns an estimator's ``distribution=`` into ``sagemaker_*``
hyperparameters (aws/sagemaker-python-sdk v2, ``fw_utils.py``). This image runs four strategies;
the flags of libraries it does not ship fail with the name of what to use instead. The stock toolkits let one
flag silently win over another (PyTorch toolkit: mpi, then pytorchddp, then torch_distributed;
TensorFlow toolkit: parameter server, then mpi); here two strategy flags are an error.
"""

from collections.abc import Mapping
from dataclasses import dataclass

from .errors import ConfigError
from .hyperparameters import parse_bool

SINGLE = "single"
MPI = "mpi"
TORCH_DISTRIBUTED = "torch_distributed"
MULTI_WORKER_MIRRORED = "multi_worker_mirrored_strategy"
PARAMETER_SERVER = "parameter_server"

# hyperparameter -> strategy, with the estimator argument that writes it.
STRATEGY_FLAGS = {
    "sagemaker_mpi_enabled": (MPI, 'distribution={"mpi": {"enabled": True}}'),
    "sagemaker_torch_distributed_enabled": (TORCH_DISTRIBUTED, 'distribution={"torch_distributed": {"enabled": True}}'),
    "sagemaker_multi_worker_mirrored_strategy_enabled": (
        MULTI_WORKER_MIRRORED, 'distribution={"multi_worker_mirrored_strategy": {"enabled": True}}'),
    "sagemaker_parameter_server_enabled": (PARAMETER_SERVER, 'distribution={"parameter_server": {"enabled": True}}'),
}

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

# Toolkit-compatible default ports (aws/sagemaker-training-toolkit ``mpi.py``, ``torch_distributed.py``;
# aws/sagemaker-tensorflow-training-toolkit ``training.py``), each overridable by a variable.
PORT_VARIABLES = {
    "torch_master": ("DTC_TORCH_MASTER_PORT", 7777),     # torchrun --master_port
    "tf_worker": ("DTC_TF_WORKER_PORT", 8890),           # MultiWorkerMirroredStrategy workers
    "tf_task": ("DTC_TF_TASK_PORT", 2222),               # parameter server: chief and workers
    "tf_ps": ("DTC_TF_PS_PORT", 2223),                   # parameter server: ps tasks
    "tf_end": ("DTC_TF_END_PORT", 2225),                 # parameter server: the chief's end notice
    "presence": ("DTC_PRESENCE_PORT", 2226),             # torchrun, MWMS on several hosts: train's presence
    "preflight": ("DTC_PREFLIGHT_PORT", 2227),           # the preflight's store on the master host
}


@dataclass(frozen=True)
class Ports:
    """TCP ports of the launchers; defaults are the toolkits'. See ``PORT_VARIABLES``."""

    torch_master: int = 7777
    tf_worker: int = 8890
    tf_task: int = 2222
    tf_ps: int = 2223
    tf_end: int = 2225
    presence: int = 2226
    preflight: int = 2227


def ports_from(environ: Mapping[str, str]) -> Ports:
    """Reads the ``DTC_*_PORT`` variables.

    Raises:
        ConfigError: a value that is not a port number (1-65535), or two roles on one port.
    """
    values = {}
    for field_name, (variable, default) in PORT_VARIABLES.items():
        raw = environ.get(variable, "").strip()
        if not raw:
            values[field_name] = default
            continue
        if not raw.isdigit() or not 1 <= int(raw) <= 65535:
            raise ConfigError(f"{variable}={raw!r} is not a TCP port: set it to a number from 1 to 65535",
                              key=variable)
        values[field_name] = int(raw)
    if values["tf_task"] == values["tf_ps"]:
        raise ConfigError(f"DTC_TF_TASK_PORT and DTC_TF_PS_PORT are both {values['tf_ps']}: a host may run a "
                          "parameter server next to a worker, so give them different ports", key="DTC_TF_PS_PORT")
    if values["tf_end"] in (values["tf_task"], values["tf_ps"]):
        raise ConfigError(f"DTC_TF_END_PORT is {values['tf_end']}, a port TensorFlow's servers use: give it a port "
                          "of its own", key="DTC_TF_END_PORT")
    return Ports(**values)


def select(framework_parameters: Mapping[str, object], user_hyperparameters: Mapping[str, object]) -> str:
    """The strategy the hyperparameters ask for (``single`` when none).

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
    enabled = [key for key in STRATEGY_FLAGS if parse_bool(key, framework_parameters.get(key))]
    if len(enabled) > 1:
        described = " and ".join(f"{k} ({STRATEGY_FLAGS[k][1]})" for k in enabled)
        raise ConfigError(
            f"conflicting distribution strategies: {described} are both enabled; pass exactly one "
            "strategy in the estimator's distribution=", key=enabled[1])
    return STRATEGY_FLAGS[enabled[0]][0] if enabled else SINGLE
