"""The preflight's rules with injected facts (dtc_entrypoint.preflight.checks), its reading of a
library's compiled GPU architectures (fatbin, on libraries nvcc built: tests/fixtures/fatbin), its
mode setting and the probe's command line."""

import sys
from pathlib import Path

import pytest

from dtc_entrypoint import config as job_config
from dtc_entrypoint.errors import ConfigError
from dtc_entrypoint.launch import LaunchPlan
from dtc_entrypoint.preflight import checks, fatbin, gpu_check, run
from dtc_entrypoint.preflight.fatbin import Target

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "fatbin"
HOROVOD_IMAGE = {Target(80, "sass"), Target(86, "sass"), Target(89, "sass"), Target(90, "sass"), Target(90, "ptx")}


def test_reads_the_architectures_nvcc_compiled_into_a_library():
    assert fatbin.describe(fatbin.targets_of(str(FIXTURES / "sm80.so"))) == "sm_80"
    assert fatbin.targets_of(str(FIXTURES / "sm75-80-90-ptx90.so")) == {
        Target(75, "sass"), Target(80, "sass"), Target(90, "sass"), Target(90, "ptx")}


def test_a_library_without_device_code_has_no_targets_and_a_text_file_is_refused(tmp_path):
    assert fatbin.targets_of(sys.executable) == set()
    (tmp_path / "notes.txt").write_text("not a library")
    with pytest.raises(fatbin.NotAnElfFile):
        fatbin.targets_of(str(tmp_path / "notes.txt"))


@pytest.mark.parametrize("capability, expected", [
    ((7, 0), None),               # V100: no sm_7x cubin at or below 7.0, no PTX at or below 70
    ((7, 5), "sm_75"),            # T4
    ((8, 0), "sm_80"),            # A100
    ((8, 6), "sm_80"),            # A10G: an 8.0 cubin runs on 8.6
    ((8, 9), "sm_80"),            # L4, L40S
    ((9, 0), "sm_90"),            # H100, H200
    ((10, 0), "compute_90"),      # B200: no sm_10x cubin; compute_90 PTX is JIT-compiled
    ((12, 0), "compute_90"),      # RTX PRO 6000
])
def test_which_code_a_gpu_runs(capability, expected):
    targets = fatbin.targets_of(str(FIXTURES / "sm75-80-90-ptx90.so"))
    found = fatbin.runs_on(targets, capability)
    assert (str(found) if found else None) == expected


def test_a_cubin_never_runs_on_another_major_nor_on_an_older_minor():
    assert fatbin.runs_on({Target(86, "sass")}, (8, 0)) is None
    assert fatbin.runs_on({Target(90, "sass")}, (10, 0)) is None
    assert fatbin.runs_on({Target(80, "ptx")}, (7, 5)) is None


def test_driver_newer_than_the_image_passes():
    finding, jit = checks.driver_finding("12.8", "580.95.05", "13.0")
    assert finding.status == "pass" and jit


def test_driver_of_the_same_major_runs_through_minor_version_compatibility_but_cannot_jit():
    finding, jit = checks.driver_finding("12.8", "535.183.01", "12.2", host="algo-1")
    assert finding.status == "warn" and not jit
    assert "minor-version compatibility" in finding.message and "cannot JIT-compile" in finding.message


def test_driver_of_an_older_major_fails_naming_both_versions_and_the_fix():
    finding, jit = checks.driver_finding("12.8", "470.256.02", "11.4", host="algo-2")
    assert finding.status == "fail" and not jit
    assert finding.message.startswith("the GPU driver 470.256.02 supports CUDA 11.4, older than this image's CUDA "
                                      "12.8, which needs driver 525.60.13 or later")
    assert "instance type" in finding.message


def test_forward_compatibility_libraries_make_an_older_driver_pass():
    finding, jit = checks.driver_finding("12.8", "470.256.02", "11.4", compat_cuda="12.8")
    assert finding.status == "pass" and jit and "forward-compatibility" in finding.message


def test_cpu_hosts_have_no_driver_to_check():
    assert checks.driver_finding("none", None, None)[0].status == "pass"
    assert checks.driver_finding("12.8", None, None)[0].status == "pass"


