"""Test program: a job that stops making progress, without an error, the ways users' jobs do
(issue #41). ``--mode``:

- ``lock``: one process takes a lock it already holds, after a line of output;
- ``torch-loader``: ranks under torchrun all-reduce a tensor per step; rank 1 sleeps in its data
  loading at step 3 while the others wait in the all-reduce (Gloo);
- ``mpi-lock``: ranks under mpirun (mpi4py); rank 1 takes a lock it holds while the others wait
  in a barrier;
- ``slow-start``: a healthy job whose first step is silent for ``--first-step-s`` seconds, then
  prints a line per second for ``--steps`` steps and exits 0;
- ``busy``: a healthy job that computes for ``--first-step-s`` seconds without a word, then
  prints one line and exits 0.
"""
import argparse
import os
import threading
import time

parser = argparse.ArgumentParser()
parser.add_argument("--mode", required=True)
parser.add_argument("--first-step-s", type=float, default=0)
parser.add_argument("--steps", type=int, default=5)
args = parser.parse_args()


def hold_the_lock(lock: threading.Lock) -> None:
    lock.acquire()   # held already: never returns


def load_batch(rank: int, step: int) -> None:
    if rank == 1 and step == 3:
        time.sleep(3600)   # a loader that never delivers


if args.mode == "lock":
    lock = threading.Lock()
    lock.acquire()
    print("step 1 done", flush=True)
    hold_the_lock(lock)
elif args.mode == "torch-loader":
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for step in range(1, 100):
        load_batch(rank, step)
        gradient = torch.ones(4)
        dist.all_reduce(gradient)
        print(f"rank {rank} step {step} sum {gradient[0].item():.0f}", flush=True)
        time.sleep(0.2)
elif args.mode == "mpi-lock":
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    print(f"rank {comm.Get_rank()} started", flush=True)
    if comm.Get_rank() == 1:
        lock = threading.Lock()
        lock.acquire()
        hold_the_lock(lock)
    comm.Barrier()
elif args.mode == "slow-start":
    time.sleep(args.first_step_s)
    for step in range(1, args.steps + 1):
        print(f"step {step} of {args.steps}", flush=True)
        time.sleep(1)
    print(f"done (pid {os.getpid()})", flush=True)
elif args.mode == "busy":
    deadline, total = time.monotonic() + args.first_step_s, 0
    while time.monotonic() < deadline:
        total += sum(i * i for i in range(10_000))
    print(f"computed {total > 0}", flush=True)
else:
    raise SystemExit(f"unknown --mode {args.mode}")
