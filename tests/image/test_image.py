"""The built images, exercised with podman (or docker): the in-image sanity suite, the entry
script and labels, the main job inside the image, and SIGTERM reaching the training processes.

`make test` builds the CPU image and names it in DTC_IMAGE; DTC_GPU_IMAGE names a GPU-flavor
image (tests/image/test_gpu_image.py). Tests for an image that is not named skip.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from dtc_local import job_tree
from helpers import (
    BUILDSPEC_IMAGE,
    CONTAINER,
    DIGEST,
    METRIC,
    PROGRAMS,
    check_in_image_suite,
    check_labels,
    container,
    flavor_image,
    mpi_digits_job,
    run_job_in,
    run_train,
)

pytestmark = pytest.mark.image


def test_in_image_sanity_suite():
    if flavor_image("cpu") == BUILDSPEC_IMAGE:
        pytest.skip("the buildspec test runs the in-image suite in this image (tests/image/test_delivery.py, "
                    "release.sh test)")
    check_in_image_suite("cpu")


def test_labels_carry_the_versions():
    check_labels("cpu")


def test_any_other_command_is_execd_as_pid_1():
    done = container("run", "--rm", flavor_image("cpu"), "bash", "-c", 'echo "$$ $(cat /proc/1/comm)"', check=True)
    assert done.stdout.split() == ["1", "bash"]


def test_with_no_command_the_image_trains_inside_a_training_job_and_is_a_shell_elsewhere(make_job, tmp_path):
    """SageMaker SDK v3's local container mode starts the image with no command when the job has
    no source_code (issue #12): with /opt/ml/input/config written, that runs `train`; without it
    (`docker run -it IMAGE`) the image gives a shell, here fed on stdin."""
    root = make_job({"sagemaker_program": "echo_argv.py", "epochs": 3})
    shutil.copy(PROGRAMS / "echo_argv.py", root / "code")
    done = container("run", "--rm", "--network", "none", "-v", f"{root}:/opt/ml", flavor_image("cpu"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert json.loads((root / "output" / "data" / "argv-single.json").read_text())["argv"] == ["--epochs", "3"]
    assert (root / "output" / "success").exists()

    # A job with nothing to run fails and says what to set, instead of "succeeding" untrained.
    empty = tmp_path / "empty" / "opt" / "ml"
    job_tree.write(str(empty), hyperparameters={})
    failed = container("run", "--rm", "--network", "none", "-v", f"{empty}:/opt/ml", flavor_image("cpu"))
    assert failed.returncode != 0
    assert (empty / "output" / "failure").read_text().startswith("no training program: set the sagemaker_program")

    shell = subprocess.run([CONTAINER, "run", "--rm", "-i", flavor_image("cpu")], input='echo "$0 $((6 * 7))"\n',
                           capture_output=True, text=True, timeout=120)
    assert shell.returncode == 0 and shell.stdout.split() == ["bash", "42"], shell.stderr


def test_entry_script_links_an_injected_libcuda_for_horovods_dlopen(tmp_path):
    """Older NVIDIA container toolkits inject libcuda.so.1 without the unversioned libcuda.so that
    Horovod's PyTorch ops dlopen: the entry script adds one and puts it on the library path."""
    driver = tmp_path / "libcuda.so.1"
    driver.write_bytes(b"\x7fELF")
    script = 'echo "$LD_LIBRARY_PATH"; readlink /run/dtc/libcuda/libcuda.so'
    done = container("run", "--rm", "-v", f"{driver}:/usr/lib/x86_64-linux-gnu/libcuda.so.1:ro", flavor_image("cpu"),
                     "bash", "-c", script, check=True)
    assert done.stdout.split() == ["/run/dtc/libcuda", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"]
    without = container("run", "--rm", flavor_image("cpu"), "bash", "-c", script)
    assert without.stdout.strip() == ""        # no driver, no link, library path untouched


def test_main_job_in_the_image_matches_the_host(digits_channels, tmp_path):
    """The same job, in the image and on the host's venv, ends with bit-identical weights."""
    root = mpi_digits_job(tmp_path / "image", digits_channels, "pytorch")
    done = run_job_in(flavor_image("cpu"), root)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    epochs = METRIC.findall(done.stdout)
    assert len(epochs) == 12 and float(epochs[-1][2]) >= 0.90
    in_image = {rank: digest for rank, _, digest in DIGEST.findall(done.stdout)}
    assert len(in_image) == 2 and len(set(in_image.values())) == 1
    assert (root / "output" / "success").exists() and (root / "model" / "model.pth").exists()

    host_root = tmp_path / "host" / "opt" / "ml"
    shutil.copytree(root / "input", host_root / "input")
    on_host = run_train(host_root)
    assert on_host.returncode == 0, on_host.output[-3000:]
    assert METRIC.findall(on_host.stdout)[-1] == epochs[-1]
    assert {d for _, _, d in DIGEST.findall(on_host.stdout)} == set(in_image.values())


def test_requirements_txt_is_installed_before_the_program_runs(make_job, tmp_path):
    """The program's requirements.txt (here a local wheel, so no network is needed) is installed
    into the image's environment before the program starts, as the toolkit does."""
    package = tmp_path / "pkg"
    (package / "dtc_demo").mkdir(parents=True)
    (package / "dtc_demo" / "__init__.py").write_text("VALUE = 42\n")
    (package / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools"]\nbuild-backend = '
                                            '"setuptools.build_meta"\n[project]\nname = "dtc-demo"\nversion = "0.1"\n')
    root = make_job({"sagemaker_program": "uses_demo.py"})
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(root / "code"), str(package)], check=True, capture_output=True)
    (root / "code" / "requirements.txt").write_text("./dtc_demo-0.1-py3-none-any.whl\n")
    (root / "code" / "uses_demo.py").write_text(
        "import os, dtc_demo\n"
        "open(os.path.join(os.environ['SM_OUTPUT_DATA_DIR'], 'demo'), 'w').write(str(dtc_demo.VALUE))\n")
    done = container("run", "--rm", "--network", "none", "-v", f"{root}:/opt/ml", flavor_image("cpu"), "train")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (root / "output" / "data" / "demo").read_text() == "42"


