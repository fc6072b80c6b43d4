"""The preflight's decisions: pure functions from measured facts to findings.

Nothing here measures, imports a framework or starts a process (``probe`` gathers the facts on
each host), so each rule is tested with injected facts: a driver version, a compute capability,
a component's compiled architectures, a host made slow.

A finding's ``status`` is ``pass``, ``warn`` (logged and kept in ``preflight.json``; the job
runs) or ``fail`` (the job stops before the user's program, every host naming the first
failure). A failing finding's message follows the failure contract: its first sentence says what
is wrong and what to change.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

from .. import launchers
from ..launchers import Strategy
from .fatbin import Target, describe, runs_on

PASS, WARN, FAIL = "pass", "warn", "fail"

# CUDA minor-version compatibility: a CUDA 12.x runtime runs on any driver of the 12 series from
# 525.60.13 on, except for PTX newer than the driver (docs.nvidia.com/deploy/cuda-compatibility/,
# "Minor Version Compatibility"); each toolkit's own minimum is in its release notes (12.8: 570.26).
MINOR_COMPATIBILITY_DRIVER = {12: "525.60.13", 13: "580.65.06"}

# Components the image ships with device code (their libraries' fatbins: probe.library_targets).
COMPONENTS = {
    "torch": "PyTorch's CUDA kernels",
    "nccl": "NCCL (the collectives of DDP, FSDP and Horovod on GPUs)",
    "horovod": "Horovod's CUDA kernels (fused and scaled all-reduces)",
    "tensorflow": "TensorFlow's CUDA kernels",
    "dali": "NVIDIA DALI (the built-in trainers' GPU decoding)",
}


@dataclass(frozen=True)
class Finding:
    """One check's result on one host (``host`` empty for a check of the whole job).

    Attributes:
        check: ``driver``, ``gpu``, ``archs``, ``allreduce-host``, ``allreduce-hosts``, ``efa``,
            ``shm``, ``straggler``, ``rendezvous`` or ``probe``.
        status: ``pass``, ``warn`` or ``fail``.
        message: one line for a log; for ``fail``, what is wrong and what to change.
    """

    check: str
    status: str
    message: str
    host: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def version_tuple(text: str) -> tuple[int, ...]:
    """``"12.8"`` -> ``(12, 8)``; ``"570.86.15"`` -> ``(570, 86, 15)``."""
    return tuple(int(part) for part in text.strip().split(".") if part.isdigit())


def components_needed(strategy: str, program: str | None) -> frozenset[str]:
    """The components the job's processes load for sure: a GPU they cannot run on fails the job.
    The others are checked too, and a gap there is a warning (a user's script may not load them).

    Each launcher's processes load what its record says (``launchers.Launcher.needs``: ``mpi``
    Horovod and with it NCCL; ``torch_distributed`` torch and NCCL; the TensorFlow strategies
    TensorFlow); the built-in trainers load their framework and DALI.
    ``all`` (``gpu-check``): every component."""
    if strategy == "all":
        return frozenset(COMPONENTS)
    needed = set(launchers.of(strategy).needs)
    if program == "builtin:pytorch":
        needed |= {"torch", "dali"}
    elif program == "builtin:tensorflow":
        needed |= {"tensorflow"} | ({"dali"} if strategy == Strategy.MPI else set())
    return frozenset(needed)


def strategies_without(component: str) -> list[str]:
    """The strategies (with what they run: ``launchers.Launcher.describes``) that do not need
    ``component`` (``launchers.Launcher.needs``)."""
    return [f"{launcher.strategy} ({launcher.describes})" for launcher in launchers.distributed()
            if component not in launcher.needs]


def driver_finding(image_cuda: str, driver_version: str | None, driver_cuda: str | None,
                   compat_cuda: str | None = None, host: str = "") -> tuple[Finding, bool]:
    """The driver against the image's CUDA runtime, and whether the driver can JIT-compile the
    image's PTX (PTX built by a toolkit newer than the driver cannot be: minor-version
    compatibility's limit).

    Args:
        image_cuda: the image's CUDA runtime (``DTC_CUDA_VERSION``: ``12.8``; ``none`` on the CPU
            flavor).
        driver_version: ``nvidia-smi``'s ``driver_version`` (``570.86.15``), ``None`` without GPUs.
        driver_cuda: the newest CUDA the driver supports (``cuDriverGetVersion``: ``12.8``).
        compat_cuda: the CUDA version of forward-compatibility libraries found in the image
            (``/usr/local/cuda/compat``), which a data-center GPU can use with an older driver.

    Returns:
        The finding, and whether PTX from the image's toolkit can be JIT-compiled here.
    """
    if driver_version is None or image_cuda in ("", "none"):
        return Finding("driver", PASS, "no NVIDIA driver in use (CPU host)", host), True
    need, have = version_tuple(image_cuda)[:2], version_tuple(driver_cuda or "0")[:2]
    described = f"driver {driver_version} (supports CUDA {driver_cuda})"
    if have >= need:
        return Finding("driver", PASS, f"{described}: runs the image's CUDA {image_cuda}", host), True
    if compat_cuda and version_tuple(compat_cuda)[:2] >= need:
        return Finding("driver", PASS, f"{described} is older than the image's CUDA {image_cuda}: using the "
                       f"forward-compatibility libraries of CUDA {compat_cuda}", host), True
    minimum = MINOR_COMPATIBILITY_DRIVER.get(need[0])
    if have[:1] == need[:1] and minimum and version_tuple(driver_version) >= version_tuple(minimum):
        return Finding("driver", WARN, f"{described} is older than the image's CUDA {image_cuda}: it runs through "
                       "CUDA minor-version compatibility, but cannot JIT-compile PTX built by CUDA "
                       f"{image_cuda} (a GPU that only has PTX of a component fails: see the archs check)",
                       host), False
    return Finding("driver", FAIL, (
        f"the GPU driver {driver_version} supports CUDA {driver_cuda}, older than this image's CUDA {image_cuda}, "
        f"which needs driver {minimum or 'newer'} or later: run the job on hosts with a newer driver (on SageMaker "
        "the driver comes with the instance type: pick a current family such as g5, g6, p4d or p5; on EC2 an AMI "
        f"with driver >= {minimum or 'the CUDA release notes name'}); no forward-compatibility libraries are in the "
        "image"), host), False


def gpu_findings(gpus: Sequence[Mapping], host: str = "") -> list[Finding]:
    """Each visible GPU allocated memory and ran a kernel with the exact expected result.

    Args:
        gpus: per GPU: ``index``, ``pci_bus_id``, ``name``, ``ok`` (bool), ``error`` (text when
            not ok), ``allocated_mb``.
    """
    findings = []
    for gpu in gpus:
        label = f"GPU {gpu['index']} ({gpu.get('name', '?')}, PCI {gpu.get('pci_bus_id', '?')})"
        if gpu.get("ok"):
            findings.append(Finding("gpu", PASS, f"{label} allocated {gpu.get('allocated_mb', 0)} MB and ran a "
                                    "kernel with the exact result", host))
        else:
            findings.append(Finding("gpu", FAIL, (
                f"{label} on host {host or 'this host'} failed its check: {gpu.get('error') or 'no answer'}; "
                "the instance's GPU is faulty: stop the job and start it again (SageMaker places it on other "
                "hardware), or set sagemaker_preflight=off to run anyway"), host))
    return findings


def arch_findings(capabilities: Mapping[tuple[int, int], str], components: Mapping[str, Iterable[Target]],
                  needed: frozenset[str], ptx_jit_ok: bool = True, host: str = "") -> list[Finding]:
    """Every component against every GPU model of the host.

    Args:
        capabilities: compute capability ``(major, minor)`` -> GPU name, one entry per model.
        components: component (a key of ``COMPONENTS``) -> its compiled targets; a component the
            image lacks is absent.
        needed: ``components_needed``: a gap there fails, elsewhere warns.
        ptx_jit_ok: ``driver_finding``'s second value: whether PTX can be JIT-compiled.
    """
    findings = []
    for capability, gpu_name in sorted(capabilities.items()):
        cc = f"{capability[0]}.{capability[1]}"
        for component, targets in sorted(components.items()):
            targets = set(targets)
            target = runs_on(targets, capability)
            what = f"{COMPONENTS.get(component, component)} [{describe(targets)}]"
            if target is not None and (target.kind == "sass" or ptx_jit_ok):
                how = "its own code" if target.kind == "sass" else "PTX compiled by the driver at start-up"
                findings.append(Finding("archs", PASS, f"{component} runs on {gpu_name} (compute capability {cc}) "
                                        f"with {target} ({how})", host))
                continue
            reason = (f"has no code for {gpu_name} (compute capability {cc}): neither a sm_{capability[0]}x cubin "
                      f"nor PTX at or below {capability[0]}{capability[1]}" if target is None else
                      f"only has PTX ({target}) for {gpu_name} (compute capability {cc}), which this driver "
                      "cannot JIT-compile")
            alternatives = "; ".join(strategies_without(component)) or "none"
            if component in needed:
                extra = (" Horovod does not check its kernel launches (horovod#2230): the all-reduces would "
                         "return wrong sums, not an error." if component == "horovod" else "")
                findings.append(Finding("archs", FAIL, (
                    f"{what} {reason}; this job's strategy needs it.{extra} Strategies that still work on this "
                    f"GPU: {alternatives}; or use an instance type with a GPU the image covers (docs/image.md, "
                    "GPU generations)"), host))
            else:
                findings.append(Finding("archs", WARN, f"{what} {reason}; this job does not need it, but a "
                                        f"script that loads it fails", host))
    return findings


def allreduce_finding(scope: str, ranks: int, exact: bool | None, size_mb: float, seconds: float | None,
                      error: str = "", host: str = "") -> tuple[Finding, dict]:
    """An all-reduce's result and bus bandwidth (nccl-tests' ``busbw = algbw x 2(n-1)/n``,
    NVIDIA/nccl-tests doc/PERFORMANCE.md; algbw = bytes / time).

    Args:
        scope: ``host`` (the host's GPUs, NCCL) or ``hosts`` (one process per host).
        ranks: processes taking part.
        exact: every element equals the expected sum (``None``: it did not complete).
        size_mb: the buffer, MB (10^6 bytes).
        seconds: median time of one all-reduce.

    Returns:
        The finding and its figures (``algbw_gbps``, ``busbw_gbps``, GB/s of 10^9 bytes).
    """
    check = f"allreduce-{scope}"
    if exact is None or seconds is None:
        return Finding(check, FAIL, f"the all-reduce over {ranks} {'GPUs' if scope == 'host' else 'hosts'} did not "
                       f"complete: {error or 'no answer'}; check the network between the hosts (security group "
                       "rules must allow all traffic between the job's instances) or set sagemaker_preflight=off",
                       host), {}
    algbw = size_mb / 1000 / seconds
    figures = {"ranks": ranks, "size_mb": size_mb, "seconds": seconds, "algbw_gbps": round(algbw, 3),
               "busbw_gbps": round(algbw * 2 * (ranks - 1) / ranks, 3)}
    if not exact:
        return Finding(check, FAIL, f"the all-reduce over {ranks} ranks returned wrong values: the collectives of "
                       "this job cannot be trusted; stop the job and start it again on other instances", host), figures
    if ranks == 1:   # NCCL moves nothing for one rank: its algbw is a copy's at best, no figure of the links
        return Finding(check, PASS, f"all-reduce of {size_mb:g} MB on one rank: exact; one rank: no bus traffic, "
                       "no bandwidth to report", host), figures
    return Finding(check, PASS, f"all-reduce of {size_mb:g} MB over {ranks} ranks: exact; algbw "
                   f"{figures['algbw_gbps']:.2f} GB/s, busbw {figures['busbw_gbps']:.2f} GB/s", host), figures


def shm_finding(shm_bytes: int | None, processes_per_host: int, host: str = "") -> Finding:
    """``/dev/shm`` against what the host's training processes need: PyTorch DataLoader workers
    pass batches through it (pytorch/pytorch README, "Docker image": ``--ipc=host`` or
    ``--shm-size``), NCCL's shared-memory transport makes segments there (nccl-tests#166), and
    DALI's and Horovod's host buffers go there. Rule: at least 1 GiB per process (a batch of 256
    224x224 RGB float32 images is 154 MB; a DataLoader holds ``workers x prefetch_factor`` of
    them); Docker's default is 64 MB, SageMaker's is not documented."""
    if shm_bytes is None:
        return Finding("shm", WARN, "/dev/shm is missing: DataLoader workers and NCCL's shared-memory transport "
                       "will fail", host)
    need = processes_per_host * (1 << 30)
    have_mb, need_mb = shm_bytes // (1 << 20), need // (1 << 20)
    if shm_bytes >= need:
        return Finding("shm", PASS, f"/dev/shm has {have_mb} MB (>= {need_mb} MB for {processes_per_host} "
                       "processes)", host)
    return Finding("shm", WARN, f"/dev/shm has {have_mb} MB, under the {need_mb} MB that {processes_per_host} "
                   "processes with DataLoader workers may need (\"bus error\" in a worker); under docker run pass "
                   "--shm-size or --ipc=host, or use fewer DataLoader workers", host)


# EC2 instance types with EFA (docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa.html#efa-instance-types;
# torchx named_resources_aws.py lists the device counts), the sizes SageMaker trains on.
EFA_INSTANCE_TYPES = frozenset({
    "p3dn.24xlarge", "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge",
    "p6-b200.48xlarge", "p6-b300.48xlarge", "g4dn.8xlarge", "g4dn.12xlarge", "g4dn.16xlarge", "g5.8xlarge",
    "g5.12xlarge", "g5.16xlarge", "g5.24xlarge", "g5.48xlarge", "g6e.24xlarge", "g6e.48xlarge",
})


def efa_finding(instance_type: str, hosts: int, devices: Sequence[str], plugin: str | None, has_nccl: bool,
                host: str = "") -> Finding:
    """EFA on a multi-host GPU job: an EFA instance type should show its RDMA devices
    (``/dev/infiniband/uverbs*``), and NCCL needs AWS's OFI plugin to use them; without either it
    uses TCP sockets. Single-host jobs and CPU hosts pass (NCCL stays inside the host)."""
    kind = instance_type.removeprefix("ml.")
    if hosts < 2 or not has_nccl:
        return Finding("efa", PASS, "not needed (one host, or no NCCL)", host)
    cost = ("NCCL will use TCP sockets: cross-host all-reduces at a fraction of EFA's bandwidth (AWS's own "
            "images expect >= 41 GB/s busbw on 2 x p4d with EFA, nccl#527 measured 57 GB/s)")
    if devices and plugin:
        return Finding("efa", PASS, f"{len(devices)} EFA device(s) and NCCL's OFI plugin ({plugin})", host)
    if devices:
        return Finding("efa", WARN, f"{len(devices)} EFA device(s) but no NCCL OFI plugin (libnccl-net.so) on the "
                       f"library path: {cost}; build the image with --build-arg INSTALL_EFA=true", host)
    if kind in EFA_INSTANCE_TYPES:
        return Finding("efa", WARN, f"{instance_type} has EFA but this container sees no EFA device "
                       f"(/dev/infiniband): {cost}; check that the training job runs in a VPC whose security group "
                       "allows all traffic between its instances (SageMaker attaches EFA then)", host)
    return Finding("efa", PASS, f"{instance_type or 'this instance type'} has no EFA: NCCL uses TCP sockets", host)


# A host far below the others: its compute or its link under this share of the others' median.
STRAGGLER_RATIO = 0.5


def straggler_findings(measures: Mapping[str, Mapping[str, float]], ratio: float = STRAGGLER_RATIO) -> list[Finding]:
    """Hosts far below the others (a warning with numbers, never a failure).

    Args:
        measures: host -> ``compute_gflops`` (its slowest device's matrix-product rate) and
            ``link_gbps`` (its exchange with the master host, GB/s; the master has none).
        ratio: a host is named when a figure is under ``ratio`` x the median of the other hosts'.
    """
    findings = []
    for key, unit, what in (("compute_gflops", "GFLOP/s", "computes"), ("link_gbps", "GB/s", "exchanges data")):
        values = {host: m[key] for host, m in measures.items() if m.get(key)}
        for host, value in sorted(values.items()):
            others = [v for h, v in values.items() if h != host]
            if not others:
                continue
            reference = statistics.median(others)
            if value < ratio * reference:
                findings.append(Finding("straggler", WARN, (
                    f"host {host} {what} at {value:.3g} {unit}, {value / reference:.2f}x the other hosts' median "
                    f"({reference:.3g} {unit}): every step waits for it; if it stays slow, stop the job and start "
                    "it again on other instances"), host))
    return findings


def verdict(findings: Iterable[Finding]) -> str:
    """``fail`` when any finding fails, else ``warn`` when any warns, else ``pass``."""
    statuses = {f.status for f in findings}
    return FAIL if FAIL in statuses else WARN if WARN in statuses else PASS


def first_failure(findings: Iterable[Finding]) -> Finding | None:
    return next((f for f in findings if f.status == FAIL), None)
