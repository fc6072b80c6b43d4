"""Test program: a script written for AWS's PyTorch container, run unchanged: on several
instances with no distribution, each host joins the others itself through torch.distributed's
env:// rendezvous, which reads MASTER_ADDR and MASTER_PORT from the environment that container
gives (the rank and world size from SM_HOSTS and SM_CURRENT_HOST, as SageMaker's PyTorch examples
do). Prints the all-reduced sum; the first host writes it to the model directory."""
import json
import os

import torch
import torch.distributed as dist

hosts = json.loads(os.environ["SM_HOSTS"])
rank = hosts.index(os.environ["SM_CURRENT_HOST"])
dist.init_process_group(backend="gloo", rank=rank, world_size=len(hosts))
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
print(f"host {os.environ['SM_CURRENT_HOST']} rank {rank} of {len(hosts)} via {os.environ['MASTER_ADDR']}:"
      f"{os.environ['MASTER_PORT']}: sum {total.item():.0f}", flush=True)
if rank == 0:
    with open(os.path.join(os.environ["SM_MODEL_DIR"], "sum.json"), "w") as out:
        json.dump({"sum": total.item(), "world_size": len(hosts)}, out)
dist.destroy_process_group()
