"""Every Python process of a job writes every thread's stack to a file of its own when sent
``SIGUSR2``, without ptrace (which SageMaker's containers may not allow) and without the
process's help: ``faulthandler.register`` (docs.python.org ``faulthandler``) runs in C, so it
answers while the main thread is blocked in a collective or a lock, where a Python signal handler
would wait for it.

Reaching users' scripts: ``ensure_hook`` puts ``dtc-stack-dump.pth`` in the interpreter's
site-packages (``train`` calls it at every job's start, in the image and in a host's ``.venv``
alike). ``site`` runs its ``import`` line at every interpreter's
start (docs.python.org ``site``), and it calls ``install`` only where ``$DTC_STACKS_DIR`` is set,
which ``train`` sets for the processes it starts (``plan.job_env``; under MPI ``-x`` carries it to
every host). ``install`` opens ``<DTC_STACKS_DIR>/pid<PID>.txt``, writes one header line (pid,
host, rank, local rank, world size, command line; under MultiWorkerMirroredStrategy the rank is
the worker's index in ``TF_CONFIG``) and registers the handler on that file; a forked child
(a DataLoader worker) gets a file of its own. A program that replaces the handler with its own
``signal.signal(SIGUSR2, ...)`` keeps its own; a process that never ran the hook (``python -S``,
a shell) is never sent the signal (``request`` reads ``SigCgt`` in ``/proc/PID/status`` first).
"""

import faulthandler
import json
import os
import signal
import sys
import sysconfig
import time

ENV = "DTC_STACKS_DIR"
SIGNAL = signal.SIGUSR2
PTH_NAME = "dtc-stack-dump.pth"
# one line; `site` executes .pth lines that start with "import" (a failing one is reported, and
# the interpreter starts anyway)
PTH_LINE = (f"import os; os.environ.get({ENV!r}) and "
            "__import__('dtc_entrypoint.stack_dump').stack_dump.install()\n")
HEADER = "# dtc stacks"
REQUEST_WAIT_S = 5.0   # how long ``request`` waits for the processes' dumps
_file = None   # the open file the handler writes to (faulthandler keeps only its descriptor)


def install(forked: bool = False) -> None:
    """Registers the handler for this process (see the module's docstring); ``forked``: in a
    child forked from a process that had, whose header then names its parent. Never raises: a
    process that cannot write its file runs on without it."""
    global _file
    directory = os.environ.get(ENV)
    if not directory:
        return
    try:
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"pid{os.getpid()}.txt")
        new = open(path, "w", encoding="utf-8")   # kept open: the handler writes to it
        try:
            with open(f"/proc/{os.getpid()}/cmdline", "rb") as cmdline:
                argv = cmdline.read().rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            argv = " ".join(sys.argv)
        worker, workers = multi_worker_rank()
        rank = os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", worker))
        local_rank = os.environ.get("LOCAL_RANK", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0" if worker else ""))
        world_size = os.environ.get("WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", workers))
        new.write(f"{HEADER} pid={os.getpid()} host={os.environ.get('SM_CURRENT_HOST', '')} rank={rank} "
                  f"local_rank={local_rank} world_size={world_size} "
                  f"forked_from={os.getppid() if forked else ''} argv={' '.join(argv.split())[:500]}\n")
        new.flush()
        faulthandler.register(SIGNAL, file=new, all_threads=True, chain=False)
        old, _file = _file, new
        if old is None:
            os.register_at_fork(after_in_child=lambda: install(forked=True))
        else:
            old.close()
    except OSError:
        pass


def multi_worker_rank() -> tuple[str, str]:
    """Under MultiWorkerMirroredStrategy (``TF_CONFIG`` whose cluster has only workers: one per
    host, worker 0 the chief; ``launch_tf.multi_worker_mirrored_plan``), this process's worker
    index and the number of workers, which are its rank and the world size; ``("", "")``
    otherwise (no ``TF_CONFIG``, or a parameter-server cluster, whose servers run no program)."""
    try:
        tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
        cluster, task = tf_config.get("cluster") or {}, tf_config.get("task") or {}
        if set(cluster) == {"worker"} and task.get("type") == "worker":
            return str(int(task["index"])), str(len(cluster["worker"]))
    except (ValueError, TypeError, KeyError, AttributeError):
        pass
    return "", ""


def catches(pid: int, signum: int = SIGNAL) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (the ``SigCgt`` mask of
    ``/proc/PID/status``, proc(5)): a process without one would be killed by it."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError):
        pass
    return False


def _registered(directory: str) -> dict[str, int]:
    """path -> pid of each registration in ``directory``."""
    try:
        names = sorted(n for n in os.listdir(directory) if n.startswith("pid") and n.endswith(".txt"))
    except FileNotFoundError:
        return {}
    return {os.path.join(directory, name): int(name[3:-4]) for name in names}


def request(directory: str, wait_s: float = REQUEST_WAIT_S, via: int | None = None) -> list[str]:
    """Asks for the stacks of every live process registered in ``directory`` that still catches
    ``SIGUSR2``, and waits up to ``wait_s`` seconds for each of them to write them. The signal
    goes to each process, or, with ``via``, to that process alone (mpirun, which passes SIGUSR1
    and SIGUSR2 on to every rank on every host: mpirun(1), "Signal Propagation"; each rank's
    ``rank_shim`` to its program). Returns the paths of the files that hold a dump."""
    waiting = {}
    for path, pid in _registered(directory).items():
        if catches(pid):
            try:
                waiting[path] = os.path.getsize(path)
                if via is None:
                    os.kill(pid, SIGNAL)
            except (OSError, ProcessLookupError):
                waiting.pop(path, None)
    if via is not None:
        try:
            os.kill(via, SIGNAL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(os.path.getsize(p) <= size for p, size in waiting.items()):
        time.sleep(0.1)
    time.sleep(0.2)   # a dump being written: let it end
    return [path for path, size in waiting.items() if os.path.getsize(path) > size]


def dumped(directory: str) -> list[str]:
    """The registrations in ``directory`` that hold a dump (more than their header line)."""
    found = []
    for path in _registered(directory):
        with open(path, "rb") as dump:
            if len(dump.read().split(b"\n", 1)[-1].strip()) > 0:
                found.append(path)
    return found


def ensure_hook(site_packages: str | None = None) -> str | None:
    """Writes ``dtc-stack-dump.pth`` into ``site_packages`` (this interpreter's purelib by
    default) unless it is there already. Returns its path, or ``None`` where it cannot be
    written (a read-only site-packages: the job runs, without stacks on request)."""
    path = os.path.join(site_packages or sysconfig.get_paths()["purelib"], PTH_NAME)
    try:
        with open(path, encoding="utf-8") as pth:
            if pth.read() == PTH_LINE:
                return path
    except OSError:
        pass
    try:
        with open(path, "w", encoding="utf-8") as pth:
            pth.write(PTH_LINE)
    except OSError:
        return None
    return path
