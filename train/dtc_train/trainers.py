"""The built-in trainers, one record each (``registry()``): what ``builtin:<framework>`` runs
under each strategy, and the traits the hyperparameters' declarations read (``dtc_train.config``).

Read by the entrypoint's ``program.builtin`` (which trainer module a job runs), by
``dtc_train.config`` (the option groups: PyTorch's, TensorFlow's, the DALI input's, the
synchronous trainers'), and by docs/trainers.md's table. Imports neither TensorFlow nor PyTorch.
A new trainer is its module (a ``loop.Backend`` and a ``main``) and a record here
(docs/development.md), or a record another installed distribution registers under the entry-point
group ``dtc.trainers`` (``registry``).
"""

import functools
import importlib.metadata
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class Trainer:
    """A built-in trainer.

    Attributes:
        backend: its name in messages and in ``dtc_train.config``, and its module's under
            ``package`` (``pytorch_ddp``).
        framework: ``pytorch`` or ``tensorflow``: ``sagemaker_program`` ``builtin:<framework>``.
        strategies: the entrypoint's strategies it runs under (``dtc_entrypoint.launchers.Strategy``
            values); ``single`` also on the hosts outside a heterogeneous job's distribution.
        describes: what it is, for messages.
        dali_input: its input is a DALI pipeline (``data-device``, ``dali-threads`` apply).
        synchronous: every step runs on every rank (progress lines, a step's loss apply).
        package: the package of its module (another distribution's, for a registered trainer).
    """

    backend: str
    framework: str
    strategies: tuple[str, ...]
    describes: str
    dali_input: bool
    synchronous: bool = True
    package: str = "dtc_train"

    @property
    def module(self) -> str:
        """The module ``python -m`` runs (``dtc_train.pytorch_ddp``)."""
        return f"{self.package}.{self.backend}"


BUILT_IN = (
    Trainer("pytorch_single", "pytorch", ("single",),
            "builtin:pytorch alone (one process, no collectives, DALI input)", dali_input=True),
    Trainer("pytorch_horovod", "pytorch", ("mpi",), "builtin:pytorch under mpi (Horovod, DALI input)", dali_input=True),
    Trainer("pytorch_ddp", "pytorch", ("torch_distributed",),
            "builtin:pytorch under torch_distributed (DDP or FSDP2, DALI input)", dali_input=True),
    Trainer("tensorflow_horovod", "tensorflow", ("mpi",),
            "builtin:tensorflow under mpi (Horovod with tf-keras, DALI input)", dali_input=True),
    # MirroredStrategy over the host's GPUs alone, MultiWorkerMirroredStrategy under the strategy
    Trainer("tensorflow_mwms", "tensorflow", ("single", "multi_worker_mirrored_strategy"),
            "builtin:tensorflow alone or under multi_worker_mirrored_strategy (MirroredStrategy / "
            "MultiWorkerMirroredStrategy, tf.data input)", dali_input=False),
    # steps are scheduled asynchronously on the workers
    Trainer("tensorflow_ps", "tensorflow", ("parameter_server",),
            "builtin:tensorflow under parameter_server (ParameterServerStrategy chief, tf.data input)",
            dali_input=False, synchronous=False),
)
# Trainers other installed distributions add: entry points in this group, each naming a ``Trainer``.
ENTRY_POINT_GROUP = "dtc.trainers"


@functools.cache
def registry() -> Mapping[str, Trainer]:
    """Every trainer by backend name: the built-in ones (``BUILT_IN``), then those registered
    under ``ENTRY_POINT_GROUP``, read once.

    Raises:
        TypeError: a registered entry point is not a ``Trainer``.
        ValueError: it takes a built-in or registered trainer's name, or a framework and strategy
            another trainer runs.
        Exception: what loading a registered entry point raises.
    """
    trainers = list(BUILT_IN)
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        trainer = entry.load()
        where = f"entry point {entry.name} = {entry.value} (group {ENTRY_POINT_GROUP})"
        if not isinstance(trainer, Trainer):
            raise TypeError(f"{where} is a {type(trainer).__name__}, not a dtc_train.trainers.Trainer")
        runs = {(other.framework, strategy) for other in trainers for strategy in other.strategies}
        if trainer.backend in {other.backend for other in trainers} or \
                runs & {(trainer.framework, strategy) for strategy in trainer.strategies}:
            raise ValueError(f"{where}: its name or its framework and strategies belong to another trainer")
        trainers.append(trainer)
    return MappingProxyType({trainer.backend: trainer for trainer in trainers})


def for_program(framework: str) -> dict[str, Trainer]:
    """``builtin:<framework>``'s trainers by strategy (empty for an unknown framework)."""
    return {strategy: trainer for trainer in registry().values() if trainer.framework == framework
            for strategy in trainer.strategies}


def frameworks() -> tuple[str, ...]:
    """Every trainer's framework, in the registry's order (``builtin:<framework>``)."""
    return tuple(dict.fromkeys(trainer.framework for trainer in registry().values()))
