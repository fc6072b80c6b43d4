"""Unit: the system-metric sampler (dtc_train.system_metrics) on this machine's real psutil
counters; only the GPU reading is given (no nvidia-smi here: the GPU suite reads the real one)."""

import time

import psutil
import pytest

from dtc_train import system_metrics
from dtc_train.system_metrics import SCALAR_TAGS, SystemSampler


def wait_for_samples(sampler: SystemSampler, count: int, burn: bool = False, timeout_s: float = 30) -> None:
    """Until the sampler has taken ``count`` samples (a loaded machine may delay its thread),
    keeping one core busy when ``burn``."""
    deadline = time.monotonic() + timeout_s
    while len(sampler.samples) < count:
        assert time.monotonic() < deadline, f"{len(sampler.samples)} samples in {timeout_s} s"
        if burn:
            sum(i * i for i in range(1000))
        else:
            time.sleep(0.01)


def test_samples_every_interval_and_once_more_at_the_stop():
    sampler = SystemSampler(0.05, gpu_query=lambda: ()).start()
    wait_for_samples(sampler, 4, burn=True)
    early = sampler.drain()
    time.sleep(0.02)
    rest = sampler.stop()
    samples = early + rest
    assert len(early) >= 4 and len(rest) >= 1 and sampler.samples == samples
    assert sampler.drain() == []                                    # each sample is drained once
    elapsed = [s.elapsed_s for s in samples]
    assert elapsed == sorted(elapsed) and elapsed[-1] >= 0.2
    # one core busy on this machine's cores: the mean over every CPU is above idle and at most 100
    assert all(0 <= s.cpu_percent <= 100 for s in samples)
    assert max(s.cpu_percent for s in early) >= 100 / psutil.cpu_count() * 0.5
    memory = psutil.virtual_memory()
    assert samples[-1].memory_used_gb == pytest.approx((memory.total - memory.available) / 1e9, rel=0.1)
    assert 0 < samples[-1].memory_percent < 100
    assert all(s.network_sent_mb_per_s >= 0 and s.network_received_mb_per_s >= 0 for s in samples)
    assert set(samples[0].scalars()) == set(SCALAR_TAGS.values())   # no GPU: no GPU tags


def test_each_gpu_gets_its_own_tags_and_a_failing_query_is_dropped_after_one_warning(caplog):
    readings = [[(0, 87.0, 30.5), (1, 12.0, 2.25)]]
    calls = []

    def gpu_query():
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("nvidia-smi exited with code 9: NVIDIA-SMI has failed")
        return readings[0]

    sampler = SystemSampler(0.05, gpu_query=gpu_query).start()
    wait_for_samples(sampler, 3)
    samples = sampler.stop()
    scalars = samples[0].scalars()
    assert scalars["system/gpu0_utilization_percent"] == 87.0 and scalars["system/gpu1_memory_used_gb"] == 2.25
    assert set(scalars) == set(SCALAR_TAGS.values()) | {
        "system/gpu0_utilization_percent", "system/gpu0_memory_used_gb",
        "system/gpu1_utilization_percent", "system/gpu1_memory_used_gb"}
    assert len(calls) == 2 and all(s.gpus == () for s in samples[1:])
    assert [r.message for r in caplog.records].count(
        "system metrics: GPUs are not sampled from now on: nvidia-smi exited with code 9: NVIDIA-SMI has failed") == 1


def test_nvidia_smis_csv_is_read_in_percent_and_gigabytes():
    assert system_metrics.parse_gpu_query("0, 87, 30512\n1, 0, 0\n") == ((0, 87.0, 30512 * 2**20 / 1e9), (1, 0.0, 0.0))
    assert system_metrics.parse_gpu_query("") == ()
    with pytest.raises(ValueError, match=r"printed '0, \[N/A\], 1024', not 'index, %, MiB'"):
        system_metrics.parse_gpu_query("0, [N/A], 1024")


def test_the_summary_gives_each_series_mean_and_max():
    samples = [system_metrics.Sample(10.0 * i, 0.0, cpu, 4.0 + i, 50.0, 0.5, 1.5, ((0, 10.0 * i, 1.0),))
               for i, cpu in enumerate((20.0, 60.0), start=1)]
    summary = system_metrics.summarize(samples, 10.0)
    assert summary["samples"] == 2 and summary["interval_s"] == 10.0 and summary["seconds"] == 20.0
    assert summary["series"]["cpu_percent"] == {"mean": 40.0, "max": 60.0}
    assert summary["series"]["memory_used_gb"] == {"mean": 5.5, "max": 6.0}
    assert summary["series"]["gpu0_utilization_percent"] == {"mean": 15.0, "max": 20.0}
    assert system_metrics.summarize([], 10.0) == {"samples": 0}


def test_a_non_positive_interval_is_refused():
    with pytest.raises(ValueError, match="interval_s must be positive, got 0"):
        SystemSampler(0)
