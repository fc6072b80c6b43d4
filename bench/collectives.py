"""A1 and A2 workers: allreduce bandwidth and tensor fusion, one library per launch.

Started by bench/suite.py under the launcher each library needs (mpirun, horovodrun --gloo,
torchrun, or alone for memcpy); every rank pins itself to one core and one thread first. Rank 0
appends one JSON record per measurement to ``--out``:

* ``allreduce`` (A1): for each size, the mean time of one float32 sum-allreduce over
  ``iterations`` calls after ``warmup`` calls, with the nccl-tests algbw and busbw
  (busbw = algbw * 2(n-1)/n). ``memcpy`` times one ``numpy.copyto`` of the same size: the
  ceiling for moving those bytes once in this machine's memory. Every allreduce result is
  checked exactly (each rank contributes its rank + 1). Horovod and torch.distributed refresh
  a preallocated buffer from the input (one memcpy) and reduce it in place (``allreduce_``,
  ``all_reduce``), as a training step reduces its gradient buffers; mpi4py reduces into a
  preallocated output. (Horovod's out-of-place ``allreduce`` allocates a new tensor per call,
  whose page faults halved its bandwidth at 32 MB and above here.)
* ``fusion`` (A2): the time of one "step" that allreduces 200 tensors of 64 KB: Horovod submits
  them asynchronously and waits for all (fused into few messages when
  ``HOROVOD_FUSION_THRESHOLD`` > 0); DDP backpropagates through a model of 200 such parameters,
  bucketing their gradients by ``--bucket-mb``.

Usage: ``collectives.py allreduce --library horovod|torch|mpi4py|memcpy --variant NAME --out F
--sizes 4096,1048576 --repeat R`` or ``collectives.py fusion --library horovod|ddp ...``.
"""

import argparse
import gc
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

FUSION_TENSORS = 200
FUSION_TENSOR_BYTES = 64 * 1024


def iterations_for(size_bytes: int, quick: bool) -> tuple[int, int]:
    """(warmup, timed iterations): many for small messages (latency-bound), few for large ones."""
    if quick:
        return 1, 3
    if size_bytes <= 64 * 1024:
        return 10, 200
    if size_bytes <= 1 << 20:
        return 5, 50
    if size_bytes <= 16 << 20:
        return 3, 20
    return 2, 10


class Library:
    """One communication library: rank, world size, barrier, and an allreduce of a float32 buffer."""

    def __init__(self, name: str, device: str = "cpu"):
        self.name, self.device = name, device
        if name == "horovod":
            import horovod.torch as hvd
            import torch

            torch.set_num_threads(1)
            hvd.init()
            self.hvd, self.torch = hvd, torch
            self.rank, self.size = hvd.rank(), hvd.size()
            if device == "cuda":
                torch.cuda.set_device(hvd.local_rank())
        elif name in ("torch", "ddp"):
            import torch
            import torch.distributed as dist

            torch.set_num_threads(1)
            if device == "cuda":
                torch.cuda.set_device(common.local_rank_from_env())
            dist.init_process_group("nccl" if device == "cuda" else "gloo")
            self.dist, self.torch = dist, torch
            self.rank, self.size = dist.get_rank(), dist.get_world_size()
        elif name == "mpi4py":
            from mpi4py import MPI

            self.comm = MPI.COMM_WORLD
            self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        elif name == "memcpy":
            self.rank, self.size = 0, 1
        else:
            raise SystemExit(f"unknown library {name!r}")

    def barrier(self) -> None:
        if self.name == "horovod":
            self.hvd.barrier()
        elif self.name in ("torch", "ddp"):
            self.dist.barrier()
        elif self.name == "mpi4py":
            self.comm.Barrier()

    def allreduce_op(self, elements: int):
        """A function doing one sum-allreduce of ``elements`` float32, and a check of its result."""
        import numpy as np

        if self.name == "memcpy":
            source, target = np.full(elements, 1.0, np.float32), np.empty(elements, np.float32)
            return (lambda: np.copyto(target, source)), (lambda: bool(np.all(target == 1.0)))
        expected = self.size * (self.size + 1) / 2
        if self.name == "mpi4py":
            from mpi4py import MPI

            source, target = np.full(elements, self.rank + 1.0, np.float32), np.empty(elements, np.float32)
            return (lambda: self.comm.Allreduce(source, target, op=MPI.SUM)), (lambda: bool(np.all(target == expected)))
        tensor = self.torch.full((elements,), float(self.rank + 1), device=self.device)
        work = tensor.clone()
        if self.name == "horovod":
            def op():   # like torch.distributed below: refresh the input, reduce in place
                work.copy_(tensor)
                self.hvd.allreduce_(work, op=self.hvd.Sum, name=f"a{elements}")
            return op, (lambda: bool(self.torch.all(work == expected)))

        def op():
            work.copy_(tensor)
            self.dist.all_reduce(work)
            if self.device == "cuda":
                self.torch.cuda.synchronize()   # NCCL returns before the reduction ends
        return op, (lambda: bool(self.torch.all(work == expected)))


