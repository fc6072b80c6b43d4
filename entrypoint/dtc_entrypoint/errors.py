"""Errors the entrypoint reports to the user, each mapped to an exit code.

Every message's first line says what is wrong and which key, variable or flag to change: that
line becomes the first line of ``/opt/ml/output/failure`` and so the training job's
``FailureReason`` (SageMaker shows the file's first 1024 characters).
"""

# Exit codes. 2 follows the Unix convention for bad usage/configuration; a failing training
# program passes its own code through (see supervise.exit_code_of).
EXIT_CONFIG_ERROR = 2
EXIT_INTERNAL_ERROR = 1
EXIT_PEER_ERROR = 3
# The preflight found a host that cannot run the job (dtc_entrypoint.preflight).
EXIT_PREFLIGHT_ERROR = 4
# The job showed no progress for the stall timeout and was ended (supervise.StallRule)
# (not 124, timeout(1)'s, which dtc_local.cluster reports for a host that outran its test).
EXIT_STALLED = 5


class ConfigError(Exception):
    """The job's configuration (hyperparameters, config files, environment) is invalid.

    Attributes:
        key: the hyperparameter, environment variable or file the user should change.
    """

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


class ProgramNotFoundError(ConfigError):
    """The training program named by sagemaker_program / SAGEMAKER_PROGRAM cannot be found."""


class DependencyError(ConfigError):
    """``pip install`` of the program's requirements.txt or package failed; the message's first
    line is pip's own error."""


class PeerError(TimeoutError):
    """Another host of the job could not be resolved or reached in time (the cluster did not
    form). The message names the host and the variable that sets the wait."""


class StoppedBeforeLaunch(BaseException):
    """SIGTERM/SIGINT reached ``train`` before the training processes started (reading the
    config, fetching the code, installing its requirements, waiting for the other hosts):
    the job is stopped there, with exit code ``128 + signum``.

    A ``BaseException``, like ``KeyboardInterrupt``, because the signal handler raises it
    wherever the main thread is, and code that catches ``Exception`` would swallow it: a stop
    arriving while ``logging`` wrote a line was lost that way, and ``train`` went on waiting.

    Attributes:
        signum: the signal.
        phase: what ``train`` was doing (for the failure file).
    """

    def __init__(self, signum: int, phase: str):
        import signal  # noqa: PLC0415

        super().__init__(f"stopped by {signal.Signals(signum).name} while {phase}, before training started")
        self.signum, self.phase = signum, phase


class PreflightError(Exception):
    """The preflight found that a host cannot run the job (a GPU, its driver, a component's
    architectures, the network between the hosts); the message's first line names the host and
    what to change."""
