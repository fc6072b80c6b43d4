"""Test program: rank ``--rank`` (every rank by default) fills ``--megabytes`` of memory, touching
every page, then sleeps: in a container with a smaller memory limit the kernel's out-of-memory
killer ends it with SIGKILL."""
import argparse
import os
import time

parser = argparse.ArgumentParser()
parser.add_argument("--megabytes", type=int, required=True)
parser.add_argument("--rank", default="")
args, _ = parser.parse_known_args()
rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0"))
if args.rank in ("", rank):
    blocks = []
    for _ in range(args.megabytes):
        block = bytearray(2**20)
        block[::4096] = b"\x01" * len(range(0, 2**20, 4096))   # touch every page: resident, not just mapped
        blocks.append(block)
time.sleep(60)