def test_a_requirement_for_another_torch_fails_naming_the_images_pin(make_job, tmp_path):
    """The image's /etc/pip/constraint.txt: requirements.txt asking for torch 2.5.0 fails before the
    program runs, with the package, both versions and the ways out first (no index: the conflict
    is found without one); naming torch alone installs nothing and the program runs."""
    root = make_job({"sagemaker_program": "uses_torch.py"})
    (root / "code" / "uses_torch.py").write_text(
        "import os, torch\n"
        "open(os.path.join(os.environ['SM_OUTPUT_DATA_DIR'], 'torch'), 'w').write(torch.__version__)\n")
    (root / "code" / "requirements.txt").write_text("torch==2.5.0\n")
    run = ["run", "--rm", "--network", "none", "-e", "PIP_NO_INDEX=1", "-v", f"{root}:/opt/ml", flavor_image("cpu"),
           "train"]
    done = container(*run)
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    pinned = container("run", "--rm", flavor_image("cpu"), "python", "-c", "import torch; print(torch.__version__)",
                       check=True).stdout.strip()
    assert (root / "output" / "failure").read_text().splitlines()[0] == (
        f"requirements.txt asks for torch==2.5.0, but this image pins torch=={pinned} (/etc/pip/constraint.txt): "
        "use the image's version, build a derived image with the one you need, or set PIP_CONSTRAINT='' in the "
        "job's environment to lift the image's pins at your own risk (docs/versions.md, Protected pins)")
    assert not (root / "output" / "data" / "torch").exists()

    (root / "code" / "requirements.txt").write_text("torch\nnumpy\n")
    (root / "output" / "failure").unlink()
    done = container(*run)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (root / "output" / "data" / "torch").read_text() == pinned


def test_sigterm_to_the_container_reaches_the_training_processes(make_job):
    image = flavor_image("cpu")
    root = make_job({"sagemaker_program": "wait_for_sigterm.py", "sagemaker_mpi_enabled": True,
                     "sagemaker_mpi_num_of_processes_per_host": 2})
    shutil.copy(PROGRAMS / "wait_for_sigterm.py", root / "code")
    name = f"dtc-sigterm-{os.getpid()}"
    container("run", "-d", "--name", name, "-v", f"{root}:/opt/ml", image, "train", check=True)
    try:
        deadline = time.monotonic() + 120
        while not all((root / "output" / "data" / f"started-{r}").exists() for r in (0, 1)):
            assert time.monotonic() < deadline, container("logs", name).stderr[-3000:]
            time.sleep(0.5)
        container("stop", "-t", "60", name, check=True)
        state = json.loads(container("inspect", name, check=True).stdout)[0]["State"]
        assert state["ExitCode"] != 0
    finally:
        container("rm", "-f", name)
    assert all((root / "output" / "data" / f"sigterm-{r}").read_text() == "SIGTERM" for r in (0, 1))
    assert re.match(r"wait_for_sigterm.py was stopped by SIGTERM", (root / "output" / "failure").read_text())