def test_horovod_without_the_gpus_architecture_fails_an_mpi_job_naming_what_still_works():
    findings = checks.arch_findings({(7, 5): "Tesla T4"}, {"horovod": HOROVOD_IMAGE, "torch": {Target(75, "sass")}},
                                    checks.components_needed("mpi", "builtin:pytorch"), host="algo-1")
    failed = [f for f in findings if f.status == "fail"]
    assert [f.message.split(" ")[0:2] for f in failed] == [["Horovod's", "CUDA"]]
    message = failed[0].message
    assert "[sm_80 sm_86 sm_89 sm_90 compute_90] has no code for Tesla T4 (compute capability 7.5)" in message
    assert "horovod#2230" in message and "torch_distributed (PyTorch DDP on torch's own kernels)" in message
    assert [f.status for f in findings if "torch" in f.message.split(" ")[0]] == ["pass"]


def test_a_component_the_strategy_does_not_load_only_warns():
    findings = checks.arch_findings({(7, 5): "Tesla T4"}, {"horovod": HOROVOD_IMAGE},
                                    checks.components_needed("torch_distributed", "train.py"))
    assert [f.status for f in findings] == ["warn"]


def test_ptx_only_components_need_a_driver_that_can_jit():
    components = {"horovod": HOROVOD_IMAGE}
    needed = checks.components_needed("mpi", None)
    ok = checks.arch_findings({(10, 0): "NVIDIA B200"}, components, needed, ptx_jit_ok=True)
    assert [f.status for f in ok] == ["pass"] and "compute_90 (PTX compiled by the driver" in ok[0].message
    old_driver = checks.arch_findings({(10, 0): "NVIDIA B200"}, components, needed, ptx_jit_ok=False)
    assert [f.status for f in old_driver] == ["fail"] and "cannot JIT-compile" in old_driver[0].message


def test_components_each_strategy_needs():
    assert checks.components_needed("mpi", "builtin:tensorflow") == {"horovod", "nccl", "tensorflow", "dali"}
    assert checks.components_needed("torch_distributed", "train.py") == {"torch", "nccl"}
    assert checks.components_needed("parameter_server", "builtin:tensorflow") == {"tensorflow"}
    assert checks.components_needed("single", "train.py") == frozenset()


def test_allreduce_bus_bandwidth_is_nccl_tests_formula():
    finding, figures = checks.allreduce_finding("host", 8, True, 256, 0.01)
    assert finding.status == "pass"
    assert figures["algbw_gbps"] == pytest.approx(25.6) and figures["busbw_gbps"] == pytest.approx(44.8)
    assert checks.allreduce_finding("hosts", 2, False, 8, 0.1)[0].status == "fail"
    failed, figures = checks.allreduce_finding("hosts", 2, None, 8, None, "Timeout", host="algo-1")
    assert failed.status == "fail" and "did not complete: Timeout" in failed.message and figures == {}


def test_one_gpu_has_no_bus_traffic():
    finding, figures = checks.allreduce_finding("host", 1, True, 64, 0.001)
    assert figures["busbw_gbps"] == 0 and "one rank: no bus traffic" in finding.message
    assert "algbw" not in finding.message   # a single GPU's "all-reduce" moves nothing: no figure to read


def test_a_gpu_that_fails_is_named_by_index_and_pci_bus_id():
    findings = checks.gpu_findings([
        {"index": 0, "pci_bus_id": "00000000:10:1C.0", "name": "NVIDIA A100", "ok": True, "allocated_mb": 256},
        {"index": 3, "pci_bus_id": "00000000:A0:1C.0", "name": "NVIDIA A100", "ok": False,
         "error": "RuntimeError: CUDA error: uncorrectable ECC error encountered"}], host="algo-2")
    assert [f.status for f in findings] == ["pass", "fail"]
    assert findings[1].message.startswith("GPU 3 (NVIDIA A100, PCI 00000000:A0:1C.0) on host algo-2 failed its check: "
                                          "RuntimeError: CUDA error: uncorrectable ECC error encountered")


