"""The preflight's proof on a GPU machine that cannot run the image (scripts/device-gpu-proof.sh
runs it there): the preflight's own modules (``dtc_entrypoint.preflight``), with that machine's
torch and NCCL, and Horovod built there once per architecture list.

For each Horovod build (``--horovod ARCH=SITE``, SITE holding that build's ``horovod`` package):

1. the probe (``python -m dtc_entrypoint.preflight.probe``) for an ``mpi`` job of
   ``builtin:pytorch``, in ``full`` and ``quick`` mode with the first build, ``quick`` with the
   others: its verdict, the Horovod finding, the GPU's all-reduce figures and its time;
2. ``preflight.run.run`` as ``train`` calls it (a ``JobConfig`` and ``LaunchPlan`` built here, as
   ``train`` would on a one-host job): passes, or raises ``PreflightError`` whose first line is
   printed;
3. Horovod's own scaled all-reduce on the GPU (``prescale_factor=2``, which runs Horovod's
   ``scale_buffer`` kernel): exact, wrong without an error, or an error (horovod#2230: kernel
   launches are not checked);
4. the probe's reading of each library's compiled architectures against ``cuobjdump --list-elf``
   and ``--list-ptx`` on the same files.

Each result is one JSON line on stdout and in ``--out``.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

SCALED_ALLREDUCE = """
import json, torch, horovod.torch as hvd
hvd.init()
torch.cuda.set_device(0)
x = torch.arange(1 << 16, dtype=torch.float32, device="cuda")
record = {}
try:
    y = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, name="scaled")
    torch.cuda.synchronize()
    record["exact"] = bool(torch.equal(y, x * 2 * hvd.size()))
    record["unscaled"] = bool(torch.equal(y, x * hvd.size()))
except Exception as error:
    record["error"] = f"{type(error).__name__}: {error}".splitlines()[0]
print(json.dumps(record))
"""


def emit(out, record: dict) -> None:
    line = json.dumps(record)
    print(line, flush=True)
    out.write(line + "\n")
    out.flush()


def probe(mode: str, site: str, workdir: str, image_cuda: str) -> tuple[dict, float, str]:
    path = os.path.join(workdir, f"preflight-{mode}.json")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([site, os.environ.get("PYTHONPATH", "")])}
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "dtc_entrypoint.preflight.probe", "--mode", mode, "--host", "gpu-host",
                           "--hosts", "gpu-host", "--master", "127.0.0.1", "--port", "29600", "--strategy", "mpi",
                           "--program", "builtin:pytorch", "--processes-per-host", "1", "--image-cuda", image_cuda,
                           "--workdir", workdir, "--out", path], env=env, capture_output=True, text=True, timeout=900)
    seconds = time.monotonic() - start
    record = json.load(open(path)) if os.path.exists(path) else {"error": done.stderr[-2000:]}
    return record, seconds, done.stderr


def through_run(site: str, image_cuda: str, base_dir: str) -> dict:
    """``preflight.run.run`` for a one-host ``mpi`` job of ``builtin:pytorch`` (quick mode)."""
    code = f"""
import json, os, sys, time
from dtc_entrypoint.config import JobConfig, MpiConfig
from dtc_entrypoint.errors import PreflightError
from dtc_entrypoint.plan import LaunchPlan
from dtc_entrypoint.preflight import run
config = JobConfig(base_dir={base_dir!r}, current_host="algo-1", hosts=("algo-1",), distribution_hosts=("algo-1",),
                   master_host="algo-1", network_interface="lo", num_gpus=1, num_cpus=os.cpu_count(),
                   program="builtin:pytorch", submit_dir="", code_dir={base_dir!r} + "/code", user_hyperparameters={{}},
                   framework_parameters={{"sagemaker_mpi_enabled": True}}, mpi=MpiConfig(True, 1), strategy="mpi",
                   python=sys.executable, preflight="quick", instance_type="ml.p5en.48xlarge")
plan = LaunchPlan(strategy="mpi", role="launcher", argv=(), env={{}}, workdir="/tmp", hosts=("algo-1",),
                  master_host="algo-1")
