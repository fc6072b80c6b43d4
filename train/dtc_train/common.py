"""What every built-in trainer shares: metric lines, logging, atomic files, weight digests."""

import atexit
import errno
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable
from typing import NoReturn

log = logging.getLogger("dtc.train")

# One line per epoch, on rank 0 (dtc_train.observe). The README's metric_definitions read it
# (tests/integration/test_trainers_e2e.py applies them to real logs). samples_per_second: global, over the
# epoch's training steps.
METRIC_LINE = ("epoch={epoch}/{epochs} train_loss={train_loss:.4f} train_accuracy={train_accuracy:.4f} "
               "val_loss={val_loss:.4f} val_accuracy={val_accuracy:.4f} val_samples={val_samples} "
               "epoch_seconds={epoch_seconds:.2f} samples_per_second={samples_per_second:.1f}")


def emit(line: str) -> None:
    """Prints one whole line in a single write (mpirun --tag-output tags each write)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def leave(exit_code: int) -> NoReturn:
    """Ends a trainer's process with ``exit_code`` once its ``main`` has returned: the exit
    handlers (``atexit``) run, logging, stdout and stderr are flushed, then ``os._exit``, without
    Python's interpreter teardown. By then the job has saved and closed everything it keeps
    (model, checkpoints, report, TensorBoard events) and a Horovod trainer has called
    ``hvd.shutdown()``; the teardown would only collect and free the frameworks' objects. It took
    2.3 to 3.7 CPU-seconds per rank on a CPU host, 2.3 to 3.5 seconds of every job's wall time
    (2026-12-06, docs/development.md), and a Gloo worker thread releasing a collective's tensor late
    can abort it with SIGABRT after a job that succeeded (pytorch/pytorch#179291, python/cpython
    gh-87135). The exit handlers cost no measurable time and clean up after the frameworks: TensorFlow's
    autograph removes the modules it generated in the temporary directory (18 files per rank of the
    digits job, left behind while this skipped them). ``atexit._run_exitfuncs`` is CPython's own
    call for that (what ``Py_Finalize`` runs first). A trainer that raised takes Python's own exit
    instead, which prints the traceback."""
    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)


def configure_logging(rank: int) -> None:
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s [rank {rank}] %(message)s")


def atomic_write(path: str, write: Callable[[str], None]) -> None:
    """Calls ``write(tmp_path)``, fsyncs the result and renames it to ``path``: readers, and
    SageMaker's sync of the checkpoint directory to S3, see the old file or the complete new
    one, never a partial one, and a crash leaves one of the two on disk.

    The temporary file is staged outside ``path``'s directory, in ``.<directory name>.staging``
    beside it (removed again when empty), so a directory that SageMaker uploads as it changes
    (``/opt/ml/checkpoints``) never holds a half-written file. Where that sibling cannot be used
    (not writable; another file system or mount, where a rename fails with ``EXDEV``: a bind
    mount, a volume of its own) the complete, fsynced file is copied into the directory as
    ``.tmp-*`` and renamed from there.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    suffix = os.path.splitext(path)[1]  # some writers pick the format from the extension
    staging = os.path.join(os.path.dirname(directory), f".{os.path.basename(directory)}.staging")
    try:
        os.makedirs(staging, exist_ok=True)
        if os.stat(staging).st_dev != os.stat(directory).st_dev:
            os.rmdir(staging)
            raise OSError("another file system")
    except OSError:
        staging = directory
    fd, tmp = tempfile.mkstemp(dir=staging, prefix=".tmp-", suffix=suffix)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)   # mkstemp creates 0600
        with open(tmp, "rb") as handle:   # on disk before it replaces the old file
            os.fsync(handle.fileno())
        try:
            os.replace(tmp, path)
        except OSError as error:
            if error.errno != errno.EXDEV:
                raise
            _replace_from_inside(tmp, path, suffix)
        _fsync_directory(directory)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
        if staging != directory:
            try:
                os.rmdir(staging)
            except OSError:   # another writer's file is in it, or it is gone already
                pass


def _replace_from_inside(staged: str, path: str, suffix: str) -> None:
    """Copies ``staged`` next to ``path`` (its directory is another mount), fsyncs, renames."""
    fd, local = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-", suffix=suffix)
    os.close(fd)
    try:
        shutil.copyfile(staged, local)
        os.chmod(local, 0o644)
        with open(local, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(local, path)
    finally:
        if os.path.exists(local):
            os.remove(local)


def _fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_tree(path: str, write: Callable[[str], None]) -> None:
    """Like ``atomic_write`` for a directory (e.g. a SavedModel): built aside, then swapped in."""
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=".tmp-" + os.path.basename(path))
    try:
        write(tmp)
        os.chmod(tmp, 0o755)   # mkdtemp creates 0700
        old = None
        if os.path.exists(path):
            old = tempfile.mkdtemp(dir=parent, prefix=".old-")
            os.rename(path, os.path.join(old, "x"))
        os.rename(tmp, path)
        if old:
            shutil.rmtree(old)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp)


def write_text(path: str, text: str) -> None:
    """Writes ``text`` to ``path`` atomically (``atomic_write``)."""

    def write(tmp: str) -> None:
        with open(tmp, "w") as handle:
            handle.write(text)

    atomic_write(path, write)


def write_json(path: str, data: dict) -> None:
    write_text(path, json.dumps(data, indent=2) + "\n")


def weights_digest(arrays: Iterable) -> str:
    """SHA-256 over the raw bytes of the given numpy arrays, in order: equal on every rank
    exactly when all ranks hold bit-identical weights."""
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(array.tobytes())
    return digest.hexdigest()
