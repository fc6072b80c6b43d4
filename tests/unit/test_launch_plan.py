"""Unit: launch plans are pure functions of the job config (`train --plan` prints them:
tests/integration/test_strategy_plans.py)."""

import json
from dataclasses import replace

import pytest

from dtc_entrypoint import config as job_config
from dtc_entrypoint import launch
from dtc_entrypoint.config import MpiConfig, mpi_config, relocate
from dtc_entrypoint.errors import ConfigError
from dtc_entrypoint.program import Program
from helpers import PLAIN_SCRIPT as SCRIPT
from helpers import config_for as job


def test_single_process_plan_runs_python_with_user_args_and_no_shell():
    plan = launch.build(job(), SCRIPT)
    assert plan.strategy == "single" and plan.role == "launcher"
    assert plan.argv == ("/usr/bin/python3", "/opt/ml/code/train.py", "--epochs", "3", "--name", "a b")
    assert plan.env["PYTHONPATH"] == "/opt/ml/code"
    assert json.loads(plan.env["SM_USER_ARGS"]) == ["--epochs", "3", "--name", "a b"]


def test_one_host_mpi_plan_uses_localhost_and_mpi4py():
    plan = launch.build(job(mpi=MpiConfig(enabled=True, processes_per_host=2)), SCRIPT)
    argv = list(plan.argv)
    assert argv[:5] == ["mpirun", "--host", "localhost:2", "-np", "2"]
    tail = argv[argv.index("/usr/bin/python3"):]
    assert tail == ["/usr/bin/python3", "-m", "dtc_entrypoint.rank_shim",   # lets a stopped rank finish saving
                    "/usr/bin/python3", "-m", "mpi4py", "/opt/ml/code/train.py", "--epochs", "3", "--name", "a b"]
    assert "btl_tcp_if_include" not in argv          # one host: no interface pinning
    assert (plan.world_size, plan.processes_per_host) == (2, 2)
    assert argv[argv.index("mpi_yield_when_idle") + 1] == "1"     # a CPU host: waiting ranks yield the core


def test_ranks_on_gpu_hosts_keep_openmpis_polling_and_a_users_setting_wins():
    gpu = launch.build(job(mpi=MpiConfig(enabled=True, processes_per_host=2), num_gpus=2), SCRIPT)
    assert "mpi_yield_when_idle" not in gpu.argv
    mine = launch.build(job(mpi=MpiConfig(enabled=True, processes_per_host=2,
                                          custom_options="-mca mpi_yield_when_idle 0")), SCRIPT)
    argv = list(mine.argv)
    assert argv.count("mpi_yield_when_idle") == 1 and argv[argv.index("mpi_yield_when_idle") + 1] == "0"


def test_multi_host_mpi_plan_on_master_lists_hosts_and_pins_the_interface():
    config = job(hosts=("algo-2", "algo-1"), current="algo-1",
                 mpi=MpiConfig(enabled=True, processes_per_host=4))
    plan = launch.build(config, SCRIPT)
    argv = list(plan.argv)
    assert argv[:5] == ["mpirun", "--host", "algo-1:4,algo-2:4", "-np", "8"]
    for name in ("btl_tcp_if_include", "oob_tcp_if_include"):
        assert argv[argv.index(name) + 1] == "eth0"
    assert plan.env["NCCL_SOCKET_IFNAME"] == "eth0"
    forwarded = {argv[i + 1] for i, a in enumerate(argv) if a == "-x"}
    assert {"SM_HOSTS", "SM_MODEL_DIR", "PATH", "PYTHONPATH", "SM_USER_ARGS"} <= forwarded
    assert "SM_CURRENT_HOST" not in forwarded          # toolkit #158: each host keeps its own


def test_multi_host_mpi_plan_on_a_worker_starts_nothing():
    config = job(hosts=("algo-1", "algo-2"), current="algo-2", mpi=MpiConfig(enabled=True, processes_per_host=2))
    plan = launch.build(config, SCRIPT)
    assert (plan.role, plan.argv, plan.master_host) == ("mpi-worker", (), "algo-1")


