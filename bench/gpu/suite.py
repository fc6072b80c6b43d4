"""The GPU benchmark suite, run inside the GPU image with the GPUs passed in (``bench/run.py
--gpu``). Without a GPU it writes a result saying so and exits 0.

* B1: ResNet-50 v1.5 training throughput, synthetic input, mixed precision (bf16 autocast),
  channels-last, SGD, batch 256 per GPU: images/s over timed steps (CUDA events) after warm-up.
  Anchor: NVIDIA DeepLearningExamples, A100-80GB AMP 2470 images/s (NVIDIA/DeepLearningExamples,
  PyTorch/Classification/ConvNets/resnet50v1.5/README.md).
* B2: the same training fed real JPEGs (500 x 375, quality 90, generated here) through our DALI
  pipeline (GPU decode, random-resized crop 224, normalise) against a PyTorch DataLoader with PIL
  decode and the same augmentation on CPU workers. Target: DALI >= 0.95 x B1.
  ``dali_tuned``: the same pipeline with DALI's ResNet-50 example's settings (a deeper prefetch
  queue, the decoder's memory preallocated), to see what the 0.95 needs.
* B3: Horovod's single-rank overhead: B1 with ``hvd.DistributedOptimizer`` (size 1) against plain
  PyTorch, the two interleaved, medians of three runs each. Target <= 3 % (the PyTorch DDP paper's single-GPU overhead).
* B4: NCCL allreduce bus bandwidth over every GPU of the machine (bench/collectives.py under
  mpirun with ``--device cuda``), nccl-tests' formula.
* B5: ResNet-50 trained by the built-in trainer itself on B2's JPEGs (a job tree with training and
  validation channels; ``torchvision``'s ``resnet50`` at 224 px, batch 256, ``precision=bf16``,
  ``data-device=gpu``, augmentation on): the trainer ``train`` runs with no distribution (one
  process, no collectives: ``dtc_train.pytorch_single``), the Horovod trainer (one rank, as
  ``train`` runs it for ``mpi`` with one process) and the DDP one (``torchrun``, one process),
  each against the bare loop (bench/programs/bare_loop.py: zero_grad, forward, loss, backward, step) on the same
  model and DALI pipeline. Their own training images/s, median over epochs 2..N; the overhead is
  ``1 - trainer / bare loop`` (issue #19 item 7: <= 3 %), and the trainer against B1's synthetic
  input (a different ResNet-50 v1.5 build, channels-last: for scale only).
* B6: the no-distribution trainer of B5 with ``compile=on`` (torch.compile, TorchInductor) against
  itself without it, on B2's JPEGs (DALI, channels-last, bf16): images/s, median over epochs 2..N
  (epoch 1 holds the compilation), and against MLPerf Training v4.0's per-GPU ResNet-50 figure for
  the same GPU (NVIDIA's closed-division results, MXNet with DALI, LARS and CUDA graphs: an upper
  bound for a torchvision model, not a target).

Usage: ``python /bench/gpu/suite.py --out /out [--quick] [--parts B1,B3]`` (B3's and B2's ratios
need B1, which is run whenever either is asked for).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import common  # noqa: E402

PARTS = ("B1", "B2", "B3", "B4", "B5", "B6")
B5_TRAINERS = ("single", "horovod", "ddp")
B5_WRAPPERS = {"ddp": "ddp"}   # trainer -> its wrapper, which the bare loop also runs in (bare_loop.py --wrap)
B3_REPEATS = 3
ANCHORS = {"B1": "NVIDIA DeepLearningExamples RN50 v1.5 PyTorch AMP, A100-80GB: 2470 images/s",
           "B6": "MLPerf Training v4.0 closed, ResNet-50, NVIDIA (MXNet NGC 24.04, DALI): 8 x H100-SXM5-80GB "
                 "57,250 images/s (7,160 per GPU), 8 x H200-SXM-141GB 63,550 (7,940 per GPU); "
                 "mlcommons/training_results_v4.0 NVIDIA/results/{eos,h200}_ngc24.04_mxnet/resnet/result_0.txt"}
MLPERF_PER_GPU = {"H200": 7940, "H100": 7160}   # images/s, ANCHORS["B6"]


def train_throughput(batches, steps: int, warmup: int, batch_size: int, horovod: bool = False) -> float:
    """Images/s of ResNet-50 training steps on GPU 0 (bf16 autocast, channels-last, SGD) over
    ``steps`` timed steps after ``warmup``; ``batches`` yields (images [B,3,224,224], labels [B]) on GPU."""
    import torch
    from resnet import ResNet50

    model = ResNet50().cuda().to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if horovod:
        import horovod.torch as hvd

        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(images, labels):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(images.contiguous(memory_format=torch.channels_last)), labels)
        optimizer.zero_grad()   # set_to_none by default; Horovod's wrapper takes no arguments
        loss.backward()
        optimizer.step()

    for _ in range(warmup):
        step(*next(batches))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(steps):
        step(*next(batches))
    end.record()
    torch.cuda.synchronize()
    return steps * batch_size / (start.elapsed_time(end) / 1000)


def synthetic(batch_size: int):
    import torch

    images = torch.randn(batch_size, 3, 224, 224, device="cuda")
    labels = torch.randint(0, 1000, (batch_size,), device="cuda")
    while True:
        yield images, labels


def make_jpegs(root: Path, count: int, classes: int = 10, seed: int = 0) -> None:
    """``count`` 500 x 375 JPEGs (quality 90) in ``classes`` folders ``class<i>`` under ``root``."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    for i in range(count):
        folder = root / f"class{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        base = rng.integers(0, 255, (375 // 15, 500 // 20, 3), dtype=np.uint8)   # blocky, JPEG-like content
        Image.fromarray(np.kron(base, np.ones((15, 20, 1), dtype=np.uint8))).save(folder / f"{i}.jpg", quality=90)