def run_allreduce(args, lib: Library) -> list[dict]:
    records = []
    for size in args.sizes:
        op, check = lib.allreduce_op(size // 4)
        warmup, iterations = iterations_for(size, args.quick)
        lib.barrier()
        times = common.timed(op, iterations, warmup)
        if not check():
            raise SystemExit(f"{args.variant}: allreduce of {size} bytes returned a wrong sum")
        mean_s = sum(times) / len(times)
        record = {"benchmark": "A1", "variant": args.variant, "size_bytes": size, "ranks": lib.size,
                  "repeat": args.repeat, "iterations": iterations, "time_s": mean_s,
                  "algbw_gbps": common.algbw_gbps(size, mean_s)}
        if lib.name != "memcpy":
            record["busbw_gbps"] = common.busbw_gbps(size, mean_s, lib.size)
        records.append(record)
    return records


def run_fusion(args, lib: Library) -> list[dict]:
    torch = lib.torch
    elements = FUSION_TENSOR_BYTES // 4
    steps_warmup, steps = (1, 3) if args.quick else (3, 20)
    if lib.name == "horovod":
        tensors = [torch.full((elements,), float(lib.rank + 1)) for _ in range(FUSION_TENSORS)]

        def step():
            handles = [lib.hvd.allreduce_async(t, op=lib.hvd.Sum, name=f"f{i}") for i, t in enumerate(tensors)]
            results = [lib.hvd.synchronize(h) for h in handles]
            assert float(results[-1][0]) == lib.size * (lib.size + 1) / 2
    else:
        from torch.nn.parallel import DistributedDataParallel

        class ManyTensors(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.weights = torch.nn.ParameterList(
                    [torch.nn.Parameter(torch.ones(elements)) for _ in range(FUSION_TENSORS)])

            def forward(self, x):
                return sum((w * x).sum() for w in self.weights)

        model = DistributedDataParallel(ManyTensors(), bucket_cap_mb=args.bucket_mb)
        x = torch.full((elements,), float(lib.rank + 1))

        def step():
            model.zero_grad(set_to_none=False)
            model(x).backward()
            assert float(model.module.weights[0].grad[0]) == (lib.size + 1) / 2   # DDP averages
    lib.barrier()
    times = common.timed(step, steps, steps_warmup)
    if lib.name == "ddp":
        del step, model   # DDP's reducer must go before the process group (else: std::terminate at exit)
        gc.collect()
    return [{"benchmark": "A2", "variant": args.variant, "ranks": lib.size, "repeat": args.repeat,
             "tensors": FUSION_TENSORS, "tensor_bytes": FUSION_TENSOR_BYTES, "iterations": steps,
             "time_s": sum(times) / len(times)}]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("allreduce", "fusion"))
    parser.add_argument("--library", required=True, choices=("horovod", "torch", "ddp", "mpi4py", "memcpy"))
    parser.add_argument("--variant", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--sizes", default="4096", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--bucket-mb", type=float, default=25.0)
    parser.add_argument("--repeat", type=int, default=0)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the tensors live (cuda: NCCL; the GPU suite's B4)")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    common.pin_to_one_core(common.local_rank_from_env())
    lib = Library(args.library, args.device)
    records = run_allreduce(args, lib) if args.mode == "allreduce" else run_fusion(args, lib)
    if lib.rank == 0:
        common.write_records(args.out, records)
    lib.barrier()
    if args.library == "horovod":
        lib.hvd.shutdown()
    elif args.library in ("torch", "ddp"):
        lib.dist.destroy_process_group()


if __name__ == "__main__":
    main()
