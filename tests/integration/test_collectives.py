"""Integration: real `mpirun` with 2 ranks; Horovod (PyTorch, TensorFlow) and mpi4py collectives
return exact values on every rank."""

import subprocess
import sys

import pytest

from helpers import BIN, PROGRAMS, read_json

pytestmark = pytest.mark.mpi
RANKS = 2


def mpirun(framework: str, out_dir) -> None:
    argv = [str(BIN / "mpirun"), "-np", str(RANKS), "--host", f"localhost:{RANKS}", "--tag-output",
            sys.executable, str(PROGRAMS / "collectives.py"), framework, str(out_dir)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_horovod_collectives_are_exact(framework, tmp_path):
    mpirun(framework, tmp_path)
    for rank in range(RANKS):
        got = read_json(tmp_path / f"{framework}-{rank}.json")
        assert (got["rank"], got["size"]) == (rank, RANKS)
        assert got["sum"] == [10.0, 12.0, 14.0, 16.0, 18.0]                 # [0..4] + [10..14]
        assert got["average"] == [5.0, 6.0, 7.0, 8.0, 9.0]
        assert got["int_sum"] == [2 * 2 ** 40 + 1]                           # exact in int64
        assert got["broadcast"] == [8.0, 8.0, 8.0]                           # rank 1's value, r + 7
        assert got["allgather"] == [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]      # ragged first dimension


def test_mpi4py_collectives_are_exact(tmp_path):
    mpirun("mpi4py", tmp_path)
    for rank in range(RANKS):
        got = read_json(tmp_path / f"mpi4py-{rank}.json")
        assert got["sum"] == 3 and got["broadcast"] == {"from": 1} and got["allgather"] == [0, 1]
