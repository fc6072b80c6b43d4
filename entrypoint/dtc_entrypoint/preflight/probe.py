"""The preflight's measurements on one host: ``python -m dtc_entrypoint.preflight.probe``.

``train`` runs this program on every host before the job's own program (``preflight.run``
builds its command line), because it imports PyTorch, which the dispatcher never does. It:

1. reads this host's facts: the GPUs ``nvidia-smi`` lists (index, PCI bus id, name, compute
   capability, driver), the newest CUDA the driver supports (``cuDriverGetVersion``), the
   compiled architectures of every component with device code (the ``.nv_fatbin`` sections of
   torch's, Horovod's, NCCL's, TensorFlow's and DALI's libraries: ``library_targets``), the size
   of ``/dev/shm`` and the EFA devices and NCCL network plugin;
2. on a GPU host, starts one process per GPU: each allocates memory, runs a kernel whose result
   it checks exactly, times a bf16 matrix product, and then all of them run an NCCL all-reduce
   with exact expected values, timed (bus bandwidth as nccl-tests defines it);
3. decides this host's findings (``checks``) and publishes them through a ``TCPStore`` on the
   master host (``--port``), waits for every other host's, and, when no host failed, runs one
   all-reduce across the hosts (NCCL from each host's first GPU, Gloo on CPU hosts) with exact
   values and then a timed exchange between the master and each host in turn; a host far slower
   than the others is named (``checks.straggler_findings``);
4. writes the whole record as JSON to ``--out`` (every host's facts and findings, the job's
   all-reduce, the verdict) and exits 0; a non-zero exit means the probe itself broke.

A host that never reports within ``--wait-s`` is named by the others; a GPU that does not answer
within ``--gpu-timeout-s`` is named by index and PCI bus id.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import glob
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from datetime import timedelta

from .. import fabric
from . import checks
from .fatbin import NotAnElfFile, Target, targets_of

# per mode: MB per GPU allocated, the all-reduces' sizes (MB), timed iterations, the matrix size
SIZES = {
    "quick": {"alloc_mb": 256, "host_mb": 64, "hosts_mb": 8, "iterations": 5, "gemm": 4096},
    "full": {"alloc_mb": 4096, "host_mb": 256, "hosts_mb": 64, "iterations": 20, "gemm": 8192},
}
FACTS_VARIABLE = "DTC_PREFLIGHT_FACTS"
LIBRARIES = {   # component -> (package, globs of its libraries with device code, relative to the package)
    "torch": ("torch", ("lib/libtorch_cuda*.so",)),
    "horovod": ("horovod", ("*/mpi_lib*.so",)),
    "nccl": ("nvidia.nccl", ("lib/libnccl.so*",)),
    "tensorflow": ("tensorflow", ("libtensorflow_*.so*", "python/_pywrap_tensorflow_internal.so")),
    "dali": ("nvidia.dali", ("libdali*.so",)),
}


def log(message: str) -> None:
    print(f"[preflight] {message}", file=sys.stderr, flush=True)


def nvidia_gpus() -> list[dict] | None:
    """The GPUs ``nvidia-smi`` lists, or ``None`` where there is no NVIDIA driver."""
    if shutil.which("nvidia-smi") is None:
        return None
    fields = "index,pci.bus_id,name,compute_cap,driver_version,memory.total"
    done = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, timeout=60)
    rows = [[c.strip() for c in line.split(",")] for line in done.stdout.splitlines() if line.strip()]
    if done.returncode != 0 or not rows:
        return None
    return [{"index": int(r[0]), "pci_bus_id": r[1], "name": r[2], "compute_capability": r[3],
             "driver_version": r[4], "memory_mb": int(float(r[5]))} for r in rows]


def driver_cuda_version() -> str | None:
    """The newest CUDA the loaded driver supports (``cuDriverGetVersion``: 12080 -> ``12.8``)."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    version = ctypes.c_int()
    if libcuda.cuDriverGetVersion(ctypes.byref(version)) != 0:
        return None
    return f"{version.value // 1000}.{version.value % 1000 // 10}"


def compat_cuda_version(image_cuda: str) -> str | None:
    """The image's CUDA version when NVIDIA's forward-compatibility libraries for it are installed
    (``/usr/local/cuda/compat/libcuda.so.1``, as ``cuda-compat-12-8`` installs them)."""
    return image_cuda if os.path.exists("/usr/local/cuda/compat/libcuda.so.1") else None