def test_shm_smaller_than_the_processes_need_warns():
    assert checks.shm_finding(64 << 20, 2).status == "warn"
    assert "64 MB, under the 2048 MB" in checks.shm_finding(64 << 20, 2).message
    assert checks.shm_finding(8 << 30, 8).status == "pass"
    assert checks.shm_finding(None, 1).status == "warn"


@pytest.mark.parametrize("instance_type, devices, plugin, status, words", [
    ("ml.p4d.24xlarge", [], None, "warn", "has EFA but this container sees no EFA device"),
    ("ml.p5.48xlarge", ["uverbs0"], None, "warn", "no NCCL OFI plugin"),
    ("ml.p5.48xlarge", ["uverbs0", "uverbs1"], "/opt/amazon/ofi-nccl/lib/libnccl-net.so", "pass", "2 EFA device(s)"),
    ("ml.g5.2xlarge", [], None, "pass", "has no EFA"),
])
def test_efa_on_multi_host_gpu_jobs(instance_type, devices, plugin, status, words):
    finding = checks.efa_finding(instance_type, 2, devices, plugin, has_nccl=True)
    assert finding.status == status and words in finding.message


def test_efa_does_not_matter_on_one_host_or_without_nccl():
    assert checks.efa_finding("ml.p4d.24xlarge", 1, [], None, has_nccl=True).status == "pass"
    assert checks.efa_finding("ml.p4d.24xlarge", 2, [], None, has_nccl=False).status == "pass"


def test_a_host_far_below_the_others_is_named_with_its_numbers():
    findings = checks.straggler_findings({
        "algo-1": {"compute_gflops": 100.0}, "algo-2": {"compute_gflops": 95.0, "link_gbps": 9.0},
        "algo-3": {"compute_gflops": 20.0, "link_gbps": 10.0}, "algo-4": {"compute_gflops": 98.0, "link_gbps": 2.0}})
    assert [(f.host, f.status) for f in findings] == [("algo-3", "warn"), ("algo-4", "warn")]
    assert findings[0].message.startswith("host algo-3 computes at 20 GFLOP/s, 0.20x the other hosts' median "
                                          "(98 GFLOP/s)")
    assert findings[1].message.startswith("host algo-4 exchanges data at 2 GB/s, 0.21x the other hosts' median (9.5")


def test_two_hosts_name_only_the_slow_one_and_even_hosts_none():
    assert [f.host for f in checks.straggler_findings({"a": {"compute_gflops": 10.0},
                                                       "b": {"compute_gflops": 3.0}})] == ["b"]
    assert checks.straggler_findings({"a": {"compute_gflops": 10.0}, "b": {"compute_gflops": 7.0}}) == []


def test_verdict_and_first_failure():
    findings = [checks.Finding("shm", "warn", "w"), checks.Finding("gpu", "fail", "f1"),
                checks.Finding("archs", "fail", "f2")]
    assert checks.verdict(findings) == "fail" and checks.first_failure(findings).message == "f1"
    assert checks.verdict(findings[:1]) == "warn" and checks.verdict([]) == "pass"


def test_mode_hyperparameter_wins_over_the_variable_and_bad_values_are_named():
    assert job_config.preflight_mode({}, {}) == "quick"
    assert job_config.preflight_mode({}, {"DTC_PREFLIGHT": "off"}) == "off"
    assert job_config.preflight_mode({"sagemaker_preflight": "full"}, {"DTC_PREFLIGHT": "off"}) == "full"
    with pytest.raises(ConfigError, match=r"^hyperparameter sagemaker_preflight='deep' is not a preflight mode: "
                                          r"use one of off, quick, full$"):
        job_config.preflight_mode({"sagemaker_preflight": "deep"}, {})
    with pytest.raises(ConfigError, match=r"^environment variable DTC_PREFLIGHT='yes'"):
        job_config.preflight_mode({}, {"DTC_PREFLIGHT": "yes"})