start = time.monotonic()
try:
    record = run.run(config, plan, {{**os.environ, "DTC_CUDA_VERSION": {image_cuda!r}}})
    print(json.dumps({{"raised": None, "verdict": record["verdict"], "seconds": time.monotonic() - start}}))
except PreflightError as error:
    print(json.dumps({{"raised": str(error).splitlines()[0], "seconds": time.monotonic() - start}}))
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([site, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {"error": (done.stdout + done.stderr)[-2000:]}


def cuobjdump_targets(path: str) -> list[str] | None:
    """``sm_90``/``compute_90`` entries cuobjdump lists for ``path`` (``None`` without cuobjdump)."""
    tool = shutil.which("cuobjdump") or ("/usr/local/cuda/bin/cuobjdump" if os.path.exists(
        "/usr/local/cuda/bin/cuobjdump") else None)
    if tool is None:
        return None
    found = set()
    for flag, kind in (("--list-elf", "sm"), ("--list-ptx", "compute")):
        done = subprocess.run([tool, flag, path], capture_output=True, text=True, timeout=600)
        found |= {f"{kind}_{arch}" for arch in re.findall(r"\.sm_(\d+)[a-z]?\.(?:cubin|ptx)", done.stdout)}
    return sorted(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--horovod", action="append", required=True, metavar="ARCH=SITE")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    import torch

    from dtc_entrypoint.preflight.fatbin import Target, describe

    image_cuda = torch.version.cuda or "none"   # this machine's CUDA runtime stands for the image's
    with open(args.out, "a") as out, tempfile.TemporaryDirectory() as tmp:
        compared = set()
        for number, entry in enumerate(args.horovod):
            arch, _, site = entry.partition("=")
            for mode in ("full", "quick") if number == 0 else ("quick",):
                record, seconds, stderr = probe(mode, site, tmp, image_cuda)
                host = next(iter(record.get("summaries", {}).values()), {})
                findings = host.get("findings", [])
                emit(out, {"step": f"preflight-probe-{mode}", "horovod_built_for": arch, "wall_s": round(seconds, 2),
                           "probe_s": record.get("seconds"), "local_s": host.get("seconds"),
                           "verdict": record.get("verdict"), "first_failure": record.get("first_failure"),
                           "horovod": [f for f in findings if f["message"].startswith(("horovod", "Horovod"))],
                           "not_passed": [f for f in findings if f["status"] != "pass"],
                           "gpus": host.get("facts", {}).get("gpus"),
                           "allreduce_host": host.get("facts", {}).get("allreduce_host"),
                           "driver": [f["message"] for f in findings if f["check"] == "driver"],
                           "components": {k: describe(Target(a, t) for a, t in v["targets"])
                                          for k, v in host.get("facts", {}).get("components", {}).items()},
                           "error": record.get("error")})
                if mode == "full" or number > 0:
                    for name, component in host.get("facts", {}).get("components", {}).items():
                        for path in component["files"]:
                            if path in compared:
                                continue
                            compared.add(path)
                            from dtc_entrypoint.preflight.fatbin import targets_of
                            ours = sorted(str(t) for t in targets_of(path))
                            theirs = cuobjdump_targets(path)
                            emit(out, {"step": "fatbin-vs-cuobjdump", "component": name, "file": path, "ours": ours,
                                       "cuobjdump": theirs, "same": theirs is not None and ours == theirs})
            emit(out, {"step": "preflight-through-run", "horovod_built_for": arch,
                       **through_run(site, image_cuda, os.path.join(tmp, f"job-{arch}"))})
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([site, os.environ.get("PYTHONPATH", "")])}
            done = subprocess.run([sys.executable, "-c", SCALED_ALLREDUCE], env=env, capture_output=True, text=True,
                                  timeout=300)
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            emit(out, {"step": "horovod-scaled-allreduce", "horovod_built_for": arch, "rc": done.returncode,
                       **(json.loads(lines[-1]) if lines else {"stderr": done.stderr[-1500:]})})


if __name__ == "__main__":
    main()
