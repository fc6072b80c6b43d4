"""The preflight on this host: through `train` (record, log, the failure contract) and its probe as
every host runs it, two hosts' probes meeting on this machine's loopback (a host that never comes,
a host whose facts fail). Two-host jobs in containers: tests/cluster/test_preflight.py."""

import json
import re
import subprocess
import sys
import time

from helpers import BIN, copy_programs, digits_job, free_port, read_json, run_train

PROBE = [str(BIN / "python"), "-m", "dtc_entrypoint.preflight.probe"]
OLD_DRIVER = {"image_cuda": "12.8", "driver_version": "470.256.02", "driver_cuda": "11.4",
              "gpus": [{"index": 0, "pci_bus_id": "00000000:00:1E.0", "name": "Tesla T4", "compute_capability": "7.5",
                        "ok": True, "allocated_mb": 256}]}


def test_train_runs_the_preflight_first_and_records_it(make_job, source_dir):
    copy_programs(source_dir, "echo_argv.py")
    root = make_job({"sagemaker_program": "echo_argv.py", "sagemaker_submit_directory": str(source_dir),
                     "sagemaker_preflight": "quick"})
    result = run_train(root)
    assert result.returncode == 0, result.output
    record = read_json(root / "output" / "data" / "preflight.json")
    assert record["verdict"] == "pass" and record["hosts"] == ["algo-1"] and record["mode"] == "quick"
    checked = {f["check"]: f["status"] for f in record["summaries"]["algo-1"]["findings"]}
    assert checked == {"driver": "pass", "shm": "pass", "efa": "pass"}
    log = result.output
    assert f"preflight (quick) on 1 host(s): pass in {record['seconds']:.1f} s" in log
    assert (root / "output" / "data" / "argv-single.json").exists()


def test_a_failing_check_stops_the_job_before_the_program_with_the_failure_named(make_job, source_dir):
    copy_programs(source_dir, "echo_argv.py")
    root = make_job({"sagemaker_program": "echo_argv.py", "sagemaker_submit_directory": str(source_dir)})
    failing_gpu = {**OLD_DRIVER, "driver_version": "580.95.05", "driver_cuda": "13.0",
                   "gpus": [{**OLD_DRIVER["gpus"][0], "ok": False,
                             "error": "RuntimeError: CUDA error: uncorrectable ECC error encountered"}]}
    result = run_train(root, env={"DTC_PREFLIGHT": "quick", "DTC_PREFLIGHT_FACTS": json.dumps(failing_gpu)})
    assert result.returncode == 4, result.output
    assert result.failure.splitlines()[0] == (
        "preflight failed on host algo-1: GPU 0 (Tesla T4, PCI 00000000:00:1E.0) on host algo-1 failed its check: "
        "RuntimeError: CUDA error: uncorrectable ECC error encountered; the instance's GPU is faulty: stop the job and "
        "start it again (SageMaker places it on other hardware), or set sagemaker_preflight=off to run anyway")
    assert "preflight.json" in result.failure
    assert not (root / "output" / "data" / "argv-single.json").exists()   # the program never ran


def test_bad_preflight_settings_are_configuration_errors(make_job, source_dir):
    copy_programs(source_dir, "echo_argv.py")
    root = make_job({"sagemaker_program": "echo_argv.py", "sagemaker_submit_directory": str(source_dir),
                     "sagemaker_preflight": "thorough"})
    result = run_train(root)
    assert result.returncode == 2
    assert result.failure.splitlines()[0] == ("hyperparameter sagemaker_preflight='thorough' is not a preflight "
                                              "mode: use one of off, quick, full")