def _job(tmp_path, **changes) -> tuple[job_config.JobConfig, LaunchPlan]:
    config = job_config.JobConfig(
        base_dir=str(tmp_path), current_host="algo-2", hosts=("algo-1", "algo-2"),
        distribution_hosts=("algo-1", "algo-2"), master_host="algo-1", network_interface="eth0", num_gpus=0,
        num_cpus=2, program="builtin:pytorch", submit_dir="", code_dir=str(tmp_path / "code"),
        user_hyperparameters={}, framework_parameters={}, mpi=job_config.MpiConfig(True, 2), strategy="mpi",
        python="/usr/bin/python3", preflight="full", instance_type="ml.p4d.24xlarge", **changes)
    plan = LaunchPlan(strategy="mpi", role="mpi-worker", argv=(), env={}, workdir="/", hosts=("algo-1", "algo-2"),
                      master_host="algo-1", processes_per_host=2, world_size=4, ranks=(2, 3))
    return config, plan


def test_the_probes_command_line_is_a_function_of_the_job(tmp_path):
    config, plan = _job(tmp_path)
    argv = run.probe_argv(config, plan, "/tmp/work", {"DTC_PREFLIGHT_WAIT_S": "90"})
    assert argv[:3] == ["/usr/bin/python3", "-m", "dtc_entrypoint.preflight.probe"]
    options = dict(zip(argv[3::2], argv[4::2], strict=True))
    assert options == {"--mode": "full", "--host": "algo-2", "--hosts": "algo-1,algo-2", "--master": "algo-1",
                       "--port": "2227", "--strategy": "mpi", "--program": "builtin:pytorch",
                       "--processes-per-host": "2", "--instance-type": "ml.p4d.24xlarge", "--wait-s": "90",
                       "--gpu-timeout-s": "600", "--workdir": "/tmp/work",
                       "--out": str(tmp_path / "output" / "data" / "preflight.json")}
    env = run.probe_env(config, plan, {"PATH": "/bin"})
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "eth0"


@pytest.mark.parametrize("environ, words", [
    ({"DTC_PREFLIGHT_WAIT_S": "soon"}, "DTC_PREFLIGHT_WAIT_S='soon' is not a positive number of seconds"),
    ({"DTC_PREFLIGHT_GPU_TIMEOUT_S": "0"}, "DTC_PREFLIGHT_GPU_TIMEOUT_S='0' is not a positive number"),
    ({"DTC_PREFLIGHT_FACTS": "{gpus"}, "DTC_PREFLIGHT_FACTS is not JSON"),
    ({"DTC_PREFLIGHT_FACTS": "[1]"}, "DTC_PREFLIGHT_FACTS must be a JSON object of facts, got list"),
])
def test_bad_preflight_variables_are_named(tmp_path, environ, words):
    config, plan = _job(tmp_path)
    with pytest.raises(ConfigError) as error:
        run.probe_argv(config, plan, "/tmp/work", environ)
    assert str(error.value).startswith(words)


def test_the_off_mode_runs_nothing(tmp_path):
    config, plan = _job(tmp_path, )
    config = job_config.JobConfig(**{**config.__dict__, "preflight": "off"})
    assert run.run(config, plan, {"DTC_PREFLIGHT_FACTS": "not even json"}) is None


def test_gpu_checks_report_says_whether_it_ran_in_the_image(monkeypatch):
    """The image's ENV names its flavor, torch and CUDA; outside it (the preflight's modules run on a
    GPU machine from a clone) the report says so and which CUDA it took as the image's."""
    record = {"date": "2026-11-29T19:04:59Z", "verdict": "pass", "seconds": 12.9, "summaries": {}}
    gpus = ["GPU 0: NVIDIA H200 (UUID: GPU-0)"]
    monkeypatch.setenv("FLAVOR", "gpu")
    monkeypatch.setenv("DTC_TORCH_VERSION", "2.10.0")
    monkeypatch.setenv("DTC_CUDA_VERSION", "12.8")
    assert "- image: gpu flavor, torch 2.10.0, CUDA 12.8\n" in gpu_check.report(gpus, record, None)
    monkeypatch.delenv("FLAVOR")
    text = gpu_check.report(gpus, record, None)
    assert "- image: none (outside the image; the image's CUDA taken as 12.8)\n" in text
    assert text.startswith("# gpu-check, 2026-11-29T19:04:59Z\n") and "**pass** in 12.9 s" in text
