"""A stalled NCCL collective, on a GPU: PyTorch's watchdog ends it at the process group's timeout and
its Flight Recorder leaves a dump that names the collective, its sequence number, its state and the
line of the program that called it (run in the GPU image by tests/gpu/test_gpu.py; skips without a
GPU).

The stall is made for real on one GPU: a kernel that spins for a minute (``torch.cuda._sleep``)
holds the stream, and an all-reduce queued behind it cannot complete; the process group's timeout
is 5 s. The variables are PyTorch's own (torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp and
FlightRecorder.hpp): the ring buffer's size, dump on timeout, and the dump's file prefix, which
moves the dump from ``~/.cache/torch`` to a directory of the job's output.
"""

import os
import pickle
import re
import shutil
import subprocess
import sys
import time

import pytest


def gpu_count() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return len([line for line in done.stdout.splitlines() if line.startswith("GPU ")]) if done.returncode == 0 else 0


pytestmark = pytest.mark.skipif(gpu_count() == 0, reason="no NVIDIA GPU visible in this container")

STALLED = """
import time
from datetime import timedelta
import torch, torch.distributed as dist
torch.cuda.set_device(0)
dist.init_process_group("nccl", init_method="file://{init}", rank=0, world_size=1, timeout=timedelta(seconds=5))
x = torch.ones(1 << 20, device="cuda")
dist.all_reduce(x)                                   # collective 1: completes
torch.cuda.synchronize()
print("first all-reduce done", x[0].item(), flush=True)
torch.cuda._sleep(int(60 * 2e9))                     # the stream busy for about a minute
dist.all_reduce(x)                                   # collective 2: STALLED HERE
print("second all-reduce queued", flush=True)
time.sleep(300)
"""


def test_a_stalled_nccl_collective_leaves_a_flight_recorder_dump(tmp_path):
    dumps = tmp_path / "forensics"
    dumps.mkdir()
    program = tmp_path / "stalled.py"
    program.write_text(STALLED.format(init=tmp_path / "init"))
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
           "TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_FR_DUMP_TEMP_FILE": f"{dumps}/fr_trace_rank_",
           "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{dumps}/fr_trace_rank_", "PYTHONFAULTHANDLER": "1"}
    start = time.monotonic()
    done = subprocess.run([sys.executable, str(program)], capture_output=True, text=True, timeout=240, env=env)
    seconds = time.monotonic() - start
    log = done.stdout + done.stderr
    print(f"exit {done.returncode} after {seconds:.1f} s\n{log[-4000:]}")
    assert "second all-reduce queued" in done.stdout, log[-3000:]
    assert done.returncode != 0 and seconds < 120, (done.returncode, seconds)   # ended, not left hanging
    dump = dumps / "fr_trace_rank_0"
    assert dump.exists(), sorted(p.name for p in dumps.iterdir())
    trace = pickle.loads(dump.read_bytes())
    entries = [e for e in trace["entries"] if e.get("profiling_name") == "nccl:all_reduce"]
    print("flight recorder:", [(e["collective_seq_id"], e["state"], e.get("timeout_ms")) for e in entries])
    assert [e["state"] for e in entries][:1] == ["completed"]
    stalled = entries[-1]
    assert stalled["collective_seq_id"] == 2 and stalled["state"] != "completed", stalled
    frames = [(f["filename"], f["line"]) for f in stalled["frames"]]
    assert (str(program), STALLED.splitlines().index(next(line for line in STALLED.splitlines()
                                                          if "STALLED HERE" in line)) + 1) in frames, frames
    assert re.search(r"Watchdog caught collective operation timeout|timed out|Timeout", log, re.I), log[-3000:]
