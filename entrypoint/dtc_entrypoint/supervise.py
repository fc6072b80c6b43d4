"""Runs a launch plan's command and watches it: output streaming, signal forwarding, exit code.

The plan's services (parameter servers) start first and are stopped (``stop_services``) once the
command has ended, not before: a stopped chief still reads their variables to write its
checkpoint; signals sent to ``train`` are not forwarded to them. Each child gets
its own process group. SIGTERM and SIGINT sent to the entrypoint (SageMaker's
stop and spot interruption send SIGTERM, then SIGKILL 120 s later) are forwarded to that whole
group, so every local process sees them; under MPI they go to each local rank's ``rank_shim``
instead of mpirun, which would kill the ranks a second later. The toolkit forwards nothing
(toolkit #125). What is still alive ``kill_after_s`` after the first signal is killed.
"""

import collections
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import psutil

from . import rank_shim
from .redact import redact_command

log = logging.getLogger(__name__)

STDERR_TAIL_LINES = 400
# How long a failed command's result waits for its watch to say whether a peer was lost (the watch
# polls every few seconds, and may give the command a grace period first: cli._peer_watch).
WATCH_JOIN_S = 30.0
_LINE_END = re.compile(rb"\r\n|\n|\r")
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


@dataclass(frozen=True)
class RunResult:
    """How the command ended.

    Attributes:
        returncode: the exit status; negative ``-N`` when killed by signal N (``subprocess``).
        stderr_tail: the last ``STDERR_TAIL_LINES`` lines it wrote to stderr (already echoed).
        signal_received: the first signal the entrypoint forwarded, if any.
        peer_lost: why ``watch`` ended the command (another host gone), if it did.
    """

    returncode: int
    stderr_tail: tuple[str, ...]
    signal_received: int | None = None
    peer_lost: str | None = None

    @property
    def exit_code(self) -> int:
        """The entrypoint's exit code: the child's, ``128 + N`` for signal N (shell convention)."""
        return 128 - self.returncode if self.returncode < 0 else self.returncode


def _pump(stream, sink, tail: collections.deque) -> None:
    """Copies the child's stderr to ours as it arrives, partial lines included, so a progress bar
    that redraws itself with ``\r`` (tqdm) reaches the log at once rather than at the next newline;
    keeps the last lines (split at ``\n`` and ``\r``) for the failure report."""
    fd = stream.fileno()
    pending = b""
    while chunk := os.read(fd, 65536):
        sink.write(chunk)
        sink.flush()
        *lines, pending = _LINE_END.split(pending + chunk)
        tail.extend(line.decode("utf-8", "replace") for line in lines if line)
    if pending:
        tail.append(pending.decode("utf-8", "replace"))
    stream.close()


def start_service(name: str, argv: Sequence[str], env: Mapping[str, str], workdir: str) -> subprocess.Popen:
    """Starts a service in its own process group, output inherited."""
    log.info("starting service %s: %s", name, redact_command(argv))
    return subprocess.Popen(list(argv), env={**os.environ, **env}, cwd=workdir, stdin=subprocess.DEVNULL,
                            start_new_session=True)


def stop_services(services: Sequence[subprocess.Popen], grace_s: float = 10.0) -> None:
    """SIGTERM to each service's group; SIGKILL for those still running after ``grace_s``."""
    for proc in services:
        if proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)
    for proc in services:
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()


def run(argv: Sequence[str], env: Mapping[str, str], workdir: str, kill_after_s: float = 110.0,
        watch: Callable[[Callable[[], bool]], str | None] | None = None, merge_stdout: bool = False) -> RunResult:
    """Runs ``argv`` (no shell) with ``os.environ`` plus ``env`` in ``workdir`` and waits.

    stdout is inherited (no copy, no buffering); stderr passes through a pipe so its tail can name
    the error. ``merge_stdout`` sends stdout through that pipe too (to our stderr), for a command
    that explains its errors on stdout (pip's dependency conflicts). Signals received go to the
    command only. ``watch(done)``, if given, runs beside the command (``done()`` turns true when
    it has exited) and returns why the job cannot go on (another host gone) or ``None``: the
    command's processes are then killed if still running, and the reason is the result's
    ``peer_lost`` when the command failed (not after a stop signal: then every host is ending
    anyway). A command that exits 0 succeeded, whatever its watch saw.
    Returns when the command has exited.

    Raises:
        FileNotFoundError / PermissionError: the command cannot be executed.
    """
    full_env = {**os.environ, **env}
    log.info("running: %s", redact_command(argv))
    received: list[int] = []
    killer: list[threading.Timer] = []
    children: list[subprocess.Popen] = []

    def forward(signum, _frame):
        if not received:
            received.append(signum)
            log.warning("received %s: forwarding it to the training processes", signal.Signals(signum).name)
        if not children:   # not started yet: it gets the signal as soon as it is
            return
        if not killer:
            timer = threading.Timer(kill_after_s, _kill_after_grace, args=(children[0].pid,))
            timer.daemon = True
            timer.start()
            killer.append(timer)
        # MPI: each rank's shim gets the signal, not mpirun, which would kill the ranks at once
        shims = rank_shim.signal_shims(signum, parent_pid=children[0].pid)
        if shims:
            log.info("passed %s to %d rank shim(s)", signal.Signals(signum).name, shims)
        else:
            _signal_group(children[0].pid, signum)

    # handlers first, so that no stop falls between the start and the handlers
    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    try:
        child = subprocess.Popen(
            list(argv), env=full_env, cwd=workdir, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if merge_stdout else None,
            stderr=subprocess.STDOUT if merge_stdout else subprocess.PIPE, start_new_session=True,
        )
    except BaseException:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        raise
    children.append(child)
    tail: collections.deque = collections.deque(maxlen=STDERR_TAIL_LINES)
    output = child.stdout if merge_stdout else child.stderr
    pump = threading.Thread(target=_pump, args=(output, sys.stderr.buffer, tail), daemon=True)
    pump.start()
    if received:
        forward(received[0], None)
    lost: list[str] = []
    watching = None
    if watch is not None:
        def watcher():
            reason = watch(lambda: child.poll() is not None)
            if not reason or received:   # stopping: the other hosts end too
                return
            lost.append(reason)          # names the lost host if the command fails (it may have already)
            if child.poll() is None:
                log.error("%s: ending the training processes", reason)
                _kill_group(child.pid)

        watching = threading.Thread(target=watcher, daemon=True)
        watching.start()
    try:
        returncode = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for timer in killer:
            timer.cancel()
    if watching is not None and returncode != 0:
        watching.join(timeout=WATCH_JOIN_S)   # a failure right after a peer closed: let the watch name it
    pump.join(timeout=10)
    return RunResult(returncode, tuple(tail), received[0] if received else None,
                     lost[0] if lost and returncode != 0 else None)


def _kill_after_grace(pid: int) -> None:
    log.error("training processes still running after the grace period: killing them")
    _kill_group(pid)


def _signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        pass


def _kill_group(pid: int) -> None:
    """SIGKILL to the command's process group and every descendant."""
    try:
        descendants = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        descendants = []
    _signal_group(pid, signal.SIGKILL)
    for process in descendants:   # ranks in process groups of their own (OpenMPI's daemons make them)
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