def test_custom_mpi_options_replace_defaults_instead_of_appending():
    options = "-mca btl_vader_single_copy_mechanism cma -bind-to core -x FOO='a b' --NCCL_DEBUG WARN"
    plan = launch.build(job(mpi=MpiConfig(enabled=True, processes_per_host=2, custom_options=options)), SCRIPT)
    argv = list(plan.argv)
    assert argv.count("btl_vader_single_copy_mechanism") == 1
    assert argv[argv.index("btl_vader_single_copy_mechanism") + 1] == "cma"
    assert argv.count("-bind-to") == 1 and argv[argv.index("-bind-to") + 1] == "core"
    assert "FOO=a b" in argv                           # split like a shell, passed as one argument
    assert plan.env["NCCL_DEBUG"] == "WARN" and "--NCCL_DEBUG" not in argv


def test_user_host_np_and_interface_exclusion_replace_ours():
    config = job(hosts=("algo-1", "algo-2"), mpi=MpiConfig(
        enabled=True, processes_per_host=2, custom_options="-np 3 -H algo-1:3 -mca btl_tcp_if_exclude lo"))
    argv = list(launch.build(config, SCRIPT).argv)
    assert argv.count("-np") == 1 and argv[argv.index("-np") + 1] == "3"
    assert "--host" not in argv and argv[argv.index("-H") + 1] == "algo-1:3"
    assert "btl_tcp_if_include" not in argv and "oob_tcp_if_include" in argv


def test_np_override_and_shell_command_programs():
    command = Program("train.sh", False, ("/opt/ml/code/train.sh",), "/opt/ml/code")
    plan = launch.build(job(mpi=MpiConfig(enabled=True, processes_per_host=2, num_processes=3)), command)
    argv = list(plan.argv)
    assert argv[argv.index("-np") + 1] == "3"
    assert argv[-5:] == ["/opt/ml/code/train.sh", "--epochs", "3", "--name", "a b"]


def test_mpi_config_defaults_to_one_process_per_gpu():
    assert mpi_config({"sagemaker_mpi_enabled": "True"}, num_gpus=8).processes_per_host == 8
    assert mpi_config({"sagemaker_mpi_enabled": True}, num_gpus=0).processes_per_host == 1
    assert mpi_config({"sagemaker_mpi_enabled": "False"}, num_gpus=0).enabled is False
    with pytest.raises(ConfigError, match="sagemaker_mpi_custom_mpi_options"):
        mpi_config({"sagemaker_mpi_custom_mpi_options": ["-x"]}, num_gpus=0)


def test_plans_are_pure():
    config = job(mpi=MpiConfig(enabled=True, processes_per_host=2))
    assert launch.build(config, SCRIPT) == launch.build(config, SCRIPT)


def test_container_paths_follow_a_relocated_base_dir():
    assert relocate("/opt/ml/code", "/tmp/job/opt/ml") == "/tmp/job/opt/ml/code"
    assert relocate("/opt/ml/input/data/code/sourcedir.tar.gz", "/x") == "/x/input/data/code/sourcedir.tar.gz"
    assert relocate("s3://bucket/sourcedir.tar.gz", "/x") == "s3://bucket/sourcedir.tar.gz"
    assert relocate("/opt/ml/code", "/opt/ml") == "/opt/ml/code"
    assert relocate("/opt/mlx/code", "/x") == "/opt/mlx/code"


