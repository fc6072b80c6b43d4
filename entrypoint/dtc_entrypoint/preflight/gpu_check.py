"""``gpu-check``: the image checks a GPU machine before a job does (``docker run --gpus all IMAGE
gpu-check``), with no clone and no host setup.

It runs the preflight's probe in ``full`` mode as a one-host job that needs every component
(``--strategy all``: a gap in Horovod's, TensorFlow's, DALI's, NCCL's or torch's architectures for
these GPUs fails), then a short throughput check: torchvision's ResNet-50 trained in bf16 by the
built-in trainer with no distribution (``dtc_train.pytorch_single``, DALI decoding on the GPU,
channels-last) on crops of real photographs (``dtc_train.photos``) for a few epochs, images/s the
median of the epochs after the first. It prints a dated report (Markdown) and writes it, with the
probe's JSON, under ``--out``.

Exit codes: 0 every check passed (warnings allowed), 1 a check failed, 3 no NVIDIA GPU is visible
(nothing was checked: a run that proved nothing never passes for one that did).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

EXIT_FAILED, EXIT_NO_GPU = 1, 3
METRIC = re.compile(r"epoch=(\d+)/\d+ .*?samples_per_second=([0-9.]+)")


def visible_gpus() -> list[str]:
    """``nvidia-smi -L``'s lines, empty without an NVIDIA driver or GPU."""
    if shutil.which("nvidia-smi") is None:
        return []
    done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return [line for line in done.stdout.splitlines() if line.startswith("GPU ")] if done.returncode == 0 else []


def run_probe(workdir: str, out: str) -> dict:
    """The probe in ``full`` mode for one host needing every component; its record."""
    path = os.path.join(out, "preflight.json")
    subprocess.run([sys.executable, "-m", "dtc_entrypoint.preflight.probe", "--mode", "full", "--host", "gpu-check",
                    "--hosts", "gpu-check", "--master", "127.0.0.1", "--port", "2227", "--strategy", "all",
                    "--workdir", workdir, "--out", path], check=False, timeout=1800)
    if not os.path.exists(path):
        return {"verdict": "fail", "first_failure": {"message": "the preflight's probe broke: see its output above"},
                "summaries": {}}
    with open(path) as handle:
        return json.load(handle)


def throughput(workdir: str, epochs: int, batch_size: int, model: str = "resnet50", image_size: int = 224,
               precision: str = "bf16") -> dict:
    """``model`` (ResNet-50) in ``precision`` (bf16) through ``dtc_train.pytorch_single`` on
    photograph crops, 16 batches an epoch, DALI decoding on the GPU when one is visible: images/s
    per epoch and their median over epochs 2..N, the exit code, the time, and the output's tail
    when it failed."""
    from dtc_local import job_tree  # noqa: PLC0415  (this command's own, in the image)
    from dtc_train import photos  # noqa: PLC0415

    root = job_tree.write(os.path.join(workdir, "opt", "ml"), hyperparameters={}, channels=photos.CHANNELS)
    data = os.path.join(workdir, "photos")
    photos.export(data, per_class=(batch_size * 16 // 3 + 1, 64), size=256)
    for channel in photos.CHANNELS:
        target = os.path.join(root, "input", "data", channel)
        os.rmdir(target)
        os.symlink(os.path.join(data, channel), target)
    argv = [sys.executable, "-m", "dtc_train.pytorch_single", "--model", model, "--image-size", str(image_size),
            "--batch-size", str(batch_size), "--epochs", str(epochs), "--precision", precision, "--data-device", "auto",
            "--augment", "on", "--dali-threads", str(max(2, min(8, os.cpu_count() or 2))),
            "--system-metrics-seconds", "0", "--progress-seconds", "0"]
    start = time.monotonic()
    done = subprocess.run(argv, env={**os.environ, "SAGEMAKER_BASE_DIR": root}, capture_output=True, text=True,
                          timeout=1800)
    rates = [(int(epoch), float(rate)) for epoch, rate in METRIC.findall(done.stdout + done.stderr)]
    later = [rate for epoch, rate in rates if epoch > 1]
    return {"exit_code": done.returncode, "seconds": round(time.monotonic() - start, 1),
            "images_per_s": statistics.median(later) if later else None, "epochs": rates,
            "tail": (done.stdout + done.stderr)[-3000:] if done.returncode else ""}


def report(gpus: list[str], record: dict, speed: dict | None) -> str:
    """The dated Markdown report."""
    if "FLAVOR" in os.environ:   # the image's ENV (Dockerfile)
        image = (f"{os.environ['FLAVOR']} flavor, torch {os.environ.get('DTC_TORCH_VERSION', '?')}, "
                 f"CUDA {os.environ.get('DTC_CUDA_VERSION', '?')}")
    else:
        image = f"none (outside the image; the image's CUDA taken as {os.environ.get('DTC_CUDA_VERSION', 'none')})"
    lines = [f"# gpu-check, {record.get('date') or time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}", "",
             f"- image: {image}", "- GPUs:", *[f"  - {g}" for g in gpus],
             f"- preflight (full): **{record.get('verdict')}** in {record.get('seconds', 0):.1f} s", ""]
    summary = next(iter(record.get("summaries", {}).values()), {})
    lines += ["| check | status | finding |", "|---|---|---|"]
    lines += [f"| {f['check']} | {f['status']} | {f['message']} |" for f in summary.get("findings", [])]
    if speed is not None:
        rate = f"{speed['images_per_s']:.0f} images/s" if speed["images_per_s"] else "not measured"
        lines += ["", f"- ResNet-50, bf16, built-in trainer (one process, DALI on the GPU): **{rate}** "
                      f"(median of epochs 2-{len(speed['epochs'])}; exit code {speed['exit_code']}, "
                      f"{speed['seconds']:.0f} s)"]
        if speed["tail"]:
            lines += ["", "```", speed["tail"], "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="gpu-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.getcwd(), help="where the report and preflight.json go")
    parser.add_argument("--epochs", type=int, default=4, help="the throughput check's epochs (0: none)")
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args(argv)
    gpus = visible_gpus()
    if not gpus:
        print("gpu-check: no NVIDIA GPU is visible here (nvidia-smi lists none): nothing was checked. Run it on a GPU "
              "machine with the NVIDIA container toolkit: docker run --gpus all IMAGE gpu-check", file=sys.stderr)
        sys.exit(EXIT_NO_GPU)
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as workdir:
        record = run_probe(workdir, args.out)
        speed = throughput(workdir, args.epochs, args.batch_size) if args.epochs else None
    text = report(gpus, record, speed)
    stamp = (record.get("date") or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())).replace(":", "")
    path = os.path.join(args.out, f"gpu-check-{stamp}.md")
    with open(path, "w") as handle:
        handle.write(text)
    print(text)
    print(f"gpu-check: report {path}", file=sys.stderr)
    failed = record.get("verdict") == "fail" or (speed is not None and speed["exit_code"] != 0)
    sys.exit(EXIT_FAILED if failed else 0)


if __name__ == "__main__":
    main()
