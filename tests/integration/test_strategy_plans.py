"""`train --plan` on every host of service-style configs for each strategy (SDK v2 encodings,
unsorted instance_groups, heterogeneous groups), and the clear failures for bad strategy input."""

import json
import os
import shutil
import subprocess
import sys
import threading

import pytest

from dtc_entrypoint import host_identity, launchers
from dtc_entrypoint.errors import ConfigError
from dtc_train import ps_channel
from helpers import FIXTURES, PROGRAMS, free_port, read_json, run_train

HOSTS = ("algo-1", "algo-2")


def plans_on_every_host(make_job, tmp_path, hyperparameters, hosts=HOSTS, encoding="json", env=None):
    """host -> the JSON plan `train --plan` prints there (each host's tree lists itself first in
    instance_groups, as the service does, so the groups' order differs from host to host)."""
    plans = {}
    for host in reversed(hosts):
        root = make_job(hyperparameters, hosts=hosts, current_host=host, encoding=encoding)
        result = run_train(root, "--plan", env=env)
        assert result.returncode == 0, result.output
        plans[host] = json.loads(result.stdout)
        assert read_json(root / "input" / "config" / "resourceconfig.json")["instance_groups"][0]["hosts"][0] == host
    return plans


@pytest.mark.parametrize("encoding", ["json", "str"])
def test_torch_distributed_runs_torchrun_on_every_host_with_one_master(make_job, tmp_path, encoding):
    plans = plans_on_every_host(make_job, tmp_path, {
        "sagemaker_program": "builtin:pytorch", "sagemaker_torch_distributed_enabled": True,
        "sagemaker_instance_type": "ml.p4d.24xlarge", "sagemaker_mpi_num_of_processes_per_host": 2, "epochs": 3},
        encoding=encoding)
    for index, host in enumerate(HOSTS):
        plan = plans[host]
        argv = plan["argv"]
        assert plan["strategy"] == "torch_distributed" and plan["role"] == "launcher"
        assert argv[1:3] == ["-m", "torch.distributed.run"]
        options = dict(zip(argv[3:13:2], argv[4:13:2], strict=True))
        assert options == {"--nnodes": "2", "--nproc_per_node": "2", "--node_rank": str(index),
                           "--master_addr": "algo-1", "--master_port": "7777"}
        assert argv[13:] == ["-m", "dtc_train.pytorch_ddp", "--epochs", "3"]
        assert plan["ranks"] == [2 * index, 2 * index + 1] and plan["world_size"] == 4
        assert plan["env"]["GLOO_SOCKET_IFNAME"] == plan["env"]["NCCL_SOCKET_IFNAME"] == "eth0"
        assert "NCCL_PROTO" not in plan["env"]


def test_ports_are_configurable(make_job, tmp_path):
    plans = plans_on_every_host(make_job, tmp_path, {
        "sagemaker_program": "train.py", "sagemaker_torch_distributed_enabled": True},
        env={"DTC_TORCH_MASTER_PORT": "29400"})
    assert all(p["argv"][p["argv"].index("--master_port") + 1] == "29400" for p in plans.values())
    with pytest.raises(ConfigError, match="DTC_TF_PS_PORT="):
        launchers.ports_from({"DTC_TF_PS_PORT": "70000"})
    # the ports one host listens on under one launcher (its own and train's) must differ
    with pytest.raises(ConfigError, match="DTC_TF_TASK_PORT and DTC_TF_PS_PORT are both 2222: a host under "
                                          "parameter_server listens on both"):
        launchers.ports_from({"DTC_TF_PS_PORT": "2222"})
    with pytest.raises(ConfigError, match="DTC_TF_PS_PORT and DTC_TF_END_PORT are both 2223"):
        launchers.ports_from({"DTC_TF_END_PORT": "2223"})
    with pytest.raises(ConfigError, match="DTC_PRESENCE_PORT and DTC_TORCH_MASTER_PORT are both 2226"):
        launchers.ports_from({"DTC_TORCH_MASTER_PORT": "2226"})
    assert launchers.ports_from({"DTC_TORCH_MASTER_PORT": "8890"})["torch_master"] == 8890   # MWMS's: another launcher


def test_multi_worker_mirrored_strategy_writes_the_worker_list(make_job, tmp_path):
    plans = plans_on_every_host(make_job, tmp_path, {
        "sagemaker_program": "builtin:tensorflow", "sagemaker_multi_worker_mirrored_strategy_enabled": True,
        "model_dir": "/opt/ml/shared/model"}, hosts=("algo-1", "algo-2", "algo-3"))
    for index, host in enumerate(("algo-1", "algo-2", "algo-3")):
        plan = plans[host]
        expected = {"cluster": {"worker": ["algo-1:8890", "algo-2:8890", "algo-3:8890"]}, "environment": "cloud",
                    "task": {"index": index, "type": "worker"}}
        assert plan["tf_config"] == expected and json.loads(plan["env"]["TF_CONFIG"]) == expected
        assert plan["argv"][1:3] == ["-m", "dtc_train.tensorflow_mwms"]
        assert plan["argv"][3:] == ["--model_dir", "/opt/ml/shared/model"]   # the TF estimator's argument
        assert plan["ranks"] == [index] and plan["master_host"] == "algo-1"


