"""The success and failure files of the SageMaker contract, and the failure reason's text.

SageMaker copies the first 1024 characters of ``<base>/output/failure`` into the job's
``FailureReason`` (docs: your-algorithms-training-signal-success-failure). The first line is
therefore the one that matters: for a failing script it is the script's own exception
(``ValueError: bad learning rate``), for bad configuration the ``ConfigError`` message.
Like sagemaker-training's ``files.write_failure_file``, an existing failure file is kept: the
first writer (often the user's script) wins (toolkit #111).
"""

import os
import re
import tempfile
from collections.abc import Iterable, Sequence

# mpirun --tag-output prefixes output with "[jobid,rank]<stderr>:", and again inside a line
# wherever the process wrote a partial line (Python writes "ValueError" and ": msg" apart).
_TAG = re.compile(r"\[(\d+),(\d+)\]<(?:stderr|stdout)>:")
# "ValueError: msg", "pkg.mod.CustomError: msg", "KeyboardInterrupt": a class name (capitalised,
# optionally module-qualified) alone or before ": ". Source lines of a traceback never match: they
# start lower-case (raise, self.x(...)) or contain "(" before any ": ".
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:: .*)?$")

FAILURE_REASON_CHARS = 1024


def untag(lines: Iterable[str]) -> dict[str, list[str]]:
    """Groups lines by MPI rank (``"rank 3"``) or ``""`` for untagged lines, tags removed."""
    streams: dict[str, list[str]] = {}
    for line in lines:
        match = _TAG.match(line)
        key = f"rank {match.group(2)}" if match else ""
        streams.setdefault(key, []).append(_TAG.sub("", line))
    return streams


def exception_line(lines: Sequence[str]) -> str | None:
    """The exception line (``Type: message``) that closes the last Python traceback in ``lines``.

    Works on interleaved, re-wrapped output too (mpirun splits partial writes), because it looks
    for the first line shaped like an exception after each ``Traceback`` header rather than
    relying on indentation.
    """
    found = None
    armed = False
    for line in lines:
        if line.startswith("Traceback (most recent call last):"):
            armed = True
        elif armed and _EXCEPTION_LINE.match(line.strip()):
            found, armed = line.strip(), False
    return found


def describe_failure(program: str, exit_code: int, stderr_tail: Sequence[str],
                     signal_name: str | None = None) -> str:
    """The failure file's text for a training program that ended badly.

    First line: the exception the program raised (from the first rank that printed one), or
    ``<program> exited with code N`` / ``was stopped by SIGTERM``. Then where it came from and
    the end of stderr, so the first 1024 characters explain the failure.
    """
    culprit, where = None, ""
    for key, lines in untag(stderr_tail).items():
        line = exception_line(lines)
        if line:
            culprit, where = line, key
            break
    if signal_name:
        headline = f"{program} was stopped by {signal_name}"
    else:
        headline = culprit or f"{program} exited with code {exit_code}"
    details = [f"Training program {program!r} exited with code {exit_code}"
               + (f"; the exception above was raised on {where}" if culprit and where else "") + "."]
    tail = [line for line in stderr_tail[-40:] if line.strip()]
    return "\n".join([headline, "", *details, "", "Last lines of stderr:", *tail]) + "\n"


def _atomic_write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(tmp, 0o644)   # mkstemp creates 0600
    os.replace(tmp, path)


def write_failure(output_dir: str, text: str) -> str:
    """Writes ``<output_dir>/failure`` unless it exists. Returns the path."""
    path = os.path.join(output_dir, "failure")
    if not os.path.exists(path):
        _atomic_write(path, text)
    return path


def write_success(output_dir: str) -> str:
    """Writes an empty ``<output_dir>/success`` (sagemaker-training does the same). Returns the path."""
    path = os.path.join(output_dir, "success")
    _atomic_write(path, "")
    return path


def clear_status(output_dir: str) -> None:
    """Removes ``success`` and ``failure`` left by an earlier run of a reused local tree (the
    service starts every job with an empty output directory)."""
    for name in ("success", "failure"):
        path = os.path.join(output_dir, name)
        if os.path.exists(path):
            os.remove(path)
