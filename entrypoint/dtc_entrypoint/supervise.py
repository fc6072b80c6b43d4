"""Runs a launch plan's command and watches it: output streaming, signal forwarding, stalls, exit code.

The plan's services (parameter servers) start first and are stopped (``stop_services``) once the
command has ended, not before: a stopped chief still reads their variables to write its
checkpoint; signals sent to ``train`` are not forwarded to them. Each child gets
its own process group. SIGTERM and SIGINT sent to the entrypoint (SageMaker's
stop and spot interruption send SIGTERM, then SIGKILL 120 s later) are forwarded to that whole
group, so every local process sees them; under MPI they go to each local rank's ``rank_shim``
instead of mpirun, which would kill the ranks a second later. The toolkit forwards nothing
(toolkit #125). What is still alive ``kill_after_s`` after the first signal is killed.

A ``StallRule`` ends a command that shows no progress: no output (a byte on stdout, a complete
line on stderr other than those the rule calls quiet, from any process), no touch of the
heartbeat file and (where the rule says) no busy CPU for
``timeout_s``, once ``timeout_s`` plus ``startup_grace_s`` have passed since the start (a first
step compiling, data downloading); its ``on_stall`` names where the processes are before they
are killed, also on a host that does not judge (``StallRule.judges``) when another host reports
a stall.
"""

import collections
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import psutil

from . import rank_shim
from .redact import redact_command
from .report import STALLED

log = logging.getLogger(__name__)

