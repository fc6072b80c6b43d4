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
import signal
import tempfile
from collections.abc import Iterable, Mapping, Sequence

# mpirun --tag-output prefixes output with "[jobid,rank]<stderr>:", and again inside a line
# wherever the process wrote a partial line (Python writes "ValueError" and ": msg" apart);
# under torchrun, PyTorch prefixes a rank's uncaught traceback with "[rankN]: ".
_TAG = re.compile(r"\[(\d+),(\d+)\]<(?:stderr|stdout)>:|\[rank(\d+)\]: ?")
# "ValueError: msg", "pkg.mod.CustomError: msg", "KeyboardInterrupt": a class name (capitalised,
# optionally module-qualified) alone or before ": ". Source lines of a traceback never match: they
# start lower-case (raise, self.x(...)) or contain "(" before any ": ".
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:: .*)?$")
# The location line Python prints above a syntax error (and in every traceback frame).
_SOURCE_LOCATION = re.compile(r'^\s*File "[^"]+", line \d+')

FAILURE_REASON_CHARS = 1024
# SIGKILL is what the kernel's out-of-memory killer sends (and `kill -9`, and a host's shutdown).
OOM_HINT = "SIGKILL is what the kernel's out-of-memory killer sends: check the instance's memory"
# When the container's OOM-kill count grew while the process ran (memory.oom_killed_since): not
# a hint any more but what happened, and what to change.
OOM_KILLED = "from the kernel's out-of-memory killer"
OOM_ADVICE = ("the container ran out of memory: lower batch-size or the processes per host, or use an instance "
              "type with more memory")
# What rank_shim prints when its rank dies of a signal (MPI), and torchrun's root-cause block.
_DEAD_RANK = re.compile(r"rank (\d+) on host (\S+) was killed by (SIG[A-Z0-9]+)( " + re.escape(OOM_KILLED) + ")?")
# mpirun when a host's orted vanishes (the host or its container died, or the network failed).
_LOST_DAEMON = re.compile(r"Remote daemon:\s*\[\[\d+,\d+\],\d+\] on node (\S+)")
_TORCHRUN_ROOT_CAUSE = re.compile(
    r"host\s*:\s*(\S+)\s+rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s+exitcode\s*:\s*(-?\d+)", re.S)


