"""Where this image corrects sagemaker-training's contract (issue #10, item 5) and names the bad
config file (item 6): SM_* agree with our master and host order, PYTHONPATH is prefixed, pip's own
error leads the failure, malformed config files are named."""

import json
import os
import re
import shutil
import socket
import subprocess
import sys

import pytest

from helpers import BIN, SDK_V3, copy_programs, read_json, run_train

pytestmark = pytest.mark.mpi


def test_sm_training_env_agrees_with_the_master_on_every_host(make_job, tmp_path):
    """instance_groups lists the distribution hosts unsorted: the toolkit would call algo-3 the
    master on every host; ours says algo-1 (rank 0's host) on algo-1 only."""
    hps = {"sagemaker_program": "x.py"}
    seen = {}
    for host in ("algo-1", "algo-2", "algo-3"):
        root = make_job(hps, hosts=["algo-1", "algo-2", "algo-3"], current_host=host)
        resource = json.loads((root / "input/config/resourceconfig.json").read_text())
        resource["instance_groups"][0]["hosts"] = ["algo-3", "algo-1", "algo-2"]
        (root / "input/config/resourceconfig.json").write_text(json.dumps(resource))
        done = run_train(root, "--plan", timeout_s=60)
        assert done.returncode == 0, done.output
        env = json.loads(done.stdout)["env"]
        training_env = json.loads(env["SM_TRAINING_ENV"])
        seen[host] = (training_env["master_hostname"], training_env["is_master"], json.loads(env["SM_HOSTS"]))
    assert seen == {"algo-1": ("algo-1", True, ["algo-1", "algo-2", "algo-3"]),
                    "algo-2": ("algo-1", False, ["algo-1", "algo-2", "algo-3"]),
                    "algo-3": ("algo-1", False, ["algo-1", "algo-2", "algo-3"])}