def dali_batches(root: Path, batch_size: int, tuned: bool = False):
    """Endless GPU batches of ``root``'s JPEGs through DALI; ``tuned``: DALI's ResNet-50 example's
    settings (prefetch queue 3, the decoder's device and host memory preallocated)."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    decoder = dict(device_memory_padding=211025920, host_memory_padding=140544512) if tuned else {}

    @pipeline_def(batch_size=batch_size, num_threads=max(2, len(os.sched_getaffinity(0))), device_id=0,
                  prefetch_queue_depth=3 if tuned else 2)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=str(root), random_shuffle=True, name="reader")
        images = fn.decoders.image_random_crop(jpegs, device="mixed", output_type=types.RGB, **decoder)
        images = fn.resize(images, resize_x=224, resize_y=224)
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                          mean=[0.485 * 255, 0.456 * 255, 0.406 * 255],
                                          std=[0.229 * 255, 0.224 * 255, 0.225 * 255])
        return images, labels.gpu()

    iterator = DALIGenericIterator([pipe()], ["images", "labels"], reader_name="reader",
                                   last_batch_policy=LastBatchPolicy.DROP, auto_reset=True)
    while True:
        for batch in iterator:
            yield batch[0]["images"], batch[0]["labels"].squeeze(-1).long()


def dataloader_batches(root: Path, batch_size: int):
    """PIL decode, random-resized crop to 224 and normalisation in DataLoader worker processes."""
    import numpy as np
    import torch
    from PIL import Image

    files = sorted(root.glob("class*/*.jpg"))
    mean, std = np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)

    class JpegFolder(torch.utils.data.Dataset):
        def __len__(self):
            return len(files)

        def __getitem__(self, i):
            rng = np.random.default_rng(i)
            image = Image.open(files[i]).convert("RGB")
            w, h = image.size
            scale = rng.uniform(0.08, 1.0)
            cw, ch = max(1, int(w * scale ** 0.5)), max(1, int(h * scale ** 0.5))
            x, y = rng.integers(0, w - cw + 1), rng.integers(0, h - ch + 1)
            image = image.crop((x, y, x + cw, y + ch)).resize((224, 224), Image.BILINEAR)
            array = (np.asarray(image, np.float32) / 255 - mean) / std
            return torch.from_numpy(array.transpose(2, 0, 1)), int(files[i].parent.name[5:])

    loader = torch.utils.data.DataLoader(JpegFolder(), batch_size=batch_size, shuffle=True, drop_last=True,
                                         num_workers=max(1, len(os.sched_getaffinity(0))), pin_memory=True,
                                         persistent_workers=True)
    while True:
        for images, labels in loader:
            yield images.cuda(non_blocking=True), labels.cuda(non_blocking=True)


def b5_run(work: Path, out: Path, name: str, argv: list[str], epochs: int) -> dict:
    """Runs ``argv`` (a trainer or the bare loop) in a fresh job tree ``work/name`` whose channels
    are links to B2's JPEG folders, its output in ``out/b5-<name>.log``; returns its training
    images/s, median over epochs 2..N.

    Raises:
        SystemExit: the run failed or measured fewer epochs.
    """
    import re

    from dtc_local import job_tree

    root = Path(job_tree.write(str(work / name / "opt" / "ml"), hyperparameters={},
                               channels=("training", "validation")))
    for channel in ("training", "validation"):
        data = root / "input" / "data" / channel
        data.rmdir()
        data.symlink_to(work / channel)
    done = subprocess.run(argv, env={**os.environ, "SAGEMAKER_BASE_DIR": str(root)}, capture_output=True,
                          text=True, timeout=600, stdin=subprocess.DEVNULL)
    output = done.stdout + done.stderr
    (out / f"b5-{name}.log").write_text(output)
    if done.returncode != 0:
        raise SystemExit(f"B5 {name} failed ({done.returncode}):\n{output[-3000:]}")
    if name.startswith("bare-loop"):
        rates = [r["images_per_s"] for r in map(json.loads, done.stdout.splitlines()) if r["epoch"] > 1]
    else:   # the trainers' metric line (dtc_train.common.METRIC_LINE)
        rates = [float(r) for e, r in re.findall(r"epoch=(\d+)/\d+ .*?samples_per_second=([0-9.]+)", output)
                 if int(e) > 1]
    if len(rates) < epochs - 1:
        raise SystemExit(f"B5 {name}: {len(rates)} epochs measured of {epochs - 1}:\n{output[-3000:]}")
    return {"images_per_s": statistics.median(rates), "epochs": rates}


def trainer_args(batch: int, epochs: int, image_size: int) -> list[str]:
    """The built-in PyTorch trainers' hyperparameters in B5 and B6 (the ``model`` part first, which
    the bare loop shares)."""
    threads = str(max(2, len(os.sched_getaffinity(0))))
    return ["--model", "resnet50", "--image-size", str(image_size), "--batch-size", str(batch),
            "--epochs", str(epochs), "--dali-threads", threads]


def b6_compile(work: Path, out: Path, batch: int, epochs: int, image_size: int, gpu_name: str) -> dict:
    """B6: ``dtc_train.pytorch_single`` on ``work``'s JPEGs without and with ``compile=on``; returns
    each run's images/s, the speed-up and the compiled trainer against MLPerf's per-GPU figure for
    ``gpu_name`` (``None`` for a GPU MLPerf v4.0 did not run)."""
    trainer = [sys.executable, "-m", "dtc_train.pytorch_single", *trainer_args(batch, epochs, image_size),
               "--precision", "bf16", "--data-device", "gpu", "--augment", "on", "--system-metrics-seconds", "0",
               "--progress-seconds", "0"]
    result = {"eager": b5_run(work, out, "trainer-single-eager", trainer, epochs)}
    result["compiled"] = b5_run(work, out, "trainer-single-compiled", [*trainer, "--compile", "on"], epochs)
    result["speedup"] = result["compiled"]["images_per_s"] / result["eager"]["images_per_s"]
    anchor = next((rate for name, rate in MLPERF_PER_GPU.items() if name in gpu_name), None)
    result["mlperf_per_gpu_images_per_s"] = anchor
    result["compiled_vs_mlperf"] = result["compiled"]["images_per_s"] / anchor if anchor else None
    return result


def b5_trainer(work: Path, out: Path, name: str, batch: int, epochs: int, image_size: int) -> dict:
    """B5 for the trainer ``name`` (one of ``B5_TRAINERS``) in ``work``, which holds B2's JPEGs as
    ``training`` and a validation set as ``validation``: the bare loop in that trainer's memory
    format, then the trainer (a drifting clock shows as different bare-loop rates between
    trainers); for a trainer in ``B5_WRAPPERS`` also the bare loop in that trainer's wrapper
    (``bare_loop.py --wrap``), between the two: the wrapper's own cost apart from the trainer's.
    Each run's output goes to ``out``. Returns each run's images/s and the overhead
    ``1 - trainer / bare loop``; with a wrapper ``w`` also ``bare_loop_<w>`` and the overheads
    ``<w>_wrapper_overhead`` (``1 - bare loop in w / bare loop``) and
    ``overhead_vs_bare_loop_<w>`` (``1 - trainer / bare loop in w``)."""
    model = trainer_args(batch, epochs, image_size)
    trainer = [*model, "--precision", "bf16", "--data-device", "gpu", "--augment", "on",
               "--system-metrics-seconds", "0", "--progress-seconds", "0"]
    argv = {"single": [sys.executable, "-m", "dtc_train.pytorch_single", *trainer],
            "horovod": [sys.executable, "-m", "dtc_train.pytorch_horovod", *trainer],
            "ddp": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
                    "-m", "dtc_train.pytorch_ddp", *trainer]}[name]
    bare = [sys.executable, str(HERE.parent / "programs" / "bare_loop.py"), *model, "--device", "cuda",
            "--precision", "bf16", "--data-parallel", name]   # --data-parallel: that trainer's memory format
    result = {"bare_loop": b5_run(work, out, f"bare-loop-{name}", bare, epochs)}
    wrapper = B5_WRAPPERS.get(name)
    if wrapper:
        result[f"bare_loop_{wrapper}"] = b5_run(work, out, f"bare-loop-{wrapper}-wrapped",
                                                [*bare, "--wrap", wrapper], epochs)
    result["trainer"] = b5_run(work, out, f"trainer-{name}", argv, epochs)
    rate = {key: run["images_per_s"] for key, run in result.items()}
    result["overhead"] = 1 - rate["trainer"] / rate["bare_loop"]
    if wrapper:
        result[f"{wrapper}_wrapper_overhead"] = 1 - rate[f"bare_loop_{wrapper}"] / rate["bare_loop"]
        result[f"overhead_vs_bare_loop_{wrapper}"] = 1 - rate["trainer"] / rate[f"bare_loop_{wrapper}"]
    return result


def b4_busbw(out: Path, gpus: int, quick: bool) -> list[dict]:
    sizes = "1048576,8388608" if quick else "1048576,8388608,67108864,268435456,1073741824"
    records = out / "b4.jsonl"
    done = subprocess.run(["mpirun", "-np", str(gpus), "-bind-to", "none", sys.executable,
                           str(HERE.parent / "collectives.py"), "allreduce", "--library", "horovod", "--device", "cuda",
                           "--variant", f"horovod-nccl-{gpus}gpu", "--sizes", sizes, "--out", str(records)]
                          + (["--quick"] if quick else []), capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"B4 failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    return [{**r, "benchmark": "B4"} for r in common.read_records(str(records))]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    parser.add_argument("--b5-trainers", default=",".join(B5_TRAINERS),
                        help=f"B5's trainers: a subset of {','.join(B5_TRAINERS)}")
    args = parser.parse_args(argv)
    parts, trainers = set(args.parts.split(",")), args.b5_trainers.split(",")
    if not parts or parts - set(PARTS):
        parser.error(f"--parts: {args.parts!r} is not a comma-separated subset of {','.join(PARTS)}")
    if set(trainers) - set(B5_TRAINERS):
        parser.error(f"--b5-trainers: {args.b5_trainers!r} is not a comma-separated subset of {','.join(B5_TRAINERS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import torch

    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": common.machine(),
              "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
              "torch": torch.__version__, "cuda": torch.version.cuda, "anchors": ANCHORS}
    if not result["gpus"]:
        result["skipped"] = "no GPU visible: the GPU suite needs docker run --gpus all on an NVIDIA machine"
        (out / "gpu-results.json").write_text(json.dumps(result, indent=2))
        print(result["skipped"])
        return
    batch, steps, warmup, images = (32, 5, 3, 256) if args.quick else (256, 50, 20, 5000)
    results = out / "gpu-results.json"   # rewritten after each part: a failing part leaves the others' results
    b1 = train_throughput(synthetic(batch), steps, warmup, batch)
    result["B1"] = {"images_per_s": b1, "batch_per_gpu": batch, "precision": "bf16 autocast"}
    results.write_text(json.dumps(result, indent=2))
    with tempfile.TemporaryDirectory() as tmp:
        jpegs = Path(tmp) / "training"
        if parts & {"B2", "B5", "B6"}:
            make_jpegs(jpegs, images)
        if "B2" in parts:
            b2_dali = train_throughput(dali_batches(jpegs, batch), steps, warmup, batch)
            b2_tuned = train_throughput(dali_batches(jpegs, batch, tuned=True), steps, warmup, batch)
            b2_loader = train_throughput(dataloader_batches(jpegs, batch), steps, warmup, batch)
            result["B2"] = {"dali_images_per_s": b2_dali, "dali_tuned_images_per_s": b2_tuned,
                            "dataloader_images_per_s": b2_loader, "dali_vs_synthetic": b2_dali / b1,
                            "dali_tuned_vs_synthetic": b2_tuned / b1, "target_dali_vs_synthetic": 0.95}
            results.write_text(json.dumps(result, indent=2))
        epochs, image_size = (3, 64) if args.quick else (6, 224)
        if parts & {"B5", "B6"}:
            make_jpegs(Path(tmp) / "validation", images // 10, seed=1)
        if "B6" in parts:
            result["B6"] = b6_compile(Path(tmp), out, batch, epochs, image_size, result["gpus"][0])
            results.write_text(json.dumps(result, indent=2))
        if "B5" in parts:
            result["B5"] = {"batch_per_gpu": batch, "image_size": image_size, "precision": "bf16",
                            "target_overhead": 0.03}
            for name in trainers:   # each trainer's result written as it comes
                result["B5"][name] = b5_trainer(Path(tmp), out, name, batch, epochs, image_size)
                result["B5"][name]["trainer_vs_b1"] = result["B5"][name]["trainer"]["images_per_s"] / b1
                results.write_text(json.dumps(result, indent=2))
    if "B3" in parts:
        import horovod.torch as hvd

        hvd.init()
        # plain and Horovod interleaved, medians of B3_REPEATS each: clocks drift over a run
        plain, wrapped = [], []
        for _ in range(1 if args.quick else B3_REPEATS):
            plain.append(train_throughput(synthetic(batch), steps, warmup, batch))
            wrapped.append(train_throughput(synthetic(batch), steps, warmup, batch, horovod=True))
        b3, b3_plain = statistics.median(wrapped), statistics.median(plain)
        result["B3"] = {"horovod_images_per_s": b3, "plain_images_per_s": b3_plain, "overhead": 1 - b3 / b3_plain,
                        "horovod_runs": wrapped, "plain_runs": plain, "target_overhead": 0.03}
        results.write_text(json.dumps(result, indent=2))
    if "B4" in parts:
        result["B4"] = b4_busbw(out, len(result["gpus"]), args.quick)
    results.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: result[k] for k in ("gpus", "B1", "B2", "B3", "B5", "B6") if k in result}, indent=2))


if __name__ == "__main__":
    main()
