"""Fault injection for tests and rehearsals: make one rank die at a chosen training step, the
way a crash, ``kill -9`` or the kernel's OOM killer would, to see how the whole job reacts.

Set ``DTC_FAULT`` in the job's environment (an estimator's ``environment``, ``make cluster``'s
job file, or ``docker run -e``), e.g. ``DTC_FAULT="rank=3 step=20 signal=KILL"``: the built-in
trainers' rank 3 sends itself SIGKILL after the job's 20th optimizer step (counted over epochs
from 1, and over restarts: a job resumed past step 20 is not struck again; the parameter-server
chief schedules its steps on the workers and counts none). Keys:
``rank`` (global rank, required), ``step`` (required), ``signal`` (a name without ``SIG``:
``KILL`` by default, ``SEGV``, ``TERM``, ...) or ``exit`` (an exit code instead of a signal). Ranks other than ``rank`` are unaffected. To take a whole host down, stop its container
from outside (``podman kill``/``docker kill``; tests/test_cluster.py does).

Raises ``ValueError`` naming ``DTC_FAULT`` when the value does not parse.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

ENV = "DTC_FAULT"


@dataclass(frozen=True)
class Fault:
    """One injected fault: ``rank`` dies after global step ``step`` by ``signal`` or ``exit_code``."""

    rank: int
    step: int
    signal: signal.Signals | None = signal.SIGKILL
    exit_code: int | None = None

    def strike(self) -> None:
        """Ends this process as configured (does not return)."""
        if self.exit_code is not None:
            os._exit(self.exit_code)
        os.kill(os.getpid(), self.signal)


def parse(text: str) -> Fault:
    """``"rank=R step=S [signal=NAME | exit=N]"`` (spaces or commas between keys)."""
    fields = dict(item.split("=", 1) for item in text.replace(",", " ").split() if "=" in item)
    unknown = set(fields) - {"rank", "step", "signal", "exit"}
    try:
        if unknown or not {"rank", "step"} <= set(fields) or {"signal", "exit"} <= set(fields):
            raise ValueError
        exit_code = int(fields["exit"]) if "exit" in fields else None
        sig = None if exit_code is not None else signal.Signals["SIG" + fields.get("signal", "KILL").upper()]
        fault = Fault(rank=int(fields["rank"]), step=int(fields["step"]), signal=sig, exit_code=exit_code)
    except (ValueError, KeyError):
        raise ValueError(f"{ENV}={text!r} does not parse: use 'rank=R step=S' with optional 'signal=KILL' "
                         "(or another signal name) or 'exit=N'") from None
    if fault.step < 1 or fault.rank < 0:
        raise ValueError(f"{ENV}={text!r}: rank must be >= 0 and step >= 1")
    return fault


def for_rank(rank: int) -> Fault | None:
    """The fault ``DTC_FAULT`` asks of ``rank``, or ``None``."""
    text = os.environ.get(ENV, "").strip()
    if not text:
        return None
    fault = parse(text)
    return fault if fault.rank == rank else None