def test_parameter_server_puts_the_chief_on_the_master_and_servers_everywhere(make_job, tmp_path):
    plans = plans_on_every_host(make_job, tmp_path, {
        "sagemaker_program": "builtin:tensorflow", "sagemaker_parameter_server_enabled": True})
    cluster = {"chief": ["algo-1:2222"], "worker": ["algo-2:2222"], "ps": ["algo-1:2223", "algo-2:2223"]}
    chief, other = plans["algo-1"], plans["algo-2"]
    assert chief["role"] == "chief" and chief["tasks"] == ["chief:0", "ps:0"]
    assert chief["tf_config"] == {"cluster": cluster, "environment": "cloud", "task": {"index": 0, "type": "chief"}}
    assert chief["argv"][1:3] == ["-m", "dtc_train.tensorflow_ps"]
    [ps0] = chief["services"]
    assert ps0["argv"][1:] == ["-m", "dtc_entrypoint.tf_server"]
    assert json.loads(ps0["env"]["TF_CONFIG"])["task"] == {"index": 0, "type": "ps"}
    assert ps0["env"]["CUDA_VISIBLE_DEVICES"] == ""
    assert other["role"] == "tf-server" and other["tasks"] == ["worker:0", "ps:1"]
    assert other["tf_config"]["task"] == {"index": 0, "type": "worker"} and other["tf_config"]["cluster"] == cluster
    assert other["argv"][1:] == ["-m", "dtc_entrypoint.tf_server", "--until-closed", "algo-1:2223", "--end-port",
                                 "2225"]
    assert chief["end_notice"] == ["algo-2:2225"] and other["end_notice"] == []   # the chief's word that it ended
    assert json.loads(other["services"][0]["env"]["TF_CONFIG"])["task"] == {"index": 1, "type": "ps"}
    # the chief reads algo-2's part of a ShardedByS3Key channel through ps:1 (dtc_train.ps_channel)
    assert ps_channel.ps_tasks(cluster) == {"algo-1": 0, "algo-2": 1}