STDERR_TAIL_LINES = 400
# StallRule.busy_cpu_s is measured over this many seconds.
BUSY_WINDOW_S = 10.0
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
        stalled: what ``StallRule.on_stall`` said when the command was ended for a stall.
    """

    returncode: int
    stderr_tail: tuple[str, ...]
    signal_received: int | None = None
    peer_lost: str | None = None
    stalled: str | None = None

    @property
    def exit_code(self) -> int:
        """The entrypoint's exit code: the child's, ``128 + N`` for signal N (shell convention)."""
        return 128 - self.returncode if self.returncode < 0 else self.returncode


@dataclass(frozen=True)
class StallRule:
    """When a command counts as stalled (the module's docstring).

    Attributes:
        timeout_s: seconds without progress (> 0).
        startup_grace_s: seconds added to the first ``timeout_s`` after the start.
        heartbeat_file: a file whose modification time counts as progress (``$DTC_HEARTBEAT_FILE``).
        on_stall: called with the seconds without progress and the last lines of stderr while
            the processes still run; returns the failure's account (its first line the headline).
        judges: whether this host's output is the job's progress. ``False`` on a torchrun host
            other than the master, whose ranks print nothing in a healthy job: it never calls a
            stall itself, and calls ``on_stall`` when the ``watch`` reports another host's stall
            (``report.STALLED``), so that its ranks' stacks are read before they are ended.
        busy_cpu_s: CPU-seconds the command's processes (all of them, together) must use within
            ``BUSY_WINDOW_S`` to count as progress, so that a silent job that computes is not
            flagged; ``None``: output and heartbeat only (under MPI, whose waiting ranks spin).
        ends_job: whether a stall ends the command; ``False``: ``on_stall``'s account is logged
            and the command runs on, its next stall read after another ``timeout_s``.
        quiet: says which lines of stderr are not progress (Horovod's stall inspector's
            warnings, which repeat while the job stalls: ``report.horovod_stall_line``).
    """

    timeout_s: float
    startup_grace_s: float
    heartbeat_file: str
    on_stall: Callable[[float, Sequence[str]], str]
    judges: bool = True
    busy_cpu_s: float | None = None
    ends_job: bool = True
    quiet: Callable[[str], bool] | None = None

    def idle_s(self, last_output: float, now: float) -> float:
        """Seconds since the last progress: output at ``last_output`` (``time.monotonic``) or
        the heartbeat file's last touch, whichever came later."""
        try:
            touched = time.time() - os.stat(self.heartbeat_file).st_mtime
        except OSError:
            touched = float("inf")
        return min(now - last_output, touched)


class _Progress:
    """The time (``time.monotonic``) of the command's last output, for ``StallRule``; lines
    ``quiet`` accepts do not count (``StallRule.quiet``)."""

    def __init__(self, quiet: Callable[[str], bool] | None = None):
        self.last = time.monotonic()
        self.quiet = quiet

    def seen(self) -> None:
        self.last = time.monotonic()

    def lines(self, lines: Sequence[str]) -> None:
        if any(self.quiet is None or not self.quiet(line) for line in lines):
            self.seen()


def _pump(stream, sink, tail: collections.deque | None, progress: _Progress) -> None:
    """Copies the child's stdout or stderr to ours as it arrives, partial lines included, so a
    progress bar that redraws itself with ``\r`` (tqdm) reaches the log at once rather than at
    the next newline; keeps the last lines (split at ``\n`` and ``\r``) in ``tail`` for the
    failure report, if given. ``progress``: each chunk is progress, or, with a ``tail``, each
    complete line but those ``progress.quiet`` accepts (mpirun writes a line of Horovod's report
    in pieces). A sink that cannot be written (a closed pipe) is dropped and the stream still
    drained, so the child never blocks on it."""
    fd = stream.fileno()
    pending = b""
    while chunk := os.read(fd, 65536):
        if tail is None:
            progress.seen()
        if sink is not None:
            try:
                sink.write(chunk)
                sink.flush()
            except OSError:
                sink = None
        if tail is None:
            continue
        *lines, pending = _LINE_END.split(pending + chunk)
        complete = [line.decode("utf-8", "replace") for line in lines if line]
        tail.extend(complete)
        progress.lines(complete)
    if pending and tail is not None:
        tail.append(pending.decode("utf-8", "replace"))
    stream.close()


class _CpuUse:
    """The CPU time of a process and its descendants, sampled (``sample``); a process that has
    exited keeps its last reading, so the total never falls."""

    def __init__(self, pid: int):
        self.pid = pid
        self._seconds: dict[int, float] = {}
        self._samples: collections.deque = collections.deque()

    def sample(self, now: float) -> None:
        try:
            root = psutil.Process(self.pid)
            processes = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            processes = []
        for process in processes:
            try:
                times = process.cpu_times()
                self._seconds[process.pid] = times.user + times.system
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass
        self._samples.append((now, sum(self._seconds.values())))
        while now - self._samples[0][0] > BUSY_WINDOW_S:
            self._samples.popleft()

    def used_s(self) -> float:
        """CPU-seconds used over the last ``BUSY_WINDOW_S`` seconds of samples."""
        return self._samples[-1][1] - self._samples[0][1] if self._samples else 0.0


def _watch_for_stall(rule: StallRule, progress: _Progress, started: float, pid: int, done: threading.Event,
                     tail: collections.deque, poll_s: float = 1.0) -> float | None:
    """Waits until the command is done (``done`` set: ``None``, at once, not at the next poll,
    which every job's end waited for until 2026-12-03) or stalled (returns the seconds without
    progress); with ``rule.ends_job`` false, logs each stall's account and watches on."""
    cpu = _CpuUse(pid)
    last_busy = float("-inf")   # no busy CPU seen yet: idle since the last output (or the start)
    while not done.is_set():
        now = time.monotonic()
        quiet_s = rule.idle_s(progress.last, now)
        # the CPU is sampled only once output and heartbeat have been quiet for long enough that a
        # full window of samples is ready at the timeout: a job that prints is never walked
        if rule.busy_cpu_s is not None and quiet_s >= rule.timeout_s - BUSY_WINDOW_S - 2 * poll_s:
            cpu.sample(now)
            if cpu.used_s() >= rule.busy_cpu_s:
                last_busy = now
        elif rule.busy_cpu_s is not None:
            cpu, last_busy = _CpuUse(pid), float("-inf")
        idle_s = min(quiet_s, now - last_busy)
        if idle_s >= rule.timeout_s and now - started >= rule.timeout_s + rule.startup_grace_s:
            if rule.ends_job:
                return idle_s
            log.error("%s", rule.on_stall(idle_s, tuple(tail)).rstrip("\n"))
            log.error("the job runs on (it is not ended for a stall); its stacks are read again after another "
                      "%.0f s without progress", rule.timeout_s)
            progress.seen()
            last_busy = time.monotonic()
        done.wait(poll_s)
    return None


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
        watch: Callable[[Callable[[], bool]], str | None] | None = None, merge_stdout: bool = False,
        stall: StallRule | None = None) -> RunResult:
    """Runs ``argv`` (no shell) with ``os.environ`` plus ``env`` in ``workdir`` and waits.

    stdout and stderr pass through pipes, copied to ours as they arrive (the progress a
    ``stall`` rule reads); stderr's tail names the error. ``merge_stdout`` sends stdout through
    stderr's pipe (to our stderr), for a command that explains its errors on stdout (pip's
    dependency conflicts). ``stall``: the command is ended when it stalls (``StallRule``), and
    the result's ``stalled`` says where it was. Signals received go to the
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
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merge_stdout else subprocess.PIPE,
            start_new_session=True,
        )
    except BaseException:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        raise
    children.append(child)
    tail: collections.deque = collections.deque(maxlen=STDERR_TAIL_LINES)
    progress = _Progress(stall.quiet if stall is not None else None)
    pumps = [threading.Thread(target=_pump, args=(child.stdout, sys.stderr.buffer, tail, progress), daemon=True)]
    if not merge_stdout:
        pumps = [threading.Thread(target=_pump, args=(child.stdout, sys.stdout.buffer, None, progress), daemon=True),
                 threading.Thread(target=_pump, args=(child.stderr, sys.stderr.buffer, tail, progress), daemon=True)]
    for pump in pumps:
        pump.start()
    if received:
        forward(received[0], None)
    lost: list[str] = []
    stalled: list[str] = []
    ended = threading.Event()   # the command has exited
    watching = stalling = None
    if watch is not None:
        def watcher():
            reason = watch(lambda: child.poll() is not None)
            if not reason or received:   # stopping: the other hosts end too
                return
            peer_stall = STALLED.match(reason) if stall is not None else None
            if peer_stall and child.poll() is None and not stalled:   # this host's stacks, before the end
                stalled.append(stall.on_stall(float(peer_stall.group(1)), tuple(tail)))
            lost.append(reason)          # names the lost host if the command fails (it may have already)
            if child.poll() is None:
                log.error("%s: ending the training processes", reason)
                _kill_group(child.pid)

        watching = threading.Thread(target=watcher, daemon=True)
        watching.start()
    if stall is not None and stall.judges:
        def stall_watcher():
            idle_s = _watch_for_stall(stall, progress, time.monotonic(), child.pid, ended, tail)
            if idle_s is None or received or lost:
                return
            log.error("no output and no heartbeat from the training processes for %.0f s: reading their stacks",
                      idle_s)
            stalled.append(stall.on_stall(idle_s, tuple(tail)))
            if child.poll() is None:
                log.error("%s: ending the training processes", stalled[0].splitlines()[0])
                _kill_group(child.pid)

        stalling = threading.Thread(target=stall_watcher, daemon=True)
        stalling.start()
    try:
        returncode = child.wait()
    finally:
        ended.set()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for timer in killer:
            timer.cancel()
    if watching is not None and returncode != 0:
        watching.join(timeout=WATCH_JOIN_S)   # a failure right after a peer closed: let the watch name it
    if stalling is not None:
        stalling.join(timeout=WATCH_JOIN_S)   # killed for a stall: its account is being written
    deadline = time.monotonic() + 10   # a process the command left behind may hold a pipe open
    for pump in pumps:
        pump.join(timeout=max(0.0, deadline - time.monotonic()))
    return RunResult(returncode, tuple(tail), received[0] if received else None,
                     lost[0] if lost and returncode != 0 else None,
                     stalled[0] if stalled and returncode != 0 else None)


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
