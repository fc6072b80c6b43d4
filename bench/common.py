"""What every benchmark shares: noise control (one pinned thread per rank), timing statistics,
the nccl-tests bandwidth formulas, the machine's description and the JSON records.

Runs inside the image (the benchmarks are mounted at /bench) and on the host (bench/run.py).
Standard library only, so the launcher-side code never imports a framework.
"""

import json
import os
import platform
import statistics
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

LOAD_FLAG_THRESHOLD = 0.5   # 1-minute load average above which a run is flagged (not refused)
BUSY_FLAG_THRESHOLD = 0.10  # fraction of all CPUs busy, measured over a few seconds, for "not idle"


def pin_to_one_core(local_rank: int) -> int:
    """Pins this process to one CPU (``local_rank`` modulo the CPUs it may use) and limits the
    math libraries to one thread; returns the CPU. Call before importing torch or TensorFlow."""
    allowed = sorted(os.sched_getaffinity(0))
    cpu = allowed[local_rank % len(allowed)]
    os.sched_setaffinity(0, {cpu})
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TF_NUM_INTRAOP_THREADS",
                 "TF_NUM_INTEROP_THREADS"):
        os.environ[name] = "1"
    return cpu


def local_rank_from_env() -> int:
    """The launcher's local rank (mpirun, torchrun, horovodrun), 0 when launched alone."""
    for name in ("OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK", "HOROVOD_LOCAL_RANK"):
        if name in os.environ:
            return int(os.environ[name])
    return 0


def algbw_gbps(size_bytes: int, time_s: float) -> float:
    """Algorithm bandwidth, GB/s (10^9 bytes per second): bytes / time (nccl-tests PERFORMANCE.md)."""
    return size_bytes / time_s / 1e9


def busbw_gbps(size_bytes: int, time_s: float, ranks: int) -> float:
    """Bus bandwidth of an allreduce, GB/s: algbw * 2(n-1)/n (nccl-tests PERFORMANCE.md), the figure
    comparable across rank counts and with the hardware's link bandwidth."""
    return algbw_gbps(size_bytes, time_s) * 2 * (ranks - 1) / ranks


def summary(values: Sequence[float]) -> dict[str, float]:
    """Median, interquartile range (q3 - q1, inclusive quartiles), min and max of the repeats."""
    ordered = sorted(values)
    if len(ordered) == 1:
        q1 = q3 = ordered[0]
    else:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    return {"median": statistics.median(ordered), "iqr": q3 - q1, "min": ordered[0], "max": ordered[-1],
            "repeats": len(ordered)}


def load_average() -> float:
    """The 1-minute load average (/proc/loadavg)."""
    return os.getloadavg()[0]


def cpu_busy_fraction(seconds: float = 2.0) -> float:
    """Fraction of the machine's CPU time spent busy (not idle or iowait) over ``seconds``, from
    /proc/stat (machine-wide, also inside a container). Unlike the load average, it does not lag
    behind a job that just ended."""
    def sample() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        idle = fields[3] + fields[4]
        return sum(fields) - idle, sum(fields)

    busy0, total0 = sample()
    time.sleep(seconds)
    busy1, total1 = sample()
    return (busy1 - busy0) / max(1, total1 - total0)


def wait_for_idle(max_wait_s: float = 180.0) -> float:
    """Waits (up to ``max_wait_s``) until the machine is idle: at most ``BUSY_FLAG_THRESHOLD`` of
    the CPUs busy over 2 s and a 1-minute load average at most ``LOAD_FLAG_THRESHOLD`` (the load
    average decays for a minute or two after a build ends). Returns the last busy fraction."""
    deadline = time.monotonic() + max_wait_s
    busy = cpu_busy_fraction()
    while (busy > BUSY_FLAG_THRESHOLD or load_average() > LOAD_FLAG_THRESHOLD) and time.monotonic() < deadline:
        busy = cpu_busy_fraction()
    return busy


def machine() -> dict:
    """CPU model, cores, memory, kernel: what a reader needs to compare numbers across machines."""
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    mem_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                  if line.startswith("MemTotal"))
    return {"cpu": model, "cores": os.cpu_count(), "memory_gib": round(mem_kb / 2**20, 1),
            "kernel": platform.release(), "hostname": platform.node()}


def timed(fn, iterations: int, warmup: int) -> list[float]:
    """Runs ``fn`` ``warmup`` times, then returns the wall time (s) of each of ``iterations`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def write_records(path: str, records: Iterable[dict]) -> None:
    """Appends one JSON object per line to ``path`` (the per-run raw records)."""
    with open(path, "a") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")


def read_records(path: str) -> list[dict]:
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]