def test_a_warm_pool_cache_gives_every_process_its_cache_directories_unless_the_job_sets_them():
    from dtc_entrypoint.config import warm_pool_cache_env

    cache = "/opt/ml/sagemaker/warmpoolcache"
    assert warm_pool_cache_env({}) == {}
    assert warm_pool_cache_env({"SAGEMAKER_MANAGED_WARMPOOL_CACHE_DIRECTORY": cache, "HF_HOME": "/data/hf"}) == {
        "PIP_CACHE_DIR": f"{cache}/pip", "TORCH_EXTENSIONS_DIR": f"{cache}/torch_extensions",
        "TRITON_CACHE_DIR": f"{cache}/triton"}   # the job's own HF_HOME is left alone
    caches = {"PIP_CACHE_DIR": f"{cache}/pip", "TRITON_CACHE_DIR": f"{cache}/triton"}
    for config in (job(cache_env=caches), job(mpi=MpiConfig(enabled=True, processes_per_host=2), cache_env=caches)):
        plan = launch.build(config, SCRIPT)
        assert {name: plan.env[name] for name in caches} == caches
        if plan.strategy == "mpi":   # forwarded to the ranks mpirun starts
            assert all(plan.argv[plan.argv.index(name) - 1] == "-x" for name in caches)


def test_mpi_plans_have_horovods_stall_inspector_warn_within_the_jobs_stall_timeout():
    def timeout(framework, environ):
        return job_config.seconds_setting(framework, environ, job_config.STALL_TIMEOUT,
                                          job_config.STALL_TIMEOUT_VARIABLE, job_config.DEFAULT_STALL_TIMEOUT_S)

    assert timeout({}, {}) == 1800
    assert timeout({}, {"DTC_STALL_TIMEOUT_S": "0"}) == 0
    assert timeout({"sagemaker_stall_timeout_s": 90}, {"DTC_STALL_TIMEOUT_S": "0"}) == 90
    for framework, environ in (({"sagemaker_stall_timeout_s": "soon"}, {}), ({}, {"DTC_STALL_TIMEOUT_S": "-5"})):
        with pytest.raises(ConfigError, match=r"(sagemaker_stall_timeout_s='soon'|DTC_STALL_TIMEOUT_S='-5') is not "
                                              r"a whole number of seconds >= 0 \(0 turns the stall check off\)"):
            timeout(framework, environ)
    with pytest.raises(ConfigError, match=r"^environment variable DTC_STALL_STARTUP_GRACE_S='1m' is not a whole "
                                          r"number of seconds >= 0$"):
        job_config.seconds_setting({}, {"DTC_STALL_STARTUP_GRACE_S": "1m"}, job_config.STALL_STARTUP_GRACE,
                                   job_config.STALL_STARTUP_GRACE_VARIABLE, 600)

    mpi = MpiConfig(enabled=True, processes_per_host=2)
    env = launch.build(job(mpi=mpi, stall_timeout_s=600), SCRIPT).env   # warnings only: train's rule ends it
    assert env["HOROVOD_STALL_CHECK_TIME_SECONDS"] == "60" and "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS" not in env
    assert launch.build(job(mpi=mpi, stall_timeout_s=8), SCRIPT).env["HOROVOD_STALL_CHECK_TIME_SECONDS"] == "2"
    off = launch.build(job(mpi=mpi, stall_timeout_s=0), SCRIPT).env
    own = launch.build(job(mpi=mpi, inherited_names=("PATH", "HOROVOD_STALL_CHECK_TIME_SECONDS")), SCRIPT).env
    assert not {k for k in {**off, **own} if k.startswith("HOROVOD_STALL")}   # off, or the user's own settings


def test_stall_action_is_end_unless_dump_is_asked_for_and_bad_values_are_named():
    assert job_config.stall_action({}, {}) == "end"
    assert job_config.stall_action({"sagemaker_stall_action": "Dump"}, {"DTC_STALL_ACTION": "end"}) == "dump"
    with pytest.raises(ConfigError, match=r"^environment variable DTC_STALL_ACTION='keep' is not a stall action: "
                                          r"use one of end, dump$"):
        job_config.stall_action({}, {"DTC_STALL_ACTION": "keep"})