@pytest.mark.parametrize("mpi", [False, True], ids=["single", "mpi"])
def test_pythonpath_from_the_environment_is_kept_after_the_code_dir(make_job, source_dir, tmp_path, mpi):
    copy_programs(source_dir, "echo_argv.py")
    hps = {"sagemaker_program": "echo_argv.py", "sagemaker_submit_directory": str(source_dir),
           **({"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2} if mpi else {})}
    root = make_job(hps)
    extra = tmp_path / "extra_modules"
    result = run_train(root, env={"PYTHONPATH": str(extra)})
    assert result.returncode == 0, result.output
    record = read_json(root / "output" / "data" / ("argv-0.json" if mpi else "argv-single.json"))
    assert record["pythonpath"] == f"{root / 'code'}:{extra}"


def test_a_failing_requirements_txt_reports_pips_own_error_first(make_job, source_dir):
    copy_programs(source_dir, "echo_argv.py")
    (source_dir / "requirements.txt").write_text("dtc-no-such-package-anywhere==1.0\n")
    root = make_job({"sagemaker_program": "echo_argv.py", "sagemaker_submit_directory": str(source_dir)})
    result = run_train(root, env={"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": ""}, timeout_s=120)
    assert result.returncode == 2, result.output
    first = result.failure.splitlines()[0]
    assert first.startswith("ERROR: ") and "dtc-no-such-package-anywhere==1.0" in first, result.failure
    assert "requirements.txt" in result.failure
    assert not (root / "output" / "data" / "argv-single.json").exists()   # the program never ran


def test_a_requirement_against_a_pinned_package_names_the_pin_first(make_job, source_dir, tmp_path):
    """PIP_CONSTRAINT (the image sets /etc/pip/constraint.txt) pins numpy; a requirements.txt that
    asks for another numpy fails before the program runs, with the package, both versions and the
    ways out on the first line; one that merely names numpy installs nothing and runs."""
    import numpy

    constraint = tmp_path / "constraint.txt"
    constraint.write_text(f"numpy=={numpy.__version__}\n")
    copy_programs(source_dir, "echo_argv.py")
    (source_dir / "requirements.txt").write_text("numpy<2\n")
    env = {"PIP_NO_INDEX": "1", "PIP_CONSTRAINT": str(constraint)}
    root = make_job({"sagemaker_program": "echo_argv.py", "sagemaker_submit_directory": str(source_dir)})
    result = run_train(root, env=env, timeout_s=120)
    assert result.returncode == 2, result.output
    assert result.failure.splitlines()[0] == (
        f"requirements.txt asks for numpy<2, but this image pins numpy=={numpy.__version__} ({constraint}): use "
        "the image's version, build a derived image with the one you need, or set PIP_CONSTRAINT='' in the job's "
        "environment to lift the image's pins at your own risk (docs/versions.md, Protected pins)"), result.failure
    assert not (root / "output" / "data" / "argv-single.json").exists()

    shutil.rmtree(root)   # PIP_CONSTRAINT='' lifts the pin: pip looks for numpy<2 (no index here: none found)
    root = make_job({"sagemaker_program": "echo_argv.py", "sagemaker_submit_directory": str(source_dir)})
    result = run_train(root, env={**env, "PIP_CONSTRAINT": ""}, timeout_s=120)
    assert result.returncode == 2, result.output
    assert result.failure.splitlines()[0] == "ERROR: No matching distribution found for numpy<2", result.failure

    (source_dir / "requirements.txt").write_text("numpy\n")
    shutil.rmtree(root)
    root = make_job({"sagemaker_program": "echo_argv.py", "sagemaker_submit_directory": str(source_dir)})
    result = run_train(root, env=env, timeout_s=120)
    assert result.returncode == 0, result.output
    assert (root / "output" / "data" / "argv-single.json").exists()


def test_a_module_the_image_lacks_is_named_with_where_to_add_it(make_job, source_dir):
    source_dir.mkdir()
    (source_dir / "train.py").write_text("import dtc_no_such_module.layers\n")
    root = make_job({"sagemaker_program": "train.py", "sagemaker_submit_directory": str(source_dir)})
    result = run_train(root, timeout_s=120)
    assert result.returncode == 1, result.output
    first, second = result.failure.splitlines()[:2]
    assert first == "ModuleNotFoundError: No module named 'dtc_no_such_module'", result.failure
    assert second.startswith("this image has no module 'dtc_no_such_module': add the package that provides it to "
                             "requirements.txt"), result.failure


def test_a_script_calling_kerass_removed_multi_gpu_model_is_told_what_replaced_it(make_job, source_dir):
    """The seed articles' failure: a Keras 2.3-era script on TensorFlow 2.4+ (here 2.21)."""
    source_dir.mkdir()
    (source_dir / "train.py").write_text(
        "import tensorflow as tf\n"
        "model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])\n"
        "model = tf.keras.utils.multi_gpu_model(model, gpus=2)\n")
    root = make_job({"sagemaker_program": "train.py", "sagemaker_submit_directory": str(source_dir)})
    result = run_train(root, timeout_s=300)
    assert result.returncode == 1, result.output[-3000:]
    first, second = result.failure.splitlines()[:2]
    assert first.startswith("keras.utils.multi_gpu_model was removed from Keras in TensorFlow 2.4: build and compile "
                            "the model inside tf.distribute.MirroredStrategy().scope()"), result.failure
    assert second.startswith("AttributeError: ") and "multi_gpu_model" in second, result.failure


def test_horovod_refuses_a_keras_3_optimizer_and_averages_a_tf_keras_one(make_job, source_dir):
    """Issue #19, item 6: a Keras 3 optimizer wrapped by horovod.tensorflow.keras trains without
    averaging (docker/patches/0004-refuse-keras-3-optimizer.patch); tf.keras (tf-keras) averages."""
    copy_programs(source_dir, "horovod_keras_optimizer.py")
    hps = {"sagemaker_program": "horovod_keras_optimizer.py", "sagemaker_submit_directory": str(source_dir),
           "sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2}
    averaged = make_job({**hps, "keras": "tf.keras"})
    result = run_train(averaged, timeout_s=300)
    assert result.returncode == 0, result.output[-3000:]
    for rank in (0, 1):
        assert read_json(averaged / "model" / f"weights-{rank}.json") == pytest.approx([-1.0] * 4), rank
    refused = make_job({**hps, "keras": "keras"})
    result = run_train(refused, timeout_s=300)
    assert result.returncode == 1, result.output[-3000:]
    first = result.failure.splitlines()[0]
    assert first.startswith("TypeError: horovod.tensorflow.keras.DistributedOptimizer got a Keras 3 optimizer "
                            "(keras.src.optimizers.sgd.SGD, keras 3."), result.failure
    assert "TF_USE_LEGACY_KERAS=1" in first, first
    assert not list((refused / "model").glob("weights-*.json"))


@pytest.mark.parametrize("name, text, words", [
    ("hyperparameters.json", '["lr", 1]', ["hyperparameters.json", "JSON object", "list"]),
    ("hyperparameters.json", '{"lr": 1,', ["hyperparameters.json", "not valid JSON"]),
    ("resourceconfig.json", '{"current_host": "algo-1"', ["resourceconfig.json", "not valid JSON"]),
    ("resourceconfig.json", '"algo-1"', ["resourceconfig.json", "JSON object", "str"]),
    ("inputdataconfig.json", "{training}", ["inputdataconfig.json", "not valid JSON"]),
    ("inputdataconfig.json", "[]", ["inputdataconfig.json", "JSON object", "list"]),
    ("inputdataconfig.json", '{"training": "s3://x"}', ["inputdataconfig.json", "training"]),
    ("inputdataconfig.json", '{"training": {"TrainingInputMode": "Stream"}}',
     ["inputdataconfig.json", "'training'", "TrainingInputMode 'Stream'", "File, FastFile, Pipe"]),
    ("resourceconfig.json", '{"current_host": "algo-1", "hosts": []}', ["resourceconfig.json", '"hosts"']),
    ("resourceconfig.json", '{"current_host": "algo-1", "hosts": ["algo-1", "algo-1"]}', ["twice"]),
    ("resourceconfig.json", '{"hosts": ["algo-1"]}', ["resourceconfig.json", '"current_host"']),
    ("resourceconfig.json", '{"current_host": "algo-9", "hosts": ["algo-1"]}', ["algo-9", "not in hosts"]),
])
def test_a_malformed_config_file_is_named_in_the_failures_first_line(make_job, name, text, words):
    root = make_job({"sagemaker_program": "x.py"})
    (root / "input" / "config" / name).write_text(text)
    result = run_train(root, timeout_s=60)
    assert result.returncode == 2, result.output
    first = result.failure.splitlines()[0]
    for word in words:
        assert word in first, first
    assert "Traceback" not in result.failure


@pytest.mark.parametrize("submit, words", [
    ("{tmp}/no-such-dir", ["sagemaker_submit_directory", "no-such-dir"]),
    ("{tmp}/broken.tar.gz", ["sagemaker_submit_directory", "broken.tar.gz"]),
])
def test_a_missing_or_broken_submit_directory_is_named(make_job, tmp_path, submit, words):
    (tmp_path / "broken.tar.gz").write_bytes(b"not a tarball")
    root = make_job({"sagemaker_program": "train.py", "sagemaker_submit_directory": submit.format(tmp=tmp_path)})
    result = run_train(root, timeout_s=60)
    assert result.returncode == 2, result.output
    first = result.failure.splitlines()[0]
    for word in words:
        assert word in first, first


@pytest.mark.parametrize("framework", ["pytorch", "tensorflow"])
def test_a_builtin_trainer_without_its_training_channel_names_it(make_job, framework):
    root = make_job({"sagemaker_program": f"builtin:{framework}"}, channels=("validation",))
    result = run_train(root, timeout_s=120)
    assert result.returncode != 0, result.output
    first = result.failure.splitlines()[0]
    assert first.startswith("FileNotFoundError: channel directory") and "input/data/training" in first, first


def test_a_configured_interface_that_does_not_exist_falls_back_with_a_warning(make_job):
    """resourceconfig.json as SDK v3's local mode writes it (network_interface_name "ethwe"): the
    plan pins NCCL, Gloo and mpirun to an interface this machine has, and says so."""
    from dtc_entrypoint import fabric

    usable = fabric.usable_interfaces()
    if not usable:
        pytest.skip("no non-loopback IPv4 interface on this machine")
    expected = "eth0" if "eth0" in usable else usable[0]
    root = make_job({"sagemaker_program": "x.py", "sagemaker_mpi_enabled": True}, hosts=["algo-1", "algo-2"])
    resource = json.loads((root / "input/config/resourceconfig.json").read_text())
    resource["network_interface_name"] = "ethwe"
    (root / "input/config/resourceconfig.json").write_text(json.dumps(resource))
    done = run_train(root, "--plan", timeout_s=60)
    assert done.returncode == 0, done.output
    plan = json.loads(done.stdout)
    assert plan["env"]["NCCL_SOCKET_IFNAME"] == plan["env"]["GLOO_SOCKET_IFNAME"] == expected
    argv = plan["argv"]
    assert argv[argv.index("btl_tcp_if_include") + 1] == expected
    assert "'ethwe', which this container does not have" in done.stderr


def test_a_warm_pool_cache_keeps_pips_wheels_and_reaches_every_process(make_job, source_dir, tmp_path):
    """SAGEMAKER_MANAGED_WARMPOOL_CACHE_DIRECTORY (a warm pool with the persistent cache): the wheel
    pip builds for requirements.txt lands in <cache>/pip for the next job on the instance, and the
    training processes get the compiled-extension caches there; a variable the job sets wins."""
    package = tmp_path / "dist" / "src" / "dtc_cache_probe-1.0"
    package.mkdir(parents=True)
    (package / "setup.py").write_text('from setuptools import setup\n'
                                      'setup(name="dtc-cache-probe", version="1.0", py_modules=["dtc_cache_probe"])\n')
    (package / "dtc_cache_probe.py").write_text("X = 1\n")
    (package / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: dtc-cache-probe\nVersion: 1.0\n")
    shutil.make_archive(str(tmp_path / "dist" / "dtc_cache_probe-1.0"), "gztar", package.parent, package.name)
    copy_programs(source_dir, "echo_argv.py")
    (source_dir / "requirements.txt").write_text("dtc-cache-probe==1.0\n")
    cache = tmp_path / "warmpoolcache"
    cache.mkdir()
    env = {"SAGEMAKER_MANAGED_WARMPOOL_CACHE_DIRECTORY": str(cache), "HF_HOME": str(tmp_path / "hf"),
           "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path / "dist"), "PIP_NO_BUILD_ISOLATION": "0",
           "PIP_TARGET": str(tmp_path / "site")}   # installs beside, not into, the test's environment
    root = make_job({"sagemaker_program": "echo_argv.py", "sagemaker_submit_directory": str(source_dir)})
    plan = run_train(root, "--plan", env=env, timeout_s=60)
    assert plan.returncode == 0, plan.output
    plan_env = json.loads(plan.stdout)["env"]
    assert {name: plan_env.get(name) for name in ("TORCH_EXTENSIONS_DIR", "TRITON_CACHE_DIR", "HF_HOME")} == {
        "TORCH_EXTENSIONS_DIR": f"{cache}/torch_extensions", "TRITON_CACHE_DIR": f"{cache}/triton", "HF_HOME": None}
    result = run_train(root, env=env, timeout_s=300)
    assert result.returncode == 0, result.output[-3000:]
    assert (tmp_path / "site" / "dtc_cache_probe.py").exists()
    assert [p.name for p in (cache / "pip").rglob("*.whl")] == ["dtc_cache_probe-1.0-py3-none-any.whl"]
    assert f"warm pool cache: PIP_CACHE_DIR={cache}/pip" in result.output


def test_a_script_for_awss_pytorch_container_joins_through_master_addr_without_a_distribution(make_job, source_dir):
    """Issue #42, item 1: AWS's PyTorch container sets MASTER_ADDR and MASTER_PORT on every job;
    a script that calls init_process_group itself (env://) runs here unchanged (on one host here,
    on two in tests/cluster/test_cluster.py)."""
    copy_programs(source_dir, "aws_pytorch_style.py")
    root = make_job({"sagemaker_program": "aws_pytorch_style.py", "sagemaker_submit_directory": str(source_dir)})
    result = run_train(root, timeout_s=120)
    assert result.returncode == 0, result.output[-3000:]
    assert "host algo-1 rank 0 of 1 via 127.0.0.1:" in result.output
    assert read_json(root / "model" / "sum.json") == {"sum": 1.0, "world_size": 1}


def sdk_mpirun_command(host_list: list[str], processes_per_host: int) -> list[str]:
    """The mpirun command line SageMaker SDK v3's MPI() driver runs on the master host, made by the
    SDK's own function (sagemaker-train, container_drivers/distributed_drivers/mpi_utils.py)."""
    code = ("import importlib.util, json, sys\n"
            "drivers = importlib.util.find_spec('sagemaker.train.container_drivers').submodule_search_locations[0]\n"
            "sys.path[:0] = [drivers, drivers + '/distributed_drivers']\n"
            "import mpi_utils\n"
            f"print(json.dumps(mpi_utils.get_mpirun_command(host_count={len(host_list)}, host_list={host_list!r}, "
            f"num_processes={processes_per_host}, additional_options=[], entry_script_path='ranks.py')))")
    done = subprocess.run([str(SDK_V3), "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "SM_CURRENT_INSTANCE_TYPE": "ml.c5.xlarge"})
    return json.loads(done.stdout)


@pytest.mark.parametrize("sdk_signature", [True, False])
def test_the_sdk_mpi_drivers_processes_per_host_become_every_hosts_processes(sdk_signature, tmp_path):
    """SDK v3's MPI(process_count_per_node=2) on two hosts runs `mpirun --host h1:2,h2:2 -np 2 ...`:
    the image's mpirun (docker/install-openmpi.sh's wrapper, here the host setup's copy) runs 2 on
    each host, 4 in all, and says why; the same command without the driver's
    `-mca plm_rsh_num_concurrent 2` keeps its -np. Two names for this machine stand for the hosts."""
    command = sdk_mpirun_command(["localhost:2", f"{socket.gethostname()}:2"], 2)
    assert command[:5] == ["mpirun", "--host", f"localhost:2,{socket.gethostname()}:2", "-np", "2"]
    if not sdk_signature:
        at = command.index("plm_rsh_num_concurrent")
        del command[at - 1:at + 2]
    # one write per rank: mpirun's --tag-output tags each write, and an unbuffered print() writes
    # its pieces one by one (seen under PYTHONUNBUFFERED=1: "[1,0]<stdout>:rank[1,0]<stdout>: ...")
    (tmp_path / "ranks.py").write_text("import os\nfrom mpi4py import MPI\nworld = MPI.COMM_WORLD\n"
                                       "os.write(1, f'rank {world.Get_rank()} of {world.Get_size()}\\n'.encode())\n")
    command[0] = str(BIN / "mpirun")
    command[command.index("-m") - 1] = sys.executable
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    world_size = 4 if sdk_signature else 2
    found = re.findall(r"rank (\d+) of (\d+)", done.stdout)
    ranks = sorted(int(rank) for rank, size in found if int(size) == world_size)
    assert ranks == list(range(world_size)), done.stdout
    warned = ("mpirun: -np 2 with --host localhost:2," in done.stderr
              and "running 4 processes, 2 on each of the 2 hosts" in done.stderr)
    assert warned == sdk_signature, done.stderr