def library_targets() -> dict[str, dict]:
    """Component -> ``{"files": [...], "targets": [[arch, kind], ...]}`` for each library with device
    code in this environment (the union over its files)."""
    found = {}
    for component, (package, patterns) in LIBRARIES.items():
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.submodule_search_locations:
            continue
        targets, files = set(), []
        paths = sorted({p for root in spec.submodule_search_locations for pattern in patterns
                        for p in glob.glob(os.path.join(root, pattern))})
        for path in paths:
            try:
                own = targets_of(path)
            except (OSError, NotAnElfFile):
                continue
            if own:
                targets |= own
                files.append(path)
        if files:
            found[component] = {"files": files, "targets": sorted([t.arch, t.kind] for t in targets)}
    return found


def shm_bytes() -> int | None:
    try:
        stats = os.statvfs("/dev/shm")
    except OSError:
        return None
    return stats.f_frsize * stats.f_blocks


def cpu_gflops(window_s: float = 0.3, windows: int = 3) -> float:
    """This host's float32 matrix-product rate on one CPU core (GFLOP/s, 512 x 512 products): its
    compute figure for the straggler check on CPU hosts. The best of ``windows`` windows of
    ``window_s`` seconds each, on one thread; torch's thread count is restored afterwards.

    One thread, because with torch's threads (one per core) the figure measured OpenMP's threads
    waiting on each other whenever something else ran on the host, not the host: on 2 cores beside
    6 busy containers one thread read 24 to 35 GFLOP/s and two read 4 to 16, while a container
    limited to 0.05 CPU read 3 to 6 and 1 to 3 (2026-12-08, 15 and 6 windows each), so with two
    threads a throttled host could pass for a healthy one (``tests/cluster/test_preflight.py``).
    Windows of 0.3 s span three or more of the kernel's 100-ms CFS periods, so a host held to a
    CPU quota (a container's ``--cpus``, a burstable instance out of credits) is slow in each
    window; the best of them keeps a moment's burst of other work from naming a healthy host.
    """
    import torch  # noqa: PLC0415  # the probe's own process

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = torch.randn(512, 512)
        a @ a
        best = 0.0
        for _ in range(windows):
            count, start = 0, time.perf_counter()
            while time.perf_counter() - start < window_s:
                a @ a
                count += 1
            best = max(best, 2 * 512 ** 3 * count / (time.perf_counter() - start) / 1e9)
        return best
    finally:
        torch.set_num_threads(threads)


def gpu_worker(index: int, count: int, init_file: str, sizes: dict, queue, go, stop) -> None:
    """One GPU's checks, in its own process: memory, a kernel, a bf16 matrix product, then (once
    the parent says every GPU passed) its part of an NCCL all-reduce over the host's GPUs."""
    import torch  # noqa: PLC0415  # the probe's own process
    import torch.distributed as dist  # noqa: PLC0415

    result = {"index": index, "ok": False}
    try:
        torch.cuda.set_device(index)
        block = torch.empty(sizes["alloc_mb"] * (1 << 20) // 4, device="cuda")
        block.fill_(3.0)
        values = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
        result["ok"] = bool(torch.equal((values * 2 + block[: 1 << 20]).cpu(),
                                        torch.arange(1 << 20, dtype=torch.float32) * 2 + 3))
        result["allocated_mb"] = sizes["alloc_mb"]
        if not result["ok"]:
            result["error"] = "a kernel's result differed from the expected values"
        del block
        n = sizes["gemm"]
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        a @ a
        torch.cuda.synchronize()
        start, reps = time.perf_counter(), 5
        for _ in range(reps):
            a @ a
        torch.cuda.synchronize()
        result["compute_gflops"] = 2 * n ** 3 * reps / (time.perf_counter() - start) / 1e9
        del a
    except Exception as error:   # reported as this GPU's failure
        result["error"] = f"{type(error).__name__}: {error}".splitlines()[0]
    queue.put(("gpu", result))
    while not (go.wait(0.1) or stop.is_set()):
        pass
    if stop.is_set():
        return
    figures = {"index": index}
    try:
        dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=index, world_size=count,
                                timeout=timedelta(seconds=120))
        elements = int(sizes["host_mb"] * 1e6) // 4
        buffer = torch.full((elements,), float(index + 1), device="cuda")
        dist.all_reduce(buffer)
        figures["exact"] = bool(torch.all(buffer == count * (count + 1) / 2).item())
        zeros = torch.zeros(elements, device="cuda")   # timed on zeros: the values stay put
        dist.all_reduce(zeros)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(sizes["iterations"]):
            dist.all_reduce(zeros)
        torch.cuda.synchronize()
        figures["seconds"] = (time.perf_counter() - start) / sizes["iterations"]
        dist.destroy_process_group()
    except Exception as error:
        figures["error"] = f"{type(error).__name__}: {error}".splitlines()[0]
    queue.put(("allreduce", figures))