def test_every_launcher_gives_its_processes_the_forensics_locations_and_mpirun_forwards_them():
    """stack_dump's registrations, the heartbeat file and NCCL's Flight Recorder dumps (issue #41);
    a job whose environment names its own Flight Recorder file keeps it (and mpirun forwards it)."""
    for config in (job(), job(mpi=MpiConfig(enabled=True, processes_per_host=2)), job(strategy="torch_distributed")):
        plan = launch.build(config, SCRIPT)
        output = config.output_dir
        assert {name: plan.env[name] for name in ("DTC_STACKS_DIR", "DTC_HEARTBEAT_FILE", "TORCH_FR_DUMP_TEMP_FILE")} \
            == {"DTC_STACKS_DIR": f"{output}/.stacks", "DTC_HEARTBEAT_FILE": f"{output}/.heartbeat",
                "TORCH_FR_DUMP_TEMP_FILE": f"{output}/data/forensics/flight-recorder/rank_"}, plan.strategy
        if plan.strategy == "mpi":
            assert all(plan.argv[plan.argv.index(name) - 1] == "-x"
                       for name in ("DTC_STACKS_DIR", "DTC_HEARTBEAT_FILE", "TORCH_FR_DUMP_TEMP_FILE"))
    own = launch.build(job(mpi=MpiConfig(enabled=True, processes_per_host=2),
                           inherited_names=("PATH", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")), SCRIPT)
    assert "TORCH_FR_DUMP_TEMP_FILE" not in own.env
    assert own.argv[own.argv.index("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") - 1] == "-x"
    assert job_config.forwarded_names({"TORCH_FR_BUFFER_SIZE": "4000", "HOME": "/root"}) == ("TORCH_FR_BUFFER_SIZE",)


def test_master_addr_and_port_are_set_as_aws_pytorch_container_sets_them():
    """MASTER_ADDR/MASTER_PORT on jobs without a distribution and under MPI (torchrun sets its
    own): the master host on several hosts, the loopback address on one; torchrun's port."""
    two = ("algo-1", "algo-2")
    for current in two:
        env = launch.build(job(hosts=two, current=current), SCRIPT).env
        assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["GLOO_SOCKET_IFNAME"]) == ("algo-1", "7777", "eth0")
    assert {k: launch.build(job(), SCRIPT).env[k] for k in ("MASTER_ADDR", "MASTER_PORT")} == {
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "7777"}
    mpi = launch.build(job(hosts=two, mpi=MpiConfig(enabled=True, processes_per_host=2)), SCRIPT)
    assert mpi.env["MASTER_ADDR"] == "algo-1"
    assert all(mpi.argv[mpi.argv.index(name) - 1] == "-x" for name in ("MASTER_ADDR", "MASTER_PORT"))


def test_every_launcher_sets_what_awss_framework_containers_set_unless_the_job_does():
    """NCCL_DEBUG=WARN (AWS's PyTorch container), TF_CPP_MIN_LOG_LEVEL=1 (its TensorFlow
    container) and SM_DLC_TORCH_VERSION (the image's torch) on every job, under every launcher,
    forwarded by mpirun; a job whose environment sets one keeps its own (issue #42, item 1)."""
    defaults = {"NCCL_DEBUG": "WARN", "TF_CPP_MIN_LOG_LEVEL": "1", "SM_DLC_TORCH_VERSION": "2.13.0"}
    two = ("algo-1", "algo-2")
    for config in (job(), job(mpi=MpiConfig(enabled=True, processes_per_host=2)), job(strategy="torch_distributed"),
                   job(hosts=two, strategy="multi_worker_mirrored_strategy"), job(strategy="parameter_server")):
        plan = launch.build(replace(config, image_torch_version="2.13.0"), SCRIPT)
        assert {name: plan.env.get(name) for name in defaults} == defaults, plan.strategy
        if plan.strategy == "mpi":
            assert all(plan.argv[plan.argv.index(name) - 1] == "-x" for name in defaults)
    own = launch.build(job(inherited_names=("PATH", "NCCL_DEBUG", "TF_CPP_MIN_LOG_LEVEL")), SCRIPT)
    assert "NCCL_DEBUG" not in own.env and "TF_CPP_MIN_LOG_LEVEL" not in own.env   # the container's own reach it
    assert "SM_DLC_TORCH_VERSION" not in own.env   # outside the image: no DTC_TORCH_VERSION
