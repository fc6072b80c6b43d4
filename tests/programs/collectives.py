"""Test program: Horovod/mpi4py collectives on every rank, results written as JSON per rank.

Usage: mpirun -np N python collectives.py {torch|tensorflow|mpi4py} OUT_DIR
Each rank contributes values that depend on its rank, so exact results prove data moved.
"""
import json
import os
import sys

framework, out_dir = sys.argv[1], sys.argv[2]
BIG = 2 ** 40   # int64 sums beyond float32/float64-exact-by-accident territory

if framework == "torch":
    import horovod.torch as hvd
    import torch

    hvd.init()
    r = hvd.rank()
    x = torch.arange(5, dtype=torch.float64) + 10 * r
    result = {
        "sum": hvd.allreduce(x, op=hvd.Sum, name="s").tolist(),
        "average": hvd.allreduce(x, op=hvd.Average, name="a").tolist(),
        "int_sum": hvd.allreduce(torch.tensor([BIG + r], dtype=torch.int64), op=hvd.Sum, name="i").tolist(),
        "broadcast": hvd.broadcast(torch.full((3,), float(r + 7)), root_rank=1, name="b").tolist(),
        "allgather": hvd.allgather(torch.full((r + 1, 2), float(r)), name="g").tolist(),
    }
elif framework == "tensorflow":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    r = hvd.rank()
    x = tf.range(5, dtype=tf.float64) + 10.0 * r
    result = {
        "sum": hvd.allreduce(x, op=hvd.Sum, name="s").numpy().tolist(),
        "average": hvd.allreduce(x, op=hvd.Average, name="a").numpy().tolist(),
        "int_sum": hvd.allreduce(tf.constant([BIG + r], tf.int64), op=hvd.Sum, name="i").numpy().tolist(),
        "broadcast": hvd.broadcast(tf.fill([3], float(r + 7)), root_rank=1, name="b").numpy().tolist(),
        "allgather": hvd.allgather(tf.fill([r + 1, 2], float(r)), name="g").numpy().tolist(),
    }
elif framework == "mpi4py":
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    r = comm.Get_rank()
    result = {
        "sum": comm.allreduce(r + 1, op=MPI.SUM),
        "broadcast": comm.bcast({"from": r}, root=1),
        "allgather": comm.allgather(r * r),
    }
    hvd = None
else:
    raise SystemExit(f"unknown framework {framework}")

size = hvd.size() if hvd else comm.Get_size()
with open(os.path.join(out_dir, f"{framework}-{r}.json"), "w") as handle:
    json.dump({"rank": r, "size": size, **result}, handle)