def check_gpus(gpus: list[dict], sizes: dict, timeout_s: float, workdir: str) -> tuple[list[dict], dict]:
    """Runs ``gpu_worker`` on every GPU; returns the GPUs with their results and the host's
    all-reduce figures (``exact``, ``seconds``, ``error``)."""
    import torch.multiprocessing as mp  # noqa: PLC0415  # the probe's own process

    context = mp.get_context("spawn")
    queue, go, stop = context.Queue(), context.Event(), context.Event()
    init_file = os.path.join(workdir, "nccl-init")
    workers = [context.Process(target=gpu_worker, args=(g["index"], len(gpus), init_file, sizes, queue, go, stop),
                               daemon=True) for g in gpus]
    for worker in workers:
        worker.start()
    deadline = time.monotonic() + timeout_s
    results: dict[str, dict[int, dict]] = {"gpu": {}, "allreduce": {}}

    def collect(kind: str) -> None:
        while len(results[kind]) < len(gpus) and time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                got_kind, result = queue.get(timeout=0.5)
                results[got_kind][result["index"]] = result

    collect("gpu")
    answered = results["gpu"]
    checked = []
    for gpu in gpus:
        mine = answered.get(gpu["index"], {"ok": False, "error": f"no answer within {timeout_s:.0f} s"})
        checked.append({**gpu, **{k: v for k, v in mine.items() if k != "index"}})
    if all(g["ok"] for g in checked):
        go.set()
        collect("allreduce")
    else:
        stop.set()
    for worker in workers:
        worker.join(timeout=max(0.0, deadline - time.monotonic()) + 5)
        if worker.is_alive():
            worker.kill()
    figures = list(results["allreduce"].values())
    host = {"ranks": len(gpus)}
    if not go.is_set():
        host["error"] = "not run: a GPU failed its check"
    elif len(figures) < len(gpus):
        host["error"] = f"{len(gpus) - len(figures)} GPU(s) did not finish the all-reduce within {timeout_s:.0f} s"
    elif any("error" in f for f in figures):
        host["error"] = next(f["error"] for f in figures if "error" in f)
    else:
        host["exact"] = all(f["exact"] for f in figures)
        host["seconds"] = max(f["seconds"] for f in figures)
    return checked, host


def local_facts(args, sizes: dict) -> dict:
    """Everything this host measures alone, then ``$DTC_PREFLIGHT_FACTS`` (a JSON object) over it:
    facts of hardware this host does not have (a T4, an old driver), to rehearse what the preflight
    says there."""
    facts = measured_facts(args, sizes)
    overrides = json.loads(os.environ.get(FACTS_VARIABLE) or "{}")
    if overrides:
        log(f"facts replaced from {FACTS_VARIABLE}: {', '.join(sorted(overrides))}")
        facts.update(overrides)
    return facts


def measured_facts(args, sizes: dict) -> dict:
    """Everything this host measures alone."""
    gpus = nvidia_gpus() or []
    facts = {"host": args.host, "gpus": gpus, "image_cuda": args.image_cuda, "shm_bytes": shm_bytes(),
             "efa_devices": fabric.efa_devices(),
             "nccl_plugin": None, "components": {}, "driver_version": gpus[0]["driver_version"] if gpus else None}
    ldconfig = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout if shutil.which("ldconfig") \
        else ""
    facts["nccl_plugin"] = fabric.find_plugin(os.environ, ldconfig)
    if not gpus:
        if args.hosts.count(",") > 0:   # a compute figure for the straggler check
            facts["compute_gflops"] = cpu_gflops()
        return facts
    facts["driver_cuda"] = driver_cuda_version()
    facts["compat_cuda"] = compat_cuda_version(args.image_cuda)
    import torch  # noqa: PLC0415  # the probe's own process

    facts["torch"] = torch.__version__
    facts["components"] = library_targets()
    checked, host = check_gpus(gpus, sizes, args.gpu_timeout_s, args.workdir)
    facts["gpus"], facts["allreduce_host"] = checked, host
    rates = [g["compute_gflops"] for g in checked if g.get("compute_gflops")]
    if rates:
        facts["compute_gflops"] = min(rates)
    return facts


