"""Runs one MPI rank's program and passes stop signals to it, so that mpirun cannot cut a rank's
checkpoint short.

mpirun, sent SIGTERM, forwards it to its ranks and kills them after OpenMPI's
``odls_base_sigkill_timeout`` (1 s; about 2 s observed); and with ``orte_abort_on_non_zero_status``
the first rank to exit non-zero makes it kill the others just as fast. SageMaker gives a stopped
job 120 s. So on a stop ``train`` leaves mpirun alone and signals this shim, one per rank (on every
host: ``supervise`` on the master, ``mpi_hosts.serve_as_worker`` elsewhere). The shim forwards the
signal to its program, waits for it however long it takes (``train`` kills what is left after
its own grace), and then exits 0, so that one rank finishing its save first does not abort the
ranks still saving. Without a stop it exits with the program's code (``128 + N`` for signal N),
and mpirun's failure handling is unchanged; a rank that dies of a signal is named first, on
stderr (``rank 3 on host algo-2 was killed by SIGKILL``): mpirun itself names neither the host
nor the signal, and ``report.describe_failure`` makes that line the failure's first; a rank whose
program exits non-zero is named the same way (``rank 1 on host algo-2 exited with code 3``), and
that line comes first when the program printed no exception. A rank that
ends (finished, failed or killed by a signal; not stopped) also leaves a note for its own host
(``record_outcome``), so that a worker host, whose ranks' output goes to the master, can name a
failed rank in its own failure file and exit non-zero too, and can tell ranks that finished from
ranks that ``orted`` ended because the master's mpirun aborted or its host was lost.

Usage (in mpirun's command, before the program): ``python -m dtc_entrypoint.rank_shim PROGRAM [ARGS...]``.
"""

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterable

from . import host_identity, memory, report, stack_dump

MODULE = "dtc_entrypoint.rank_shim"
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def signal_shims(signum: int, parent_pid: int | None = None) -> int:
    """Sends ``signum`` to every running shim: those descended from ``parent_pid`` (mpirun, on
    the master), or all on this host (a worker host, where ``orted`` started them). Returns how
    many were signalled. Used by ``train``, never inside a rank (psutil is imported here only)."""
    import psutil  # noqa: PLC0415

    if parent_pid is None:
        candidates = list(psutil.process_iter())
    else:
        try:
            candidates = psutil.Process(parent_pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return 0
    signalled = 0
    for process in candidates:
        try:
            if MODULE in process.cmdline():
                process.send_signal(signum)
                signalled += 1
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return signalled


def outcome_dir() -> str:
    """Where this host's ranks leave their notes (beside host_identity's file)."""
    return os.path.join(os.path.dirname(host_identity.host_env_file()), "rank-outcomes")


def record_outcome(rank: str, text: str, exit_code: int) -> None:
    """Leaves ``{"rank", "text", "exit_code"}`` (``exit_code`` 0: the rank finished) for this
    host's entrypoint (``recorded_outcomes``)."""
    directory = outcome_dir()
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".rank-{rank}.tmp")
    with open(tmp, "w") as handle:
        json.dump({"rank": rank, "text": text, "exit_code": exit_code}, handle)
    os.replace(tmp, os.path.join(directory, f"rank-{rank}.json"))


def recorded_outcomes() -> list[dict]:
    """The notes ``record_outcome`` left on this host, oldest first."""
    directory = outcome_dir()
    if not os.path.isdir(directory):
        return []
    paths = sorted((os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(".json")),
                   key=os.path.getmtime)
    notes = []
    for path in paths:
        with open(path) as handle:
            notes.append(json.load(handle))
    return notes


def unfinished(ranks: Iterable[int]) -> list[int]:
    """Those of ``ranks`` (this host's) that left no note: ended by ``orted`` (the master's
    mpirun aborted the job, or its host was lost) or by a stop, not by finishing."""
    noted = {str(note["rank"]) for note in recorded_outcomes()}
    return [rank for rank in ranks if str(rank) not in noted]


def clear_outcomes() -> None:
    """Removes this host's notes (a worker host, before the master starts its ranks)."""
    directory = outcome_dir()
    if os.path.isdir(directory):
        for name in os.listdir(directory):
            os.remove(os.path.join(directory, name))


def run(argv: list[str]) -> int:
    """Runs ``argv`` (no shell), forwarding ``FORWARDED_SIGNALS``; returns the shim's exit code."""
    oom_kills_before = memory.oom_kills()   # a SIGKILL is the OOM killer's if this grows meanwhile
    child = subprocess.Popen(argv)
    stopped: list[int] = []

    def forward(signum, _frame):
        if signum in STOP_SIGNALS:
            stopped.append(signum)
        elif signum == stack_dump.SIGNAL and not stack_dump.catches(child.pid):
            return   # a request for stacks (stack_dump) must not kill a program without the handler
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, forward)
    code = child.wait()
    if stopped:
        return 0
    exit_code = 128 - code if code < 0 else code
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", "?")
    text = ""
    if code != 0:
        host = (host_identity.read().get("SM_CURRENT_HOST") or os.environ.get("SM_CURRENT_HOST")
                or socket.gethostname())
        if code < 0:
            text = report.rank_death(rank, host, report.signal_label(-code),
                                     oom_killed=memory.oom_killed_since(oom_kills_before))
            sys.stderr.write(f"[dtc] {text} (exit code {exit_code})\n")
            sys.stderr.flush()
        else:
            text = report.rank_exit(rank, host, code)
            sys.stderr.write(f"[dtc] {text}\n")
            sys.stderr.flush()
    if os.path.isfile(host_identity.host_env_file()):   # a job of several hosts (cli writes it)
        record_outcome(rank, text, exit_code)
    return exit_code


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m dtc_entrypoint.rank_shim PROGRAM [ARGS...]")
    sys.exit(run(sys.argv[1:]))
