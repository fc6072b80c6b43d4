"""Reads the stacks the job's processes wrote (``stack_dump``), keeps them in the job's output,
and names where each rank is: the first line of a stalled job's failure file.

A dump is faulthandler's text (docs.python.org ``faulthandler``: threads from the newest to the
main thread, each ``Thread 0x... (most recent call first):`` or ``Current thread ...`` and its
frames as ``  File "PATH", line N in FUNCTION``) after ``stack_dump``'s header line.
"""

import linecache
import os
import re
import shutil
import sysconfig
from dataclasses import dataclass

from .rank_shim import MODULE as SHIM_MODULE

# /opt/ml/output/data/forensics: SageMaker uploads /opt/ml/output/data with the job's output.
FORENSICS_SUBDIR = os.path.join("data", "forensics")


def folder(output_dir: str, part: str = "") -> str:
    """``<output_dir>/data/forensics[/<part>]``: ``stacks`` (``keep``), ``flight-recorder``
    (``plan.job_env``)."""
    return os.path.join(output_dir, FORENSICS_SUBDIR, part) if part else os.path.join(output_dir, FORENSICS_SUBDIR)
_HEADER = re.compile(r"# dtc stacks pid=(\d+) host=(\S*) rank=(\S*) local_rank=(\S*) world_size=(\S*) "
                     r"forked_from=(\S*) argv=(.*)")
_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+) \(most recent call first\):$")
_FRAME = re.compile(r'^  File "(.*)", line (\d+) in (.*)$')
# the innermost frames that say a rank waits for the others: torch.distributed's and Horovod's
# Python calls by name; mpi4py's and TensorFlow's (compiled) by the program line's text
_COLLECTIVE_FUNCTIONS = re.compile(
    r"^(all_reduce|allreduce|all_gather\w*|allgather\w*|all_to_all\w*|alltoall\w*|reduce_scatter\w*|broadcast\w*|"
    r"barrier|monitored_barrier|reduce|gather|scatter|send|recv|synchronize|wait|join|_allreduce_async\w*|"
    r"broadcast_parameters|broadcast_object|batch_isend_irecv)$")
_COLLECTIVE_PACKAGES = ("/torch/distributed/", "/horovod/", "/mpi4py/", "/tensorflow/python/distribute/")
_COLLECTIVE_CALL = re.compile(r"\b(all_?reduce|Allreduce|all_?gather|Allgather|barrier|Barrier|bcast|Bcast|"
                              r"broadcast|synchronize|reduce_scatter)\w*\s*\(", re.IGNORECASE)
NOT_ON_THIS_HOST = ": the rank they wait for is not on this host"
EVERY_RANK_WAITS = (": every rank waits in a collective (they called different ones, or in another order, or with "
                    "other names)")
