"""The preflight as ``train`` runs it: the probe's command line (a pure function of the job's
configuration and plan), its run with a time limit, the record in
``<base>/output/data/preflight.json`` (SageMaker uploads ``output/data`` with the job's output),
the log, and the verdict.

A failing preflight raises ``PreflightError`` whose first line names the host and what to change:
``train`` writes it to ``output/failure`` and exits with ``EXIT_PREFLIGHT_ERROR`` on every host
(each host's probe reads every other host's findings, so all of them stop, naming the same cause).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping

from ..config import JobConfig
from ..errors import ConfigError, PreflightError
from ..plan import LaunchPlan, network_env

log = logging.getLogger("dtc")

RECORD_NAME = "preflight.json"
WAIT_VARIABLE = "DTC_PREFLIGHT_WAIT_S"          # how long a host waits for the others' preflight
GPU_TIMEOUT_VARIABLE = "DTC_PREFLIGHT_GPU_TIMEOUT_S"
FACTS_VARIABLE = "DTC_PREFLIGHT_FACTS"          # JSON facts over the measured ones (probe.local_facts)
DEFAULT_WAIT_S = 600.0                           # as long as the MPI master waits for its workers
DEFAULT_GPU_TIMEOUT_S = {"quick": 120.0, "full": 600.0}


def _seconds(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name, "")
    try:
        value = float(raw) if raw else default
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ConfigError(f"{name}={raw!r} is not a positive number of seconds", key=name)
    return value


def record_path(config: JobConfig) -> str:
    return os.path.join(config.output_dir, "data", RECORD_NAME)


def probe_argv(config: JobConfig, plan: LaunchPlan, workdir: str, environ: Mapping[str, str]) -> list[str]:
    """The probe's command for this host (``python -m dtc_entrypoint.preflight.probe ...``).

    Raises:
        ConfigError: ``DTC_PREFLIGHT_WAIT_S`` or ``DTC_PREFLIGHT_GPU_TIMEOUT_S`` is not a positive number,
            or ``DTC_PREFLIGHT_FACTS`` is not a JSON object.
    """
    try:
        facts = json.loads(environ.get(FACTS_VARIABLE) or "{}")
    except ValueError as error:
        raise ConfigError(f"{FACTS_VARIABLE} is not JSON: {error}", key=FACTS_VARIABLE) from None
    if not isinstance(facts, dict):
        raise ConfigError(f"{FACTS_VARIABLE} must be a JSON object of facts, got {type(facts).__name__}",
                          key=FACTS_VARIABLE)
    wait_s = _seconds(environ, WAIT_VARIABLE, DEFAULT_WAIT_S)
    gpu_timeout_s = _seconds(environ, GPU_TIMEOUT_VARIABLE, DEFAULT_GPU_TIMEOUT_S[config.preflight])
    return [config.python, "-m", "dtc_entrypoint.preflight.probe", "--mode", config.preflight,
            "--host", config.current_host, "--hosts", ",".join(plan.hosts), "--master", plan.master_host,
            "--port", str(config.ports["preflight"]), "--strategy", plan.strategy, "--program", config.program or "",
            "--processes-per-host", str(plan.processes_per_host), "--instance-type", config.instance_type,
            "--wait-s", f"{wait_s:g}", "--gpu-timeout-s", f"{gpu_timeout_s:g}", "--workdir", workdir,
            "--out", record_path(config)]


def probe_env(config: JobConfig, plan: LaunchPlan, environ: Mapping[str, str]) -> dict[str, str]:
    """The probe's environment: this one, with the job's network pinning (NCCL and Gloo use the
    interface the job's processes will use) and this package importable."""
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    pythonpath = os.pathsep.join(p for p in (package_root, environ.get("PYTHONPATH", "")) if p)
    return {**environ, **network_env(config), "PYTHONPATH": pythonpath, "PYTHONUNBUFFERED": "1",
            "TF_CPP_MIN_LOG_LEVEL": environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}


def summarize(record: Mapping) -> list[str]:
    """The log lines of a record: the verdict and time, then each warning and failure."""
    lines = [f"preflight ({record['mode']}) on {len(record['hosts'])} host(s): {record['verdict']} in "
             f"{record['seconds']:.1f} s"]
    figures = record.get("allreduce") or {}
    if figures:
        lines.append(f"preflight: all-reduce over the hosts: {figures['size_mb']:g} MB, algbw "
                     f"{figures['algbw_gbps']:.2f} GB/s, busbw {figures['busbw_gbps']:.2f} GB/s")
    for host, summary in sorted(record["summaries"].items()):
        local = summary["facts"].get("allreduce_host") or {}
        if "algbw_gbps" in local:
            lines.append(f"preflight: host {host}: all-reduce over its {local['ranks']} GPU(s): "
                         f"{local['size_mb']:g} MB, algbw {local['algbw_gbps']:.2f} GB/s, "
                         f"busbw {local['busbw_gbps']:.2f} GB/s")
        for finding in summary["findings"]:
            if finding["status"] != "pass":
                lines.append(f"preflight {finding['status']}: {finding['message']}")
    for finding in record.get("job_findings", []):
        if finding["status"] != "pass":
            lines.append(f"preflight {finding['status']}: {finding['message']}")
    return lines


def run(config: JobConfig, plan: LaunchPlan, environ: Mapping[str, str] = os.environ) -> dict | None:
    """Runs this host's probe and returns its record (``None`` when the preflight is off).

    Raises:
        PreflightError: a host failed a check (the first failure's message, with the host named),
            or the probe broke or ran past its time.
        ConfigError: a preflight variable is invalid.
    """
    if config.preflight == "off":
        log.info("preflight off (sagemaker_preflight / DTC_PREFLIGHT)")
        return None
    path = record_path(config)
    if os.path.exists(path):
        os.remove(path)
    with tempfile.TemporaryDirectory(prefix="dtc-preflight-") as workdir:
        argv = probe_argv(config, plan, workdir, environ)
        limit_s = float(argv[argv.index("--wait-s") + 1]) + float(argv[argv.index("--gpu-timeout-s") + 1]) + 120
        start = time.monotonic()
        try:
            done = subprocess.run(argv, env=probe_env(config, plan, environ), stdin=subprocess.DEVNULL,
                                  stdout=sys.stderr, stderr=subprocess.PIPE, text=True, timeout=limit_s)
        except subprocess.TimeoutExpired:
            raise PreflightError(f"the preflight on host {config.current_host} did not finish within {limit_s:.0f} s: "
                                 "set sagemaker_preflight=off to skip it, and report the hang (its log is above)"
                                 ) from None
    if done.stderr:
        sys.stderr.write(done.stderr)
    if done.returncode != 0 or not os.path.exists(path):
        tail = "\n".join(done.stderr.strip().splitlines()[-20:])
        raise PreflightError(f"the preflight itself failed on host {config.current_host} (exit code "
                             f"{done.returncode} after {time.monotonic() - start:.1f} s): set sagemaker_preflight=off "
                             f"to skip it, and report this\n\n{tail}")
    with open(path) as handle:
        record = json.load(handle)
    for line in summarize(record):
        (log.warning if line.startswith("preflight warn") else log.error if line.startswith("preflight fail")
         else log.info)("%s", line)
    failure = record.get("first_failure")
    if failure:
        host = failure.get("host") or config.current_host
        raise PreflightError(f"preflight failed on host {host}: {failure['message']}\n\n"
                             f"Every finding, of every host: {path} (uploaded with the job's output). Set "
                             "sagemaker_preflight=off to skip the preflight.\n")
    return record
