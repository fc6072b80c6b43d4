"""System metrics sampled through a job on the reporting rank's host (#19 item 5): CPU
utilization, host memory, network throughput and, where ``nvidia-smi`` runs, each GPU's
utilization and memory. SageMaker Debugger's profiler, which users relied on for these, is closed
to new customers and ends in 2027 (SageMaker Developer Guide, "Amazon SageMaker Debugger"
availability and "Profiler availability change").

``SystemSampler`` runs a daemon thread that takes a ``Sample`` every ``interval_s`` seconds and a
last one when it stops; ``dtc_train.observe.Observer`` writes them as TensorBoard scalars
(``SCALAR_TAGS``, GPU tags per index) and plots them in the end-of-training report.

Sources: psutil (``cpu_percent``: every CPU of the machine, 0-100; ``virtual_memory``;
``net_io_counters(pernic=True)`` without the loopback interface, which carries one host's own
ranks' traffic, not the job's network) and ``nvidia-smi --query-gpu`` (utilization.gpu in %,
memory.used in MiB). They read the machine's ``/proc`` and driver: on SageMaker the container
has the instance to itself; a container on a shared machine sees the whole machine.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psutil

log = logging.getLogger(__name__)

GPU_QUERY = ("nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used", "--format=csv,noheader,nounits")
SCALAR_TAGS = {"cpu_percent": "system/cpu_percent", "memory_used_gb": "system/memory_used_gb",
               "memory_percent": "system/memory_percent",
               "network_sent_mb_per_s": "system/network_sent_mb_per_s",
               "network_received_mb_per_s": "system/network_received_mb_per_s"}
GB = 1e9
MB = 1e6
MIB = 1 << 20
GpuReading = tuple[int, float, float]   # (index, utilization %, memory used in 1e9 bytes)


@dataclass(frozen=True)
class Sample:
    """The machine over the interval that ended at ``elapsed_s``.

    Attributes:
        elapsed_s: seconds since the sampler started (the TensorBoard step, rounded).
        wall_time: Unix time of the sample (seconds).
        cpu_percent: mean utilization of every CPU over the interval, 0-100.
        memory_used_gb: host memory in use (psutil's ``total - available``), 1e9 bytes.
        memory_percent: the same as a percentage of the total.
        network_sent_mb_per_s / network_received_mb_per_s: bytes over every interface but the
            loopback, 1e6 bytes per second over the interval.
        gpus: per GPU: (index, utilization %, memory used in 1e9 bytes); empty without ``nvidia-smi``.
    """

    elapsed_s: float
    wall_time: float
    cpu_percent: float
    memory_used_gb: float
    memory_percent: float
    network_sent_mb_per_s: float
    network_received_mb_per_s: float
    gpus: tuple[GpuReading, ...] = ()

    def scalars(self) -> dict[str, float]:
        """TensorBoard tag -> value: ``SCALAR_TAGS`` and ``system/gpu<i>_utilization_percent``,
        ``system/gpu<i>_memory_used_gb`` per GPU."""
        values = {tag: float(getattr(self, key)) for key, tag in SCALAR_TAGS.items()}
        for index, utilization, memory_gb in self.gpus:
            values[f"system/gpu{index}_utilization_percent"] = utilization
            values[f"system/gpu{index}_memory_used_gb"] = memory_gb
        return values


def parse_gpu_query(text: str) -> tuple[GpuReading, ...]:
    """``GPU_QUERY``'s output, one ``index, utilization %, memory MiB`` line per GPU (e.g.
    ``0, 87, 30512``), as (index, utilization %, memory used in 1e9 bytes). Raises ``ValueError``
    quoting a line that is not of that form (e.g. ``[N/A]`` for a value the GPU does not report)."""
    gpus = []
    for line in text.strip().splitlines():
        try:
            index, utilization, memory_mib = (part.strip() for part in line.split(","))
            gpus.append((int(index), float(utilization), float(memory_mib) * MIB / GB))
        except ValueError as error:
            raise ValueError(f"{' '.join(GPU_QUERY)} printed {line!r}, not 'index, %, MiB'") from error
    return tuple(gpus)


def query_gpus() -> tuple[GpuReading, ...]:
    """Each GPU's reading (``parse_gpu_query``) from ``nvidia-smi``; empty when it is not installed.
    Raises ``RuntimeError`` naming the command when it fails, ``ValueError`` when its output
    cannot be read."""
    if shutil.which(GPU_QUERY[0]) is None:
        return ()
    done = subprocess.run(list(GPU_QUERY), capture_output=True, text=True, timeout=10)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(GPU_QUERY)} exited with code {done.returncode}: {done.stderr.strip()[:200]}")
    return parse_gpu_query(done.stdout)


def _network_bytes() -> tuple[int, int]:
    """(sent, received) bytes since boot over every interface but the loopback."""
    sent = received = 0
    for name, counters in psutil.net_io_counters(pernic=True).items():
        if name != "lo":
            sent += counters.bytes_sent
            received += counters.bytes_recv
    return sent, received


class SystemSampler:
    """Samples the machine every ``interval_s`` seconds on a daemon thread, from ``start()`` to
    ``stop()``; the caller takes the samples with ``drain()`` (those not taken yet) or reads
    ``samples`` (all of them).

    Args:
        interval_s: seconds between samples (> 0).
        gpu_query: returns each GPU's (index, utilization %, memory GB); ``query_gpus`` by default.
            When it raises, the error is logged once and GPUs are not sampled again.
    """

    def __init__(self, interval_s: float, gpu_query: Callable[[], Sequence[GpuReading]] = query_gpus):
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.interval_s = interval_s
        self._gpu_query: Callable[[], Sequence[GpuReading]] | None = gpu_query
        self.samples: list[Sample] = []
        self._drained = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = self._last = 0.0
        self._network = (0, 0)

    def start(self) -> SystemSampler:
        """Starts the thread, once its counters are primed. Returns self."""
        primed = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(primed,), name="system-metrics", daemon=True)
        self._thread.start()
        primed.wait(timeout=30)
        return self

    def _run(self, primed: threading.Event) -> None:
        # psutil's CPU percentage is relative to the same thread's previous call (psutil >= 5.9.6
        # keeps one baseline per thread), so this thread primes it and takes every sample
        psutil.cpu_percent(interval=None)
        self._start = self._last = time.monotonic()
        self._network = _network_bytes()
        primed.set()
        while not self._stopping.wait(self.interval_s):
            self._take()
        self._take()     # the interval since the previous sample

    def _take(self) -> None:
        now = time.monotonic()
        seconds = max(now - self._last, 1e-6)
        network = _network_bytes()
        memory = psutil.virtual_memory()
        gpus: Sequence[GpuReading] = ()
        if self._gpu_query is not None:
            try:
                gpus = self._gpu_query()
            except (RuntimeError, ValueError, OSError, subprocess.SubprocessError) as error:
                log.warning("system metrics: GPUs are not sampled from now on: %s", error)
                self._gpu_query = None
        sample = Sample(
            elapsed_s=now - self._start, wall_time=time.time(), cpu_percent=psutil.cpu_percent(interval=None),
            memory_used_gb=(memory.total - memory.available) / GB, memory_percent=memory.percent,
            network_sent_mb_per_s=(network[0] - self._network[0]) / MB / seconds,
            network_received_mb_per_s=(network[1] - self._network[1]) / MB / seconds, gpus=tuple(gpus))
        with self._lock:
            self.samples.append(sample)
        self._last, self._network = now, network

    def drain(self) -> list[Sample]:
        """The samples taken since the previous ``drain()``, oldest first."""
        with self._lock:
            fresh = self.samples[self._drained:]
            self._drained = len(self.samples)
        return fresh

    def stop(self) -> list[Sample]:
        """Stops the thread, which takes a last sample (the interval since the previous one).
        Returns the samples not drained yet."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        return self.drain()


def summarize(samples: Sequence[Sample], interval_s: float) -> dict:
    """The report's ``system`` section: the sampling, and mean and max of each series (GPU series
    per index). Empty samples give ``{"samples": 0}``."""
    if not samples:
        return {"samples": 0}
    series: dict[str, list[float]] = {}
    for sample in samples:
        for tag, value in sample.scalars().items():
            series.setdefault(tag.removeprefix("system/"), []).append(value)
    return {"samples": len(samples), "interval_s": interval_s, "seconds": samples[-1].elapsed_s,
            "series": {name: {"mean": sum(values) / len(values), "max": max(values)}
                       for name, values in series.items()}}