_LIBRARY_ROOTS = tuple({sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib")})


@dataclass(frozen=True)
class Frame:
    """One Python frame: ``filename``, ``line`` (1-based) and ``function``."""

    filename: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{os.path.basename(self.filename)}:{self.line} ({self.function})"


@dataclass(frozen=True)
class Stacks:
    """One process's dump.

    Attributes:
        pid / host / rank / local_rank / world_size / argv: from ``stack_dump``'s header (``rank`` is ``None``
            for a process that is not a rank itself: a launcher, MPI's ``rank_shim``, a rank's
            forked child such as a DataLoader worker).
        main: the main thread's frames, innermost first (the dump's last thread).
        threads: how many threads the dump lists.
        path: the file it was read from.
    """

    pid: int
    host: str
    rank: int | None
    local_rank: int | None
    world_size: int | None
    argv: str
    main: tuple[Frame, ...]
    threads: int
    path: str


def parse(path: str) -> Stacks | None:
    """The last dump in ``path``, or ``None`` when it holds none (or no header)."""
    with open(path, encoding="utf-8", errors="replace") as dump:
        lines = dump.read().splitlines()
    header = _HEADER.match(lines[0]) if lines else None
    if not header:
        return None
    threads: list[list[Frame]] = []
    previous = ""
    for line in lines[1:]:
        if _THREAD.match(line):
            if previous:   # a dump's later threads follow an empty line: this starts another dump
                threads = []
            threads.append([])
        elif (frame := _FRAME.match(line)) and threads:
            threads[-1].append(Frame(frame.group(1), int(frame.group(2)), frame.group(3)))
        previous = line
    if not threads:
        return None
    pid, host, rank, local_rank, world_size, forked_from, argv = header.groups()
    # a rank's forked child (DataLoader worker) and MPI's rank_shim share its rank variables
    is_rank = rank.isdigit() and not forked_from and f"-m {SHIM_MODULE}" not in argv
    return Stacks(int(pid), host, int(rank) if is_rank else None, int(local_rank) if local_rank.isdigit() else None,
                  int(world_size) if world_size.isdigit() else None, argv, tuple(threads[-1]), len(threads), path)


def _is_library(filename: str) -> bool:
    """An installed package's or the standard library's file (site-packages may lie under the
    standard library's folder, as in the image); the built-in trainers count as the program."""
    if "/dtc_train/" in filename:
        return False
    return "-packages/" in filename or filename.startswith(_LIBRARY_ROOTS) or filename.startswith("<frozen")


def program_frame(stacks: Stacks) -> Frame | None:
    """The innermost main-thread frame in the program's own code (not the standard library or an
    installed package; the built-in trainers count as program), or the innermost frame."""
    for frame in stacks.main:
        if not _is_library(frame.filename):
            return frame
    return stacks.main[0] if stacks.main else None


def collective(stacks: Stacks) -> str | None:
    """The collective the main thread waits in (``all_reduce``, ``barrier``..., ``backward`` where
    DDP all-reduces the gradients), or ``None``: of the library's frames under the program's
    innermost one, the outermost that is a collective (Horovod's ``allreduce`` rather than the
    ``synchronize`` it waits in), else the call on the program's own line (a compiled collective:
    mpi4py, TensorFlow)."""
    found = None
    for frame in stacks.main:
        if not _is_library(frame.filename):
            if found:
                return found
            call = _COLLECTIVE_CALL.search(linecache.getline(frame.filename, frame.line))
            return call.group(1).lower() if call else None
        if any(p in frame.filename for p in _COLLECTIVE_PACKAGES) and _COLLECTIVE_FUNCTIONS.match(frame.function):
            found = frame.function
        elif "/torch/autograd/" in frame.filename and frame.function in ("_engine_run_backward", "backward"):
            found = "backward"   # DDP's gradient all-reduce runs inside it
    return found


def _ranks(numbers: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``ranks 0-2, 5``; one rank -> ``rank 3``."""
    numbers = sorted(numbers)
    spans: list[str] = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        spans.append(f"{start}-{prev}" if prev > start else str(start))
        if n is not None:
            start = prev = n
    return ("ranks " if len(numbers) > 1 else "rank ") + ", ".join(spans)


def where_ranks_are(dumps: list[Stacks]) -> str:
    """One clause naming where the ranks are, the ones outside a collective (the culprits) first:
    ``rank 1 on algo-1 is in train.py:14 (load_batch) while rank 0 waits in all_reduce
    (train.py:20)``. Processes without a rank count when no rank dumped (a one-process job). When
    every rank waits: ``NOT_ON_THIS_HOST`` unless every rank of the world dumped here
    (``EVERY_RANK_WAITS``: mismatched collectives)."""
    ranked = [d for d in dumps if d.rank is not None] or dumps
    waiting: dict[tuple[str, str], list[Stacks]] = {}
    elsewhere: list[Stacks] = []
    for dump in ranked:
        name = collective(dump)
        if name:
            waiting.setdefault((name, str(program_frame(dump))), []).append(dump)
        else:
            elsewhere.append(dump)

    def who(group: list[Stacks]) -> str:
        if group[0].rank is None:
            return ", ".join(f"process {d.pid}" for d in group)
        hosts = sorted({d.host for d in group if d.host})
        return _ranks([d.rank for d in group]) + (f" on {', '.join(hosts)}" if hosts else "")

    parts = [f"{who([d])} is in {program_frame(d)}" for d in sorted(elsewhere, key=lambda d: (d.rank or 0, d.pid))]
    waits = [f"{who(group)} {'wait' if len(group) > 1 else 'waits'} in {name} at {frame}"
             for (name, frame), group in sorted(waiting.items(), key=lambda item: min(d.rank or 0 for d in item[1]))]
    if parts and waits:
        return ", ".join(parts) + " while " + ", ".join(waits)
    if waits:
        world = {d.world_size for d in ranked}
        every = len(world) == 1 and None not in world and {d.rank for d in ranked} == set(range(world.pop()))
        return ", ".join(waits) + (EVERY_RANK_WAITS if every else NOT_ON_THIS_HOST)
    return ", ".join(parts) or "no process wrote its stacks"


def keep(paths: list[str], output_dir: str) -> str:
    """Copies the dumps into ``<output_dir>/data/forensics/stacks`` as
    ``rank<R>-<host>-pid<P>.txt`` (``process-<host>-pid<P>.txt`` without a rank: process ids
    repeat across hosts). Returns the folder."""
    return _keep([dump for dump in map(parse, paths) if dump is not None], output_dir)


def _keep(dumps: list[Stacks], output_dir: str) -> str:
    stacks = folder(output_dir, "stacks")
    os.makedirs(stacks, exist_ok=True)
    for dump in dumps:
        name = (f"rank{dump.rank}-{dump.host or 'host'}-pid{dump.pid}.txt" if dump.rank is not None
                else f"process-{dump.host or 'host'}-pid{dump.pid}.txt")
        shutil.copyfile(dump.path, os.path.join(stacks, name))
    return stacks


@dataclass(frozen=True)
class Reading:
    """What one read of the job's stacks found (``read``).

    Attributes:
        where: ``where_ranks_are``'s clause.
        folder: where the dumps are kept (``keep``).
        details: per process, a line naming it (rank, pid, host, command line) and its main
            thread's innermost frames (at most 12), one line each.
    """

    where: str
    folder: str
    details: tuple[str, ...]


def read(paths: list[str], output_dir: str, this_host: str) -> Reading:
    """Parses the dumps at ``paths``, keeps them (``keep``) and says where each rank is; a
    dump without a host in its header is named ``this_host``."""
    dumps = sorted(filter(None, map(parse, paths)), key=lambda d: (d.rank is None, d.rank or 0, d.host, d.pid))
    kept = _keep(dumps, output_dir)
    details: list[str] = []
    for dump in dumps:
        who = f"rank {dump.rank}" if dump.rank is not None else "process"
        details.append(f"{who} (pid {dump.pid}, host {dump.host or this_host}; {dump.argv[:160]}):")
        details += [f"  {frame.filename}:{frame.line} in {frame.function}" for frame in dump.main[:12]]
    return Reading(where_ranks_are(dumps), kept, tuple(details))


def clear(output_dir: str, stacks_dir: str) -> None:
    """Removes the forensics of an earlier run of the job in this tree (``docker run`` again on
    the same ``/opt/ml``) and the processes' registrations (``stack_dump``)."""
    for path in (folder(output_dir), stacks_dir):
        shutil.rmtree(path, ignore_errors=True)


def remove_empty(output_dir: str) -> None:
    """Removes the forensics folders the job left empty (``flight-recorder``, made before it)."""
    for path in (folder(output_dir, "flight-recorder"), folder(output_dir)):
        try:
            os.rmdir(path)
        except OSError:   # absent, or holds what the job left: kept
            pass
