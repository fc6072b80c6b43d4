"""A5's user script: joins its launcher's process group, passes one barrier, records the time.

Under mpirun (OMPI_* variables) it uses mpi4py's barrier; under torchrun (RANK) a gloo process
group's; alone, nothing to join."""
import os
import time

if "OMPI_COMM_WORLD_RANK" in os.environ:
    from mpi4py import MPI

    MPI.COMM_WORLD.Barrier()
    rank = MPI.COMM_WORLD.Get_rank()
elif "RANK" in os.environ:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.barrier()
    rank = dist.get_rank()
else:
    rank = 0
with open(os.path.join(os.environ["BENCH_STAMP_DIR"], f"stamp-{rank}"), "w") as handle:
    handle.write(repr(time.time()))