def test_a_parameter_server_loads_tensorflow_as_the_trainers_do_without_keras_3_or_pandas(tmp_path):
    """``dtc_entrypoint.tf_server`` (every parameter server, and every worker of the
    parameter-server strategy) loads TensorFlow through ``dtc_train.tf_env`` also where
    TF_USE_LEGACY_KERAS is not set, as on this host (the image sets it): tf-keras, not Keras 3
    with scikit-learn, pandas and matplotlib under it, and no pandas. The imports are those the
    server had made when it said that it served (tests/programs/record_imports_live.py)."""
    shutil.copy(PROGRAMS / "record_imports_live.py", tmp_path / "sitecustomize.py")
    imports = tmp_path / "imports.txt"
    env = {name: value for name, value in os.environ.items() if name != "TF_USE_LEGACY_KERAS"}
    env.update(PYTHONPATH=str(tmp_path), IMPORTS_FILE=str(imports), TF_CONFIG=json.dumps(
        {"cluster": {"ps": [f"localhost:{free_port()}"]}, "task": {"type": "ps", "index": 0}}))
    server = subprocess.Popen([sys.executable, "-m", "dtc_entrypoint.tf_server"], env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(120, server.kill)   # a server that never says it serves ends the read
    watchdog.start()
    lines = []
    try:
        for line in server.stderr:
            lines.append(line)
            if "serving ps:0" in line:
                break
        else:
            pytest.fail("the server ended or hung before it served:\n" + "".join(lines[-40:]))
    finally:
        watchdog.cancel()
        server.kill()
        server.wait(timeout=60)
    loaded = {name.partition(".")[0] for name in imports.read_text().split() if "." in name}   # packages
    assert {"dtc_train", "tensorflow", "tf_keras"} <= loaded, sorted(loaded)
    assert not loaded & {"keras", "pandas", "sklearn", "matplotlib"}, sorted(loaded)


def test_mpi_ranks_on_other_hosts_load_their_own_identity(make_job, tmp_path):
    plans = plans_on_every_host(make_job, tmp_path, {
        "sagemaker_program": "train.py", "sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2})
    argv = plans["algo-1"]["argv"]
    wrapper = argv.index("dtc_entrypoint.host_identity")
    assert argv[wrapper - 1] == "-m" and argv[wrapper + 2:wrapper + 4] == ["-m", "mpi4py"]
    assert argv[-1].endswith("train.py")
    assert plans["algo-1"]["ranks"] == [0, 1] and plans["algo-2"]["ranks"] == [2, 3]
    assert plans["algo-2"]["role"] == "mpi-worker" and plans["algo-2"]["argv"] == []


def test_host_identity_overrides_the_forwarded_host_variables(tmp_path):
    path = tmp_path / "host-env.json"
    host_identity.write({"SM_CURRENT_HOST": "algo-2"}, str(path))
    done = subprocess.run(
        [sys.executable, "-m", "dtc_entrypoint.host_identity", sys.executable, "-c",
         "import os; print(os.environ['SM_CURRENT_HOST'], os.environ['SM_HOSTS'])"],
        env={"PATH": "/usr/bin:/bin", "SM_CURRENT_HOST": "algo-1", "SM_HOSTS": "x",
             "DTC_HOST_ENV_FILE": str(path)}, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["algo-2", "x"]


def test_heterogeneous_hosts_outside_the_distribution_groups_run_alone(make_job, tmp_path):
    groups = [{"instance_group_name": "data", "instance_type": "ml.c5.xlarge", "hosts": ["algo-3"]},
              {"instance_group_name": "train", "instance_type": "ml.p4d.24xlarge", "hosts": ["algo-2", "algo-1"]}]
    plans = {}
    for host, group in (("algo-1", "train"), ("algo-2", "train"), ("algo-3", "data")):
        root = make_job({"sagemaker_program": "builtin:pytorch", "sagemaker_torch_distributed_enabled": True,
                         "sagemaker_distribution_instance_groups": ["train"]},
                        hosts=("algo-1", "algo-2", "algo-3"), current_host=host)
        config_path = root / "input" / "config" / "resourceconfig.json"
        config = read_json(config_path)
        config.update(current_group_name=group, instance_groups=groups)
        config_path.write_text(json.dumps(config))
        result = run_train(root, "--plan")
        assert result.returncode == 0, result.output
        plans[host] = json.loads(result.stdout)
    assert plans["algo-3"]["strategy"] == "single"
    assert plans["algo-3"]["argv"][1:3] == ["-m", "dtc_train.pytorch_single"]
    for index, host in enumerate(("algo-1", "algo-2")):
        assert plans[host]["hosts"] == ["algo-1", "algo-2"] and plans[host]["master_host"] == "algo-1"
        assert plans[host]["argv"][plans[host]["argv"].index("--node_rank") + 1] == str(index)


@pytest.mark.parametrize(("hyperparameters", "first_line"), [
    ({"sagemaker_mpi_enabled": True, "sagemaker_torch_distributed_enabled": True},
     "conflicting distribution strategies: sagemaker_mpi_enabled"),
    ({"sagemaker_parameter_server_enabled": "True", "sagemaker_multi_worker_mirrored_strategy_enabled": "True"},
     "conflicting distribution strategies: sagemaker_multi_worker_mirrored_strategy_enabled"),
    ({"sagemaker_distributed_dataparallel_enabled": True, "sagemaker_instance_type": "ml.p4d.24xlarge",
      "sagemaker_distributed_dataparallel_custom_mpi_options": ""},
     "hyperparameter sagemaker_distributed_dataparallel_enabled is set: SageMaker distributed data parallel"),
    ({"sagemaker_pytorch_ddp_enabled": True}, "hyperparameter sagemaker_pytorch_ddp_enabled is set: pytorchddp"),
    ({"sagemaker_pytorch_xla_multi_worker_enabled": True}, "hyperparameter sagemaker_pytorch_xla_multi_worker_enabled"),
    ({"sagemaker_mpi_enabled": True, "mp_parameters": {"partitions": 2}}, "SageMaker model parallel"),
    ({"sagemaker_parameter_server_enabled": True, "sagemaker_program": "builtin:pytorch"},
     "sagemaker_program 'builtin:pytorch' has no trainer for the parameter_server strategy: use builtin:tensorflow"),
    ({"sagemaker_torch_distributed_enabled": "maybe"},
     "hyperparameter sagemaker_torch_distributed_enabled='maybe' is not a boolean"),
])
def test_bad_strategy_input_fails_clearly_before_starting_anything(make_job, hyperparameters, first_line):
    root = make_job({"sagemaker_program": "train.py", **hyperparameters}, hosts=HOSTS)
    for args in (("--plan",), ()):
        result = run_train(root, *args)
        assert result.returncode == 2, result.output
        assert result.failure.splitlines()[0].startswith(first_line), result.failure
        (root / "output" / "failure").unlink()


SDK_V2 = read_json(FIXTURES / "sdk_v2_hyperparameters.json")["cases"]
# case -> (strategy, the trainer module or None for a refusal, the first failure line)
SDK_EXPECTED = {
    "pytorch_mpi": ("mpi", "dtc_train.pytorch_horovod"),
    "pytorch_torch_distributed": ("torch_distributed", "dtc_train.pytorch_ddp"),
    "pytorch_pytorchddp": (None, "hyperparameter sagemaker_distributed_dataparallel_enabled is set"),
    "pytorch_smddp": (None, "hyperparameter sagemaker_distributed_dataparallel_enabled is set"),
    "tensorflow_mpi": ("mpi", "dtc_train.tensorflow_horovod"),
    "tensorflow_multi_worker_mirrored_strategy": ("multi_worker_mirrored_strategy", "dtc_train.tensorflow_mwms"),
    "tensorflow_parameter_server": ("parameter_server", "dtc_train.tensorflow_ps"),
    "generic_estimator_mpi": ("mpi", "dtc_train.pytorch_horovod"),
}


def test_every_sdk_v2_case_is_covered():
    assert set(SDK_V2) == set(SDK_EXPECTED)


@pytest.mark.parametrize("case", sorted(SDK_EXPECTED))
def test_plans_for_hyperparameters_written_by_sdk_v2(make_job, case):
    """hyperparameters.json exactly as SageMaker Python SDK v2.257.7 writes it for each
    distribution= (tests/fixtures, made by scripts/sdk-v2-hyperparameters.py), on both hosts."""
    strategy_name, expected = SDK_EXPECTED[case]
    encoded = dict(SDK_V2[case])
    framework = "tensorflow" if case.startswith("tensorflow") else "pytorch"
    encoded.setdefault("sagemaker_program", json.dumps(f"builtin:{framework}"))   # script mode adds it at fit()
    for host in HOSTS:
        root = make_job(encoded, hosts=HOSTS, current_host=host, encoding="str")  # str() keeps encoded strings
        result = run_train(root, "--plan")
        if strategy_name is None:
            assert result.returncode == 2 and result.failure.startswith(expected), result.output
            continue
        assert result.returncode == 0, result.output
        plan = json.loads(result.stdout)
        assert plan["strategy"] == strategy_name and plan["master_host"] == "algo-1"
        if plan["role"] == "mpi-worker":
            assert plan["ranks"] == [2, 3]
            continue
        argv = plan["argv"]
        if plan["role"] != "tf-server":
            assert expected in argv and argv[argv.index(expected) + 1:argv.index(expected) + 3] == ["--epochs", "3"]
        if case == "pytorch_mpi":
            assert "A=1" in argv
        if case == "generic_estimator_mpi":
            assert argv[-2:] == ["--flag", "False"]


@pytest.mark.parametrize("encoding", ["json", "str"])
def test_train_plan_reads_sdk_encoded_configs(make_job, encoding):
    """`train --plan` on trees whose hyperparameters.json was encoded both ways."""
    hps = {"sagemaker_program": "builtin:pytorch", "sagemaker_mpi_enabled": True,
           "sagemaker_mpi_num_of_processes_per_host": 2, "sagemaker_mpi_custom_mpi_options": "-x A=1",
           "epochs": 3, "flag": False, "name": "a b"}
    root = make_job(hps, encoding=encoding)
    result = run_train(root, "--plan")
    assert result.returncode == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["strategy"] == "mpi" and plan["world_size"] == 2
    argv = plan["argv"]
    module = argv.index("dtc_train.pytorch_horovod")
    assert argv[module - 4:module] == [argv[module - 4], "-m", "mpi4py", "-m"]
    assert argv[module + 1:] == ["--epochs", "3", "--flag", "False", "--name", "a b"]
    assert "A=1" in argv


def test_train_plan_false_string_disables_mpi(make_job):
    root = make_job({"sagemaker_program": "train.py", "sagemaker_mpi_enabled": False}, encoding="str")
    plan = json.loads(run_train(root, "--plan").stdout)
    assert plan["strategy"] == "single"


def test_train_plan_master_is_the_same_on_every_host_for_unsorted_groups(make_job, tmp_path):
    plans = {}
    for host in ("algo-2", "algo-1", "algo-3"):
        root = make_job({"sagemaker_program": "train.py", "sagemaker_mpi_enabled": True},
                        hosts=("algo-1", "algo-2", "algo-3"), current_host=host)
        plans[host] = json.loads(run_train(root, "--plan").stdout)
    assert {p["master_host"] for p in plans.values()} == {"algo-1"}
    assert plans["algo-1"]["role"] == "launcher"
    assert plans["algo-2"]["role"] == plans["algo-3"]["role"] == "mpi-worker"
    assert "algo-1:1,algo-2:1,algo-3:1" in plans["algo-1"]["argv"]