def local_findings(facts: dict, args) -> list[checks.Finding]:
    host = facts["host"]
    findings = []
    gpus = facts["gpus"]
    driver, ptx_jit_ok = checks.driver_finding(facts["image_cuda"], facts.get("driver_version"),
                                               facts.get("driver_cuda"), facts.get("compat_cuda"), host)
    findings.append(driver)
    if gpus:
        findings += checks.gpu_findings(gpus, host)
        capabilities = {tuple(int(p) for p in g["compute_capability"].split(".")): g["name"] for g in gpus}
        components = {name: [Target(arch, kind) for arch, kind in c["targets"]]
                      for name, c in facts["components"].items()}
        findings += checks.arch_findings(capabilities, components,
                                         checks.components_needed(args.strategy, args.program), ptx_jit_ok, host)
        figures = facts.get("allreduce_host")
        if figures is not None and figures.get("error") != "not run: a GPU failed its check":
            finding, numbers = checks.allreduce_finding("host", len(gpus), figures.get("exact"), SIZES[args.mode][
                "host_mb"], figures.get("seconds"), figures.get("error", ""), host)
            facts["allreduce_host"].update(numbers)
            findings.append(finding)
    findings.append(checks.shm_finding(facts["shm_bytes"], args.processes_per_host, host))
    findings.append(checks.efa_finding(args.instance_type, len(args.hosts.split(",")), facts["efa_devices"],
                                       facts["nccl_plugin"], bool(gpus) and "nccl" in facts["components"], host))
    return findings


def across_hosts(args, summary: dict, sizes: dict) -> dict:
    """Publishes this host's summary, gathers the others' and, when none failed, runs the job-wide
    all-reduce and the master's exchange with each host. Returns ``{"summaries", "allreduce",
    "links", "findings"}``."""
    import torch.distributed as dist  # noqa: PLC0415  # the probe's own process

    hosts = args.hosts.split(",")
    rank = hosts.index(args.host)
    result = {"summaries": {}, "allreduce": {}, "links": {}, "findings": []}
    try:
        store = dist.TCPStore(args.master, args.port, world_size=len(hosts), is_master=rank == 0,
                              timeout=timedelta(seconds=args.wait_s), wait_for_workers=False)
    except Exception as error:   # the master's port taken, or the master never came
        result["findings"].append(checks.Finding("rendezvous", checks.FAIL, (
            f"host {args.host} could not {'open' if rank == 0 else 'reach'} the preflight's store on the master host "
            f"{args.master} port {args.port} within {args.wait_s:.0f} s ({type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''}): check the master's log and the network between "
            "the hosts; DTC_PREFLIGHT_PORT sets the port, DTC_PREFLIGHT_WAIT_S the wait"), args.host))
        return result
    store.set(f"summary/{args.host}", json.dumps(summary))
    missing = list(hosts)
    try:
        deadline = time.monotonic() + args.wait_s
        while missing and time.monotonic() < deadline:
            missing = [h for h in missing if not store.check([f"summary/{h}"])]
            if missing:
                time.sleep(0.2)
        if missing:
            result["findings"].append(checks.Finding("rendezvous", checks.FAIL, (
                f"host {', '.join(missing)} did not report its preflight within {args.wait_s:.0f} s (its container "
                f"did not start, or cannot reach the master host's port {args.port}): check that host's log, or "
                "raise DTC_PREFLIGHT_WAIT_S"), args.host))
            return result
        for host in hosts:
            result["summaries"][host] = json.loads(store.get(f"summary/{host}"))
        if not any(checks.verdict(checks.Finding(**f) for f in s["findings"]) == checks.FAIL
                   for s in result["summaries"].values()):   # a host's own failure ends the job: no collective
            collectives(args, rank, hosts, store, summary, sizes, result)
    finally:   # the store lives in the master's process: it stays until every host that came has read
        with contextlib.suppress(Exception):
            store.set(f"done/{args.host}", "1")
        if rank == 0:
            with contextlib.suppress(Exception):
                store.wait([f"done/{h}" for h in hosts if h not in missing], timedelta(seconds=30))
    return result


