"""Test program: a Horovod PyTorch job whose rank 1 skips an all-reduce the others make (it sleeps
instead, as a rank stuck in its data loading would); without a stall check it would hang."""
import time

import horovod.torch as hvd
import torch

hvd.init()
for step in range(3):
    hvd.allreduce(torch.ones(4), name=f"grad.{step}")
if hvd.rank() == 1:
    time.sleep(3600)
else:
    hvd.allreduce(torch.ones(4), name="grad.skipped")
print(f"rank {hvd.rank()} done", flush=True)
