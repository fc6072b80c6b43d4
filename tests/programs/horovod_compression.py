"""Test program, run by mpirun on 2 ranks: one Horovod step of the built-in trainer's optimizer
(dtc_train.pytorch_horovod.distributed_optimizer) on different data per rank, with the
allreduce compression given. Writes <out>/compression-<rank>.json: whether every averaged
gradient is a float16 value, and the gradients.

Usage: horovod_compression.py {none|fp16} OUT_DIR
"""
import json
import os
import sys

import horovod.torch as hvd
import torch

from dtc_train import pytorch_horovod

compression, out_dir = sys.argv[1:3]
hvd.init()
torch.manual_seed(0)                      # the same weights on both ranks
model = torch.nn.Linear(64, 3)
optimizer = pytorch_horovod.distributed_optimizer(model, 0.1, 0.9, compression)
torch.manual_seed(1 + hvd.rank())         # each rank its own batch
loss = model(torch.randn(16, 64)).square().mean()
optimizer.zero_grad()
loss.backward()
optimizer.synchronize()                   # the allreduce: p.grad is the average over the ranks
grads = [p.grad for p in model.parameters()]
with open(os.path.join(out_dir, f"compression-{hvd.rank()}.json"), "w") as handle:
    json.dump({"float16_values": all(torch.equal(g, g.half().float()) for g in grads),
               "grads": [g.tolist() for g in grads]}, handle)