def collectives(args, rank: int, hosts: list[str], store, summary: dict, sizes: dict, result: dict) -> None:
    """The job-wide all-reduce (exact values, timed; the time is the slowest rank's, all-reduced
    with MAX, so every host records the same figures), the master's exchange with each host in
    turn (timed on the master, shared through the store), and the straggler check; adds their
    figures and findings to ``result``."""
    import torch  # noqa: PLC0415  # the probe's own process
    import torch.distributed as dist  # noqa: PLC0415

    on_gpu = bool(summary["facts"]["gpus"])
    if on_gpu:
        torch.cuda.set_device(0)
    device = "cuda" if on_gpu else "cpu"
    elements = int(sizes["hosts_mb"] * 1e6) // 4

    def synchronize() -> None:
        if on_gpu:
            torch.cuda.synchronize()

    try:
        dist.init_process_group("nccl" if on_gpu else "gloo", store=dist.PrefixStore("collectives", store),
                                rank=rank, world_size=len(hosts), timeout=timedelta(seconds=args.wait_s))
        buffer = torch.full((elements,), float(rank + 1), device=device)
        dist.all_reduce(buffer)
        exact = bool(torch.all(buffer == len(hosts) * (len(hosts) + 1) / 2).item())
        zeros = torch.zeros(elements, device=device)   # timed on zeros: the values stay put
        dist.all_reduce(zeros)
        synchronize()
        start = time.perf_counter()
        for _ in range(sizes["iterations"]):
            dist.all_reduce(zeros)
        synchronize()
        # one figure for the job, the same in every host's record: the slowest rank's time per
        # all-reduce (the collective is done when its last rank is)
        seconds = torch.tensor([(time.perf_counter() - start) / sizes["iterations"]], dtype=torch.float64,
                               device=device)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        seconds = float(seconds.item())
        finding, result["allreduce"] = checks.allreduce_finding("hosts", len(hosts), exact, sizes["hosts_mb"], seconds)
        result["findings"].append(finding)
        links = {}
        for peer in range(1, len(hosts)):   # 3 round trips each, the first a warm-up
            times = []
            for _ in range(3):
                dist.barrier()
                start = time.perf_counter()
                if rank == 0:
                    dist.send(zeros, peer)
                    dist.recv(zeros, peer)
                elif rank == peer:
                    dist.recv(zeros, 0)
                    dist.send(zeros, 0)
                synchronize()
                times.append(time.perf_counter() - start)
            links[hosts[peer]] = round(2 * sizes["hosts_mb"] / 1000 / statistics.median(times[1:]), 3)
        if rank == 0:
            store.set("links", json.dumps(links))
        result["links"] = json.loads(store.get("links"))
        dist.destroy_process_group()
    except Exception as error:
        finding, _ = checks.allreduce_finding("hosts", len(hosts), None, sizes["hosts_mb"], None,
                                              f"{type(error).__name__}: {error}".splitlines()[0])
        result["findings"].append(finding)
        return
    measures = {h: {"compute_gflops": s["facts"].get("compute_gflops") or 0.0,
                    "link_gbps": result["links"].get(h, 0.0)} for h, s in result["summaries"].items()}
    result["findings"] += checks.straggler_findings(measures)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=sorted(SIZES), default="quick")
    parser.add_argument("--host", required=True)
    parser.add_argument("--hosts", required=True, help="every host of the job, master first, comma-separated")
    parser.add_argument("--master", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--strategy", default="single")
    parser.add_argument("--program", default="")
    parser.add_argument("--processes-per-host", type=int, default=1)
    parser.add_argument("--instance-type", default="")
    parser.add_argument("--image-cuda", default=os.environ.get("DTC_CUDA_VERSION", "none"))
    parser.add_argument("--wait-s", type=float, default=600)
    parser.add_argument("--gpu-timeout-s", type=float, default=120)
    parser.add_argument("--workdir", required=True, help="a private directory for the GPUs' rendezvous file")
    parser.add_argument("--out", required=True)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.monotonic()
    sizes = SIZES[args.mode]
    facts = local_facts(args, sizes)
    findings = local_findings(facts, args)
    summary = {"facts": facts, "findings": [f.to_dict() for f in findings],
               "seconds": round(time.monotonic() - start, 3)}
    log(f"host {args.host}: {checks.verdict(findings)} after {summary['seconds']:.1f} s")
    record = {"mode": args.mode, "host": args.host, "hosts": args.hosts.split(","), "master": args.master,
              "summaries": {args.host: summary}, "allreduce": {}, "links": {}, "job_findings": []}
    if len(record["hosts"]) > 1:
        job = across_hosts(args, summary, sizes)
        record["summaries"].update(job["summaries"])
        record.update(allreduce=job["allreduce"], links=job["links"],
                      job_findings=[f.to_dict() for f in job["findings"]])
    every = [checks.Finding(**f) for s in record["summaries"].values() for f in s["findings"]]
    every += [checks.Finding(**f) for f in record["job_findings"]]
    failure = checks.first_failure(every)
    record.update(verdict=checks.verdict(every), first_failure=failure.to_dict() if failure else None,
                  seconds=round(time.monotonic() - start, 3),
                  date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".tmp", "w") as handle:
        json.dump(record, handle, indent=2, default=str)
    os.replace(args.out + ".tmp", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
