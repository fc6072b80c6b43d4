"""Fault injection for tests and rehearsals: make one rank, or a whole host, die at a chosen
training step, the way a crash, ``kill -9``, the kernel's OOM killer or a lost instance would,
to see how the whole job reacts.

Set ``DTC_FAULT`` in the job's environment (an estimator's ``environment``, ``make cluster``'s
job file, or ``docker run -e``):

- ``DTC_FAULT="rank=3 step=20 signal=KILL"``: the built-in trainers' rank 3 sends itself SIGKILL
  after the job's 20th optimizer step. ``signal`` is a name without ``SIG`` (``KILL`` by default,
  ``SEGV``, ``TERM``, ...); ``exit=N`` exits with code N instead; ``stall=S`` makes it sleep S
  seconds (in ``stuck``) and then go on, as a rank stuck in its data loading would, while the
  others wait for it in their next collective. Other ranks are unaffected.
- ``DTC_FAULT="host=algo-2 step=20"``: after step 20 the ranks on host ``algo-2`` kill every
  process of that host's container with SIGKILL (its ranks, ``orted``, ``sshd``, servers)
  except its PID 1, ``train``: to the other hosts the host is gone, as when an instance dies.
  Only in a container whose PID 1 is ``train`` (refused elsewhere, where it would hit the
  machine's own processes); to remove the container itself, ``podman kill`` / ``docker kill``
  it from outside (tests/cluster/test_cluster.py does both).

Steps count over epochs from 1, and over restarts: a job resumed past step 20 is not struck
again. The parameter-server chief schedules its steps on the workers and counts none.

Raises ``ValueError`` naming ``DTC_FAULT`` when the value does not parse.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

ENV = "DTC_FAULT"
# A host fault waits this long between its log line and the kill: the line goes through the host's
# ``orted`` to ``mpirun`` on the master, and killing ``orted`` at once lost it (a CI run, 2026-11-23).
HOST_FAULT_LOG_GRACE_S = 2.0


@dataclass(frozen=True)
class Fault:
    """One injected fault: ``rank`` (or every rank on ``host``) strikes after global step ``step``,
    by ``signal`` or ``exit_code`` (a rank) or by killing the host's processes (a host)."""

    rank: int | None
    step: int
    signal: signal.Signals | None = signal.SIGKILL
    exit_code: int | None = None
    host: str | None = None
    stall_s: float | None = None

    def describe(self) -> str:
        if self.host:
            return f"killing every process of host {self.host} but its train"
        if self.stall_s is not None:
            return f"stuck for {self.stall_s:g} s"
        return self.signal.name if self.signal else f"exit {self.exit_code}"

    def strike(self, step: int) -> None:
        """Ends this process (and, for a host fault, the host's others) as configured, and does
        not return; a stall returns after ``stall_s`` seconds. A host fault first writes the host's
        failure file (``train`` outlives the others and reports it) and waits
        ``HOST_FAULT_LOG_GRACE_S`` for its log line to leave the host."""
        if self.stall_s is not None:
            stuck(self.stall_s)
            return
        if self.host:
            from . import common, contract  # noqa: PLC0415

            failure = os.path.join(contract.output_dir(), "failure")
            if not os.path.exists(failure):
                common.write_text(failure, f"host {self.host}: {ENV} killed every process of this host but train after "
                                           f"step {step} (an injected host failure)\n")
            time.sleep(HOST_FAULT_LOG_GRACE_S)
            _kill_container_processes()
        if self.exit_code is not None:
            os._exit(self.exit_code)
        os.kill(os.getpid(), self.signal)


def stuck(seconds: float) -> None:
    """Sleeps ``seconds``: where a stalled rank's stack points (``DTC_FAULT`` ``stall=S``)."""
    time.sleep(seconds)


def _kill_container_processes() -> None:
    import psutil  # noqa: PLC0415

    init = psutil.Process(1)
    command = init.cmdline()   # the image's entry runs `python -m dtc_entrypoint`; an installed `train` script too
    if "dtc_entrypoint" not in command and not any(os.path.basename(part) == "train" for part in command[:2]):
        raise RuntimeError(f"{ENV} host=...: PID 1 is not train ({' '.join(command)[:80]}): host faults only run "
                           "in the "
                           "job's container, where they cannot reach the machine's own processes")
    for process in init.children(recursive=True):
        if process.pid != os.getpid():
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass


def parse(text: str) -> Fault:
    """``"rank=R step=S [signal=NAME | exit=N | stall=SECONDS]"`` or ``"host=H step=S"`` (spaces
    or commas between keys)."""
    fields = dict(item.split("=", 1) for item in text.replace(",", " ").split() if "=" in item)
    unknown = set(fields) - {"rank", "host", "step", "signal", "exit", "stall"}
    actions = {"signal", "exit", "stall"} & set(fields)
    try:
        if (unknown or "step" not in fields or len({"rank", "host"} & set(fields)) != 1 or len(actions) > 1
                or ("host" in fields and actions)):
            raise ValueError
        if "host" in fields:
            fault = Fault(rank=None, step=int(fields["step"]), host=fields["host"])
        elif "stall" in fields:
            fault = Fault(rank=int(fields["rank"]), step=int(fields["step"]), signal=None,
                          stall_s=float(fields["stall"]))
        else:
            exit_code = int(fields["exit"]) if "exit" in fields else None
            sig = None if exit_code is not None else signal.Signals["SIG" + fields.get("signal", "KILL").upper()]
            fault = Fault(rank=int(fields["rank"]), step=int(fields["step"]), signal=sig, exit_code=exit_code)
    except (ValueError, KeyError):
        raise ValueError(f"{ENV}={text!r} does not parse: use 'rank=R step=S' with optional 'signal=KILL' "
                         "(or another signal name), 'exit=N' or 'stall=SECONDS', or 'host=H step=S'") from None
    if fault.step < 1 or (fault.rank is not None and fault.rank < 0) or (fault.stall_s or 0) < 0:
        raise ValueError(f"{ENV}={text!r}: rank must be >= 0, step >= 1 and stall >= 0")
    return fault


def for_rank(rank: int, host: str) -> Fault | None:
    """The fault ``DTC_FAULT`` asks of ``rank`` running on ``host``, or ``None``."""
    text = os.environ.get(ENV, "").strip()
    if not text:
        return None
    fault = parse(text)
    return fault if fault.rank == rank or (fault.host is not None and fault.host == host) else None