def signal_label(number: int) -> str:
    """``SIGKILL`` for 9; ``signal N`` for numbers Python does not name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def rank_death(rank: str | int, host: str, name: str, oom_killed: bool = False) -> str:
    """``rank 3 on host algo-2 was killed by SIGKILL`` (with ``OOM_HINT`` for SIGKILL); with
    ``oom_killed`` (its container's OOM-kill count grew: ``memory``) ``... was killed by SIGKILL
    from the kernel's out-of-memory killer: the container ran out of memory: ...``."""
    if name == "SIGKILL" and oom_killed:
        return f"rank {rank} on host {host} was killed by {name} {OOM_KILLED}: {OOM_ADVICE}"
    return f"rank {rank} on host {host} was killed by {name}" + (f" ({OOM_HINT})" if name == "SIGKILL" else "")


def rank_exit(rank: str | int, host: str, exit_code: int) -> str:
    """``rank 1 on host algo-2 exited with code 3``: what rank_shim prints (MPI) for a rank whose
    program exited non-zero, and what ``failed_rank`` reads back."""
    return f"rank {rank} on host {host} exited with code {exit_code}"


_FAILED_RANK = re.compile(r"rank (\d+) on host (\S+) exited with code (\d+)")


def failed_rank(lines: Sequence[str]) -> tuple[str, str, str] | None:
    """``(rank, host, sentence)`` for the first rank that exited non-zero, from rank_shim's line
    (MPI) or torchrun's "Root Cause" block (a positive ``exitcode``); ``None`` when neither is there."""
    text = "\n".join(lines)
    match = _FAILED_RANK.search(text)
    if match:
        rank, host = match.group(1), match.group(2)
        return rank, host, rank_exit(rank, host, int(match.group(3)))
    match = _TORCHRUN_ROOT_CAUSE.search(text[text.rfind("Root Cause"):] if "Root Cause" in text else "")
    if match and int(match.group(3)) > 0:
        host, rank = match.group(1), match.group(2)
        return rank, host, rank_exit(rank, host, int(match.group(3)))
    return None


# mpirun (OpenMPI's orterun) refusing its command line: an option it does not know, or a token it
# took for the program to run (it runs the first one it does not know; a misspelled option, or one
# whose value is missing, shifts the rest).
_MPIRUN_ERROR = re.compile(r"^(?:\S*/)?(?:orterun|mpirun): Error: (.+)$")
_MPIRUN_NO_EXECUTABLE = re.compile(r"was unable to find the specified executable file.*?Executable:\s*(\S+)", re.S)
MPI_OPTIONS_KEY = "sagemaker_mpi_custom_mpi_options"


def mpirun_error(lines: Sequence[str]) -> str | None:
    """The first line for a job whose mpirun refused its own command line, before any rank ran:
    mpirun's message and the hyperparameter its options come from (``MPI_OPTIONS_KEY``; the
    image's own options are tested), else ``None``."""
    for line in lines:
        if match := _MPIRUN_ERROR.match(line.strip()):
            return f"mpirun rejected its options: {match.group(1)}: fix {MPI_OPTIONS_KEY} in the job's hyperparameters"
    if match := _MPIRUN_NO_EXECUTABLE.search("\n".join(lines)):
        return (f"mpirun took {match.group(1)!r} for the program to run: an option in {MPI_OPTIONS_KEY} is "
                "misspelled or lacks its value (mpirun runs the first word it does not know); fix it in the "
                "job's hyperparameters")
    return None


# A peer gone mid-collective: Gloo (torch.distributed on CPU) and TensorFlow's coordination
# service (MultiWorkerMirrored), which name an address or a task, not a host.
_GLOO_LOST_PEER = re.compile(r"\[([0-9A-Fa-f.:]+)\]:\d+: Connection (?:reset|closed) by peer"
                             r"|Connection (?:reset|closed) by peer \[([0-9A-Fa-f.:]+)\]:\d+")
# What tf_server says of the master's host (lost_host, chief_failed), for a worker host's failure.
_OTHER_HOST_FAILED = re.compile(r"host \S+ stopped answering: .*|the chief on host \S+ failed \(exit code \d+\), .*")
_TF_LOST_TASK = re.compile(r"tasks are unhealthy \(stopped sending heartbeats\):\s*/job:(\w+)/replica:\d+/task:(\d+)")
# A TensorFlow task gone under a worker: gRPC's "connection reset" from it, or the coordination
# service (on the leader, task 0 of the chief's or the workers' job) no longer taking heartbeats.
_TF_UNREACHABLE_TASK = re.compile(r"(?:UNAVAILABLE|Connection reset by peer|Socket closed)[^\n]*\n(?:[^\n]*\n){0,3}?"
                                  r"[^\n]*remote target /job:(\w+)/replica:\d+/task:(\d+)")
_TF_LOST_COORDINATOR = re.compile(r"(?:DEADLINE_EXCEEDED|Deadline Exceeded|UNAVAILABLE)[^\n]*\n(?:[^\n]*\n){0,3}?"
                                  r"RPC: /tensorflow\.CoordinationService/Heartbeat")


def lost_host(host: str, what: str) -> str:
    """``host algo-2 stopped answering: <what> (the host or its container died, ...)``."""
    return (f"host {host} stopped answering: {what} (the host or its container died, was killed or ran out of "
            "memory, or the network to it failed)")


# A failure line that only says another host went away (lost_host; under torchrun its train may
# still say why: peer_failed).
LOST_HOST = re.compile(r"host (\S+) stopped answering: ")


_PEER_FAILED = re.compile(r"host \S+ failed: ")


# A stall's headline (cli._stall_rule), or another host's account of its stall (peer_failed).
STALLED = re.compile(rf"^(?:{_PEER_FAILED.pattern})?stalled (\d+) s: ")


def peer_failed(host: str, line: str) -> str:
    """``host algo-2 failed: <its failure line>``: another host's own account of its failure, as its
    ``train`` gave it (``peers.Presence``); a line that already names a failed host is kept as it is."""
    return line if _PEER_FAILED.match(line) else f"host {host} failed: {line}"


def chief_failed(host: str, exit_code: int) -> str:
    """``the chief on host algo-1 failed (exit code 1) ...``: a parameter-server worker host's
    account of a job whose chief failed (``tf_server``)."""
    return (f"the chief on host {host} failed (exit code {exit_code}), which ended training on this host too; "
            f"host {host}'s failure file says why")


def lost_peer(lines: Sequence[str], peers: Mapping[str, str]) -> str | None:
    """The host whose loss the training processes reported, from Gloo's "connection reset by
    peer [address]", TensorFlow's "tasks are unhealthy ... /job:worker/.../task:N", gRPC's
    "connection reset" from a task's "remote target", or a failed heartbeat to TensorFlow's
    coordination service (on task 0), named through ``peers`` (address -> host, ``worker:N`` ->
    host), or the line of ``lost_host`` or ``chief_failed`` a ``tf_server`` printed; ``None``
    otherwise."""
    text = "\n".join(lines)
    if said := _OTHER_HOST_FAILED.search(text):
        return said.group(0)
    gloo = _GLOO_LOST_PEER.search(text)
    address = gloo and (gloo.group(1) or gloo.group(2))
    if address in peers:
        return lost_host(peers[address], f"the connection to its ranks was lost ({address}, Gloo; one of its ranks "
                                         "dying does the same, and that host's failure file then names it)")
    task = _TF_LOST_TASK.search(text)
    if task and f"{task.group(1)}:{task.group(2)}" in peers:
        return lost_host(peers[f"{task.group(1)}:{task.group(2)}"],
                         f"TensorFlow task {task.group(1)}:{task.group(2)} there stopped sending heartbeats")
    task = _TF_UNREACHABLE_TASK.search(text)
    if task and f"{task.group(1)}:{task.group(2)}" in peers:
        return lost_host(peers[f"{task.group(1)}:{task.group(2)}"],
                         f"TensorFlow task {task.group(1)}:{task.group(2)} there reset its connection")
    leader = "chief:0" if "chief:0" in peers else "worker:0"
    if _TF_LOST_COORDINATOR.search(text) and leader in peers:
        return lost_host(peers[leader], f"TensorFlow's coordination service there (task {leader}) stopped taking "
                                        "heartbeats")
    return None


# Horovod's stall inspector (horovod/common/stall_inspector.cc): a warning ("... are waiting for
# remainder of ranks for more than N seconds ..."), "Missing ranks:", a line per rank ("1:
# [allreduce.grad.3]"; "1!: [...]" for one stalled past the shutdown time), and past that time
# "One or more rank (marked by "!") is stalled for longer than N seconds. Will shutdown."
_HOROVOD_MISSING_RANK = re.compile(r"^(\d+)(!?): \[(.*)\]\s*$")
_HOROVOD_SHUTDOWN = re.compile(r"is stalled for longer than (\d+) seconds\. Will shutdown")
_HOROVOD_REPORT = re.compile(r"stall_inspector\.cc|waiting for remainder of ranks|^Missing ranks:|"
                             rf"{_HOROVOD_SHUTDOWN.pattern}|{_HOROVOD_MISSING_RANK.pattern}")


def horovod_stall_line(line: str) -> bool:
    """Whether ``line`` (as mpirun tags it) is part of Horovod's stall inspector's report, which
    it repeats while the job stalls: not progress (``supervise.StallRule.quiet``)."""
    return bool(_HOROVOD_REPORT.search(_TAG.sub("", line).strip()))


def _horovod_missing(text: Sequence[str], marked: bool) -> dict[int, str]:
    """rank -> the tensors it did not submit, from the last report in ``text`` (untagged,
    stripped); with ``marked``, only the ranks marked "!" (past the shutdown time)."""
    starts = [i for i, line in enumerate(text) if line == "Missing ranks:"]
    missing: dict[int, str] = {}
    for line in text[starts[-1] + 1:] if starts else ():
        match = _HOROVOD_MISSING_RANK.match(line)
        if match is None:
            break
        if match.group(2) or not marked:
            missing[int(match.group(1))] = match.group(3)
    return missing


def horovod_missing(lines: Sequence[str]) -> str | None:
    """``Horovod's stall inspector: rank 1 did not submit allreduce.grad.3`` from its last report
    in ``lines`` (mpirun's tags allowed), or ``None`` when there is none."""
    missing = _horovod_missing([_TAG.sub("", line).strip() for line in lines], marked=False)
    if not missing:
        return None
    return "Horovod's stall inspector: " + ", ".join(f"rank {rank} did not submit {tensors}"
                                                      for rank, tensors in sorted(missing.items()))


def horovod_stall(lines: Sequence[str]) -> str | None:
    """``stalled 600 s: rank 1 did not submit allreduce.grad.3, which the other ranks wait for
    (...)`` when Horovod's stall inspector shut the job down (the job's environment set
    ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS``), from its report in the ranks' stderr (untagged);
    ``None`` otherwise."""
    text = [line.strip() for line in lines]
    shutdown = next((match for line in text if (match := _HOROVOD_SHUTDOWN.search(line))), None)
    if shutdown is None:
        return None
    stalled = _horovod_missing(text, marked=True)
    if not stalled:
        return None
    ranks = ", ".join(f"rank {rank} did not submit {tensors}" for rank, tensors in sorted(stalled.items()))
    return (f"stalled {shutdown.group(1)} s: {ranks}, which the other ranks wait for (Horovod's stall inspector "
            "ended the job: a rank skipped a collective, called them in another order or with other names, or is "
            "stuck elsewhere; HOROVOD_STALL_SHUTDOWN_TIME_SECONDS sets the limit)")


def dead_rank(lines: Sequence[str]) -> str | None:
    """One sentence naming the rank that died of a signal, its host and the signal, from
    rank_shim's line (MPI) or torchrun's "Root Cause" block, or the host whose MPI daemon
    mpirun lost; ``None`` when none of them is there. SIGKILL gets ``OOM_HINT``, or is named the
    out-of-memory killer's where rank_shim's line says so."""
    text = "\n".join(lines)
    lost = _LOST_DAEMON.search(text)
    if lost:
        return lost_host(lost.group(1), "mpirun lost its daemon there")
    match = _DEAD_RANK.search(text)
    if match:
        rank, host, name, oom = match.groups()
        return rank_death(rank, host, name, oom_killed=bool(oom))
    # torchrun lists every failed rank; the root cause is the one after "Root Cause"
    match = _TORCHRUN_ROOT_CAUSE.search(text[text.rfind("Root Cause"):] if "Root Cause" in text else text)
    if not match or int(match.group(3)) >= 0:
        return None
    host, rank, name = match.group(1), match.group(2), signal_label(-int(match.group(3)))
    return rank_death(rank, host, name)


def untag(lines: Iterable[str]) -> dict[str, list[str]]:
    """Groups lines by rank (``"rank 3"``: mpirun's or torchrun's tag) or ``""`` for untagged
    lines, tags removed."""
    streams: dict[str, list[str]] = {}
    for line in lines:
        match = _TAG.match(line)
        key = f"rank {match.group(2) or match.group(3)}" if match else ""
        streams.setdefault(key, []).append(_TAG.sub("", line))
    return streams


def exception_line(lines: Sequence[str]) -> str | None:
    """The exception line (``Type: message``) that closes the last Python traceback in ``lines``.

    Works on interleaved, re-wrapped output too (mpirun splits partial writes), because it looks
    for the first line shaped like an exception after each ``Traceback`` header rather than
    relying on indentation. A ``SyntaxError`` in the program itself has no ``Traceback`` header
    (Python prints ``  File "train.py", line 2``, the source line, a caret and the error): the
    ``File`` line arms the search too.
    """
    found = None
    armed = False
    for line in lines:
        if line.startswith("Traceback (most recent call last):") or _SOURCE_LOCATION.match(line):
            armed = True
        elif armed and _EXCEPTION_LINE.match(line.strip()):
            found, armed = line.strip(), False
    return found


# argparse's error exit (code 2): "usage: ..." lines, then "<prog>: error: <message>".
_ARGPARSE_ERROR = re.compile(r"^(\S+): error: (.+)$")
_UNRECOGNIZED = "unrecognized arguments:"
_BOOLEAN_WORDS = {"True", "False", "true", "false", "1", "0"}


def usage_error(lines: Sequence[str], program: str = "") -> tuple[str, str] | None:
    """argparse's own error line in a script's stderr, and a hint for SageMaker's conventions.

    Returns ``(line, hint)`` for the last ``<prog>: error: <message>`` line that follows a
    ``usage:`` line, else ``None``. The hint names what bites scripts written outside SageMaker:

    * ``--model_dir`` rejected: SageMaker's TensorFlow estimator passes it to every script
      (sagemaker-python-sdk ``TensorFlow`` ``model_dir``); accept it, or give the estimator
      ``model_dir=False``.
    * a ``True``/``False``/``1``/``0`` or empty value rejected: a hyperparameter reaches the script
      as ``--name value``, as sagemaker-training's ``mapping.to_cmd_args`` passes it, which an
      ``action="store_true"`` flag rejects (docs/entrypoint.md, "Flags").
    * anything else: where the script's arguments come from; for a built-in trainer
      (``program`` ``builtin:...``), which hyperparameter to fix and where they are listed.
    """
    usage_seen, found = False, None
    for line in lines:
        text = line.strip()
        if text.startswith("usage:"):
            usage_seen = True
        elif usage_seen and (match := _ARGPARSE_ERROR.match(text)):
            found = match
    if not found:
        return None
    message = found.group(2)
    rejected = message[len(_UNRECOGNIZED):].strip().split(" ") if message.startswith(_UNRECOGNIZED) else []
    if program.startswith("builtin:"):
        hint = (f"a hyperparameter of the built-in trainer {program} is not one it takes, or has a value it cannot "
                "take: fix it in the job's hyperparameters (docs/environment.md, Read by the built-in trainers)")
    elif "--model_dir" in rejected:
        hint = ("SageMaker's TensorFlow estimator passes --model_dir to every script: accept it "
                "(parser.add_argument(\"--model_dir\")) or create the estimator with model_dir=False")
    elif any(token in _BOOLEAN_WORDS or token == "" for token in rejected) or "ignored explicit argument" in message:
        hint = ("a hyperparameter reaches the script as '--name value' (as SageMaker's toolkit passes it), which an "
                "action=\"store_true\" flag rejects: declare the flag to take a value (docs/entrypoint.md, Flags)")
    else:
        hint = ("the script's arguments are the job's hyperparameters, '--name value' in the order of "
                "hyperparameters.json: declare each in the script's parser, or remove it from the job")
    return found.group(0), hint


_MISSING_MODULE = re.compile(r"^ModuleNotFoundError: No module named '([^'.]+)[^']*'")


def missing_module_hint(exception: str) -> str | None:
    """The hint under ``ModuleNotFoundError: No module named 'x.y'``: the image does not ship the
    top-level module ``x``; add the distribution that provides it to requirements.txt beside the
    script (installed before the program starts, sagemaker-training's convention), or use a derived
    image. ``None`` for any other exception line."""
    match = _MISSING_MODULE.match(exception)
    if not match:
        return None
    return (f"this image has no module {match.group(1)!r}: add the package that provides it to requirements.txt "
            "in the source directory (installed before the script starts), or build a derived image with it "
            "(docs/versions.md lists what the image ships)")


# APIs that scripts written for older frameworks still call, and what replaced them. Each entry:
# (pattern on the exception line, the line that comes first instead; the exception follows it).
REMOVED_APIS = (
    (re.compile(r"^(AttributeError|ImportError)\b.*\bmulti_gpu_model\b"),
     "keras.utils.multi_gpu_model was removed from Keras in TensorFlow 2.4: build and compile the model inside "
     "tf.distribute.MirroredStrategy().scope() to train on every GPU of one host, or use the mpi distribution with "
     "Horovod (horovod.tensorflow.keras) for several hosts (docs/strategies.md)"),
)


def removed_api(exception: str) -> str | None:
    """What replaced the removed API the ``exception`` line names (``REMOVED_APIS``: Keras's
    ``multi_gpu_model``, removed in TensorFlow 2.4 per its release notes), or ``None``."""
    for pattern, replacement in REMOVED_APIS:
        if pattern.match(exception):
            return replacement
    return None


def describe_failure(program: str, exit_code: int, stderr_tail: Sequence[str],
                     signal_name: str | None = None, peers: Mapping[str, str] | None = None,
                     peer_lost: str | None = None, oom_killed: bool = False) -> str:
    """The failure file's text for a training program that ended badly.

    First line: a rank that died of a signal (``rank 3 on host algo-2 was killed by SIGKILL``,
    with the out-of-memory hint for SIGKILL: the others' errors follow from it; but a rank that
    raised an exception and then died of SIGABRT or SIGSEGV, a library's teardown at exit, is named
    by its exception) or a host that
    was lost (``peer_lost``, or what ``lost_peer`` finds with ``peers``), else mpirun refusing
    its options (``mpirun_error``), else Horovod's stall inspector ending the job
    (``horovod_stall``: the ranks that did not arrive), else the exception the program raised (from the first rank
    that printed one; ``missing_module_hint`` as the second line for a ``ModuleNotFoundError``;
    for a removed API, ``removed_api``'s replacement first and the exception second),
    else argparse's error line with ``usage_error``'s hint as the second line, else the rank
    that exited non-zero (``failed_rank``: ``rank 1 on host algo-2 exited with code 3``), else
    ``<program> exited with code N`` (``was killed by SIGNAME`` for 128 + N; for SIGKILL with
    ``oom_killed``, this container's OOM-kill count grew during the job, ``... by the kernel's
    out-of-memory killer``) / ``was stopped by SIGTERM``. Then where it came from (rank and
    host) and the end of stderr, so the first 1024 characters explain the failure.
    """
    culprit, where, hint = None, "", None
    streams = untag(stderr_tail)
    for key, lines in streams.items():
        line = exception_line(lines)
        if line:
            culprit, where, hint = line, key, missing_module_hint(line)
            break
    if culprit is None:
        for key, lines in streams.items():
            if usage := usage_error(lines, program):
                (culprit, hint), where = usage, key
                break
    untagged = [_TAG.sub("", line) for line in stderr_tail]
    died = peer_lost or dead_rank(untagged) or lost_peer(untagged, peers or {})
    aborted = _DEAD_RANK.match(died or "")
    own = exception_line(streams.get(f"rank {aborted.group(1)}", [])) if aborted else None
    if aborted and aborted.group(3) in ("SIGABRT", "SIGSEGV") and own:
        # the rank raised, then died while exiting (a C++ library's teardown: PyTorch 2.13's Gloo
        # after an exception aborts or segfaults, pytorch/pytorch#179291): its exception is the cause
        died, culprit, hint = None, own, missing_module_hint(own)
        where = f"rank {aborted.group(1)} on host {aborted.group(2)}"
    rejected = mpirun_error(untagged)
    stalled = horovod_stall(untagged)
    failed = failed_rank(untagged)
    if failed and where == f"rank {failed[0]}":
        where += f" on host {failed[1]}"
    if signal_name:
        headline = f"{program} was stopped by {signal_name}"
    elif died:
        headline = died
    elif rejected:
        headline = rejected
    elif stalled:   # the others' exceptions ("Horovod has been shut down") follow from it
        headline = stalled
    elif culprit:
        headline = culprit
    elif failed:
        headline = failed[2]
    elif 128 < exit_code < 128 + 65:
        name = signal_label(exit_code - 128)
        if name == "SIGKILL" and oom_killed:
            headline = f"{program} was killed by {name} {OOM_KILLED} (exit code {exit_code}): {OOM_ADVICE}"
        else:
            headline = f"{program} was killed by {name} (exit code {exit_code})" + (
                f": {OOM_HINT}" if name == "SIGKILL" else "")
    else:
        headline = f"{program} exited with code {exit_code}"
    details = [f"Training program {program!r} exited with code {exit_code}"
               + (f"; the error above was raised on {where}" if culprit and where else "") + "."]
    tail = [line for line in stderr_tail[-40:] if line.strip()]
    hints = [hint] if hint and headline == culprit else []
    if headline == culprit and (replacement := removed_api(culprit)):
        headline, hints = replacement, [culprit]   # the API's successor first, then the exception itself
    return "\n".join([headline, *hints, "", *details, "", "Last lines of stderr:", *tail]) + "\n"


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
