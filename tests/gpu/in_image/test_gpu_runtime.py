"""GPU runtime checks, run inside the GPU image on a machine with NVIDIA GPUs (tests/gpu/test_gpu.py
starts them there with the GPUs passed in; `make gpu-check` runs that and writes a dated report).
Without a GPU every test here skips.

What they prove: NCCL collectives through Horovod return exact values on the GPU, for both
frameworks, on one GPU and on every GPU of the machine; DALI decodes on the GPU (its output lives
in GPU memory); each built-in trainer trains on the GPU to the accuracy it reaches on CPU.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def gpu_count() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return len([line for line in done.stdout.splitlines() if line.startswith("GPU ")]) if done.returncode == 0 else 0


GPUS = gpu_count()
pytestmark = pytest.mark.skipif(GPUS == 0, reason="no NVIDIA GPU visible in this container")
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "NCCL_DEBUG": "INFO"}
METRIC = re.compile(r"epoch=(\d+)/(\d+) .*?val_accuracy=([0-9.]+) val_samples=(\d+)")

TORCH_COLLECTIVES = """
import horovod.torch as hvd, torch
hvd.init(); torch.cuda.set_device(hvd.local_rank())
n, r = hvd.size(), hvd.rank()
x = torch.full((1 << 20,), float(r + 1), device="cuda")
y = hvd.allreduce(x, op=hvd.Sum, name="sum")
i = hvd.allreduce(torch.full((7,), r + 1, dtype=torch.int32, device="cuda"), op=hvd.Sum, name="int")
b = hvd.broadcast(torch.full((3,), 42.0 if r == 0 else -1.0, device="cuda"), root_rank=0, name="bcast")
g = hvd.allgather(torch.full((2,), float(r), device="cuda"), name="gather")
assert y.is_cuda and b.is_cuda and g.is_cuda
assert torch.equal(y, torch.full_like(x, n * (n + 1) / 2)), y[:4]
assert i.tolist() == [n * (n + 1) // 2] * 7 and b.tolist() == [42.0] * 3
assert g.tolist() == [float(k) for k in range(n) for _ in range(2)]
print(f"torch rank {r}/{n} ok on {y.device}")
"""

TF_COLLECTIVES = """
import os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf, horovod.tensorflow as hvd
hvd.init()
gpus = tf.config.list_physical_devices("GPU")
tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
n, r = hvd.size(), hvd.rank()
with tf.device("/GPU:0"):
    y = hvd.allreduce(tf.fill([1 << 20], float(r + 1)), op=hvd.Sum, name="sum")
    b = hvd.broadcast(tf.fill([3], 42.0 if r == 0 else -1.0), root_rank=0, name="bcast")
assert "GPU" in y.device and "GPU" in b.device, (y.device, b.device)
assert float(tf.reduce_min(y)) == float(tf.reduce_max(y)) == n * (n + 1) / 2
assert b.numpy().tolist() == [42.0] * 3
print(f"tensorflow rank {r}/{n} ok on {y.device}")
"""


@pytest.mark.parametrize("framework, code", [("torch", TORCH_COLLECTIVES), ("tensorflow", TF_COLLECTIVES)])
@pytest.mark.parametrize("ranks", sorted({1, GPUS}), ids=lambda n: f"{n}-gpu")
def test_nccl_collectives_are_exact_on_the_gpu(framework, code, ranks):
    done = subprocess.run(["mpirun", "-np", str(ranks), "-x", "NCCL_DEBUG", "-x", "TF_CPP_MIN_LOG_LEVEL",
                           sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=ENV)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert len(re.findall(rf"{framework} rank \d+/{ranks} ok on .*(cuda|GPU)", done.stdout)) == ranks
    assert "NCCL INFO" in done.stdout + done.stderr          # the collectives went through NCCL


def test_dali_decodes_on_the_gpu(tmp_path):
    code = f"""
import numpy as np
from PIL import Image
from nvidia.dali import fn, pipeline_def
from nvidia.dali.backend import TensorListGPU
from nvidia.dali.plugin.pytorch import DALIGenericIterator
for c in range(2):
    d = "{tmp_path}/" + str(c); __import__("os").makedirs(d, exist_ok=True)
    Image.fromarray(np.full((8, 8, 3), 40 * c, np.uint8)).save(d + "/a.jpg")
@pipeline_def(batch_size=2, num_threads=1, device_id=0)
def pipe():
    jpegs, labels = fn.readers.file(file_root="{tmp_path}", name="reader")
    return fn.decoders.image(jpegs, device="mixed"), labels
p = pipe(); p.build()
images, _ = p.run()
assert isinstance(images, TensorListGPU), type(images)
batch = next(iter(DALIGenericIterator(pipe(), ["images", "labels"], reader_name="reader")))[0]
assert batch["images"].is_cuda and tuple(batch["images"].shape) == (2, 8, 8, 3)
print("decoded on", batch["images"].device)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=ENV)
    assert done.returncode == 0 and "decoded on cuda" in done.stdout, done.stdout[-2000:] + done.stderr[-3000:]


TRAINERS = {
    "horovod-pytorch": ({"sagemaker_mpi_enabled": True}, "builtin:pytorch", r"on cuda:0 .*DALI decodes on gpu"),
    "horovod-tensorflow": ({"sagemaker_mpi_enabled": True}, "builtin:tensorflow", r"DALI decodes on gpu"),
    "ddp": ({"sagemaker_torch_distributed_enabled": True}, "builtin:pytorch", r"on cuda:0 .*DALI decodes on gpu"),
    "multi-worker-mirrored": ({"sagemaker_multi_worker_mirrored_strategy_enabled": True}, "builtin:tensorflow",
                              r"replicas on \S*device:GPU:0"),
}


@pytest.mark.parametrize("trainer", list(TRAINERS))
def test_builtin_trainer_trains_on_the_gpu(trainer, tmp_path):
    from dtc_local import job_tree
    from dtc_train import digits

    flags, program, on_gpu = TRAINERS[trainer]
    root = tmp_path / "opt" / "ml"
    job_tree.write(str(root), channels=("training", "validation"), hyperparameters={
        "sagemaker_program": program, "sagemaker_mpi_num_of_processes_per_host": GPUS, "epochs": 12, **flags})
    digits.export(str(root / "input" / "data"))
    done = subprocess.run(["train"], capture_output=True, text=True, timeout=1200,
                          env={**ENV, "SAGEMAKER_BASE_DIR": str(root)})
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-5000:]
    epochs = METRIC.findall(log)
    assert epochs and int(epochs[-1][3]) == 360 and float(epochs[-1][2]) >= 0.90, epochs[-1:]
    assert re.search(on_gpu, log), f"no sign of the GPU in the log ({on_gpu})"
    assert json.loads((root / "model" / "model.json").read_text())
    assert Path(root / "output" / "success").exists()