def probe(tmp_path, host: str, port: int, wait_s: float, facts: dict | None = None) -> subprocess.Popen:
    env = {"PATH": "/usr/bin:/bin", "DTC_PREFLIGHT_FACTS": json.dumps(facts or {})}
    (tmp_path / host).mkdir()
    return subprocess.Popen([*PROBE, "--host", host, "--hosts", "algo-1,algo-2", "--master", "127.0.0.1", "--port",
                             str(port), "--wait-s", str(wait_s), "--workdir", str(tmp_path / host), "--out",
                             str(tmp_path / f"{host}.json")], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def test_two_hosts_check_each_other_and_both_name_the_host_that_failed(tmp_path):
    port = free_port()
    start = time.monotonic()
    hosts = {"algo-1": probe(tmp_path, "algo-1", port, 60), "algo-2": probe(tmp_path, "algo-2", port, 60, OLD_DRIVER)}
    outputs = {host: process.communicate(timeout=120)[0] for host, process in hosts.items()}
    assert all(process.returncode == 0 for process in hosts.values()), outputs
    for host in hosts:
        record = read_json(tmp_path / f"{host}.json")
        assert record["verdict"] == "fail"
        assert record["first_failure"]["host"] == "algo-2"
        assert record["first_failure"]["message"].startswith("the GPU driver 470.256.02 supports CUDA 11.4")
        assert set(record["summaries"]) == {"algo-1", "algo-2"}
        assert record["allreduce"] == {}   # a host failed: no collective
    print(f"two probes, one failing: {time.monotonic() - start:.1f} s")


def test_a_host_that_never_comes_is_named_within_the_wait(tmp_path):
    port = free_port()
    start = time.monotonic()
    alone = probe(tmp_path, "algo-1", port, 5)
    output = alone.communicate(timeout=120)[0]
    seconds = time.monotonic() - start
    assert alone.returncode == 0, output
    record = read_json(tmp_path / "algo-1.json")
    assert record["verdict"] == "fail"
    assert record["first_failure"]["message"].startswith("host algo-2 did not report its preflight within 5 s")
    assert seconds < 60, seconds   # the wait, the import of torch and the store's teardown; no hang


def test_the_probe_alone_is_cheap_on_a_cpu_host(tmp_path):
    started = time.monotonic()
    done = subprocess.run([*PROBE, "--host", "algo-1", "--hosts", "algo-1", "--master", "algo-1", "--port", "1",
                           "--workdir", str(tmp_path), "--out", str(tmp_path / "p.json")], capture_output=True,
                          text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    record = read_json(tmp_path / "p.json")
    assert record["verdict"] == "pass" and record["summaries"]["algo-1"]["facts"]["gpus"] == []
    print(f"one CPU host: probe {record['seconds']} s, process {time.monotonic() - started:.2f} s ({sys.platform})")


def test_the_built_in_trainers_report_carries_the_preflight(digits_channels, tmp_path):
    root = digits_job(tmp_path, digits_channels, {"sagemaker_program": "builtin:pytorch", "epochs": 1,
                                                  "sagemaker_preflight": "quick"})
    result = run_train(root)
    assert result.returncode == 0, result.output[-3000:]
    report = root / "output" / "data" / "report"
    summary = read_json(report / "summary.json")["preflight"]
    assert summary["mode"] == "quick" and summary["verdict"] == "pass" and summary["hosts"] == 1, summary
    assert summary["not_passed"] == []
    assert re.search(r"^Preflight \(quick, docs/preflight.md\): pass in [0-9.]+ s on 1 host\(s\)\.$",
                     (report / "summary.md").read_text(), re.M)


def test_gpu_checks_throughput_part_trains_through_the_built_in_trainer(tmp_path):
    """gpu-check's throughput check (its model and size made small, and in fp32: this machine trains
    on its CPU, which emulates bf16, and took 137 s of a CI run's 30-minute tier in it, 2026-11-29;
    bf16 through the trainer: test_precision.py): photograph crops, the trainer with no
    distribution, images/s per epoch."""
    from dtc_entrypoint.preflight import gpu_check

    speed = gpu_check.throughput(str(tmp_path), epochs=2, batch_size=4, model="shufflenet_v2_x0_5", image_size=32,
                                 precision="fp32")
    assert speed["exit_code"] == 0, speed["tail"]
    assert [epoch for epoch, _ in speed["epochs"]] == [1, 2] and speed["images_per_s"] > 0, speed


def test_a_cpu_hosts_compute_figure_is_one_cores_best_window_and_leaves_torchs_threads_as_they_were():
    program = ("import json, time, torch\n"
               "from dtc_entrypoint.preflight.probe import cpu_gflops\n"
               "torch.set_num_threads(2)\n"
               "start = time.perf_counter()\n"
               "figure = cpu_gflops(window_s=0.2, windows=3)\n"
               "print(json.dumps({'gflops': figure, 'seconds': time.perf_counter() - start,\n"
               "                  'threads': torch.get_num_threads()}))\n")
    done = subprocess.run([str(BIN / "python"), "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    measured = json.loads(done.stdout.splitlines()[-1])
    assert measured["threads"] == 2 and measured["gflops"] > 0 and measured["seconds"] >= 3 * 0.2, measured
