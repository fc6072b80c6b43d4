"""Launch plans: pure functions from ``JobConfig`` and ``Program`` to this host's ``LaunchPlan``.

Nothing here starts a process or reads files; ``supervise`` runs what ``build`` returns and
``train --plan`` prints it. One module per launcher (``launch_single``, ``launch_mpi``,
``launch_torch``, ``launch_tf``), its plan function named in its record (``launchers``), which
also names the plan's strategy.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from . import launchers
from .plan import LaunchPlan

if TYPE_CHECKING:
    from .config import JobConfig
    from .program import Program

__all__ = ["LaunchPlan", "build"]


def build(config: JobConfig, program: Program) -> LaunchPlan:
    """The plan for this host. A strategy applies only on hosts of the distribution groups;
    the other hosts of a heterogeneous cluster run the program alone, as sagemaker-training's
    ``trainer.train`` does (aws/sagemaker-training-toolkit, ``trainer.py``)."""
    launcher = launchers.of(config.strategy if config.is_distributed_host else launchers.Strategy.SINGLE)
    return dataclasses.replace(launcher.plan(config, program), strategy=launcher.strategy)
