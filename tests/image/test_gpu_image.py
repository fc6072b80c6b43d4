"""The GPU flavor, checked on a machine without a GPU: its in-image suite (one CUDA major, one copy
of every CUDA library, Horovod's NCCL and kernels, ldd, imports, pip check), its labels, the GPU
architectures its libraries carry against docs/image.md's table, and what users run, on this
machine's CPUs with the GPU flavor's versions (its torch 2.10, the CUDA builds of TensorFlow and
DALI): the main job of both frameworks reaching the CPU image's accuracy, every built-in strategy
and every example on two hosts. DTC_GPU_IMAGE names the image: `make gpu-verify` builds it and
runs these, and so does `make test` when the GPU build's inputs differ from
tests/fixtures/gpu-verified.json. The checks that need a GPU are tests/gpu (scripts/gpu-check.sh).
"""

import json
import re
import shutil

import pytest

from helpers import (
    DIGEST,
    EPOCH_LINE,
    EXAMPLES,
    METRIC,
    REPO,
    STRATEGIES,
    check_in_image_suite,
    check_labels,
    check_two_host_job,
    container,
    flavor_image,
    image_sanity,
    mpi_digits_job,
    run_cluster,
    run_job_in,
)

pytestmark = pytest.mark.image


def test_gpu_in_image_sanity_suite():
    check_in_image_suite("gpu")


def test_gpu_image_has_nothing_but_its_listed_exceptions():
    """The image sanity checks (dtc_local.image_sanity: credentials, secret variables, the hardening
    of what the build compiled, Horovod's CUDA build included, the OCI annotations)."""
    image = flavor_image("gpu")
    done = image_sanity(image, "gpu")
    assert done.returncode == 0 and done.stdout.splitlines()[-1].startswith(f"{image}: 0 failed"), \
        done.stdout[-4000:] + done.stderr[-2000:]


def test_gpu_labels():
    check_labels("gpu")


@pytest.mark.parametrize("framework", ["pytorch", "tensorflow"])
def test_main_job_in_the_gpu_image_on_cpu_reaches_the_cpu_images_accuracy(framework, digits_channels, tmp_path):
    """`make train` in the GPU flavor, on a machine without a GPU (its CPU code path), against the
    same job in the CPU flavor: both >= 0.90, within 2 points of each other (PyTorch differs:
    2.10 on GPU, 2.13 on CPU; TensorFlow is the same release)."""
    gpu_image, cpu_image = flavor_image("gpu"), flavor_image("cpu")
    accuracy = {}
    for flavor, image in (("gpu", gpu_image), ("cpu", cpu_image)):
        root = mpi_digits_job(tmp_path / flavor, digits_channels, framework)
        done = run_job_in(image, root)
        assert done.returncode == 0, f"{flavor}: " + done.stdout[-3000:] + done.stderr[-3000:]
        epochs = METRIC.findall(done.stdout)
        assert len(epochs) == 12 and int(epochs[-1][3]) == 360
        digests = {d for _, _, d in DIGEST.findall(done.stdout)}
        assert len(digests) == 1, f"{flavor}: ranks ended with different weights"
        accuracy[flavor] = float(epochs[-1][2])
        shutil.rmtree(root)
    assert min(accuracy.values()) >= 0.90 and abs(accuracy["gpu"] - accuracy["cpu"]) <= 0.02, accuracy



@pytest.mark.parametrize("case", list(STRATEGIES))
def test_two_hosts_in_the_gpu_image_on_cpu(case, tmp_path):
    """Every built-in strategy on the GPU flavor's CPU code path across hosts: the same checks as
    for the CPU image."""
    check_two_host_job(case, tmp_path, flavor_image("gpu"))


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_every_example_trains_on_two_hosts_in_the_gpu_image_on_cpu(name, tmp_path):
    """examples/ as a user rehearsed them on the CPU flavor, run on the GPU flavor's versions: exit
    0 on both hosts, the accuracy each example reaches on the CPU flavor, its model written."""
    _, model_file, accuracy = EXAMPLES[name]
    epochs = json.loads((REPO / "examples" / name / "job.json").read_text())["hyperparameters"]["epochs"]
    done, result = run_cluster(tmp_path / "job", "--job-file", str(REPO / "examples" / name / "job.json"),
                               "--checkpoint-dir", str(tmp_path / "checkpoints"),   # not the job file's, kept
                               "-p", f"epochs={epochs}", image=flavor_image("gpu"), timeout_s=900)
    log = done.stdout + done.stderr
    assert done.returncode == 0 and result["exit_code"] == 0, log[-6000:]
    finals = [float(a) for e, _, a in EPOCH_LINE.findall(log) if int(e) == epochs]
    assert finals and min(finals) >= accuracy, log[-4000:]
    assert (tmp_path / "job" / "algo-1" / "model" / model_file).is_file()


GENERATION_ROW = re.compile(r"^\| (?P<families>[^|]+) \| (?P<gpu>[^|]+) \((?P<cc>\d+\.\d+)\) \| (?P<cells>.+) \|$")


def generations_table() -> tuple[list[str], dict[tuple[int, int], dict[str, str]]]:
    """docs/image.md's GPU generations table: its component columns, and compute capability ->
    component -> the code the table says that GPU runs (``sm_80``, ``compute_90``)."""
    lines = (REPO / "docs" / "image.md").read_text().split("## GPU generations", 1)[1].splitlines()
    header = next(line for line in lines if line.startswith("| instance families"))
    components = [c.strip().lower() for c in header.strip("|").split("|")[2:]]
    rows = {}
    for line in lines:
        match = GENERATION_ROW.match(line)
        if match:
            cells = [c.strip().split(" ")[0] for c in match["cells"].split("|")]
            major, minor = match["cc"].split(".")
            rows[(int(major), int(minor))] = dict(zip(components, cells, strict=True))
    return components, rows


def test_the_gpu_architectures_the_image_carries_are_docs_tables():
    """Reads each component's cubins and PTX from the built image's libraries (the preflight's own
    reader, dtc_entrypoint.preflight.probe.library_targets) and checks that every GPU generation of
    docs/image.md runs the code the table says."""
    from dtc_entrypoint.preflight.fatbin import Target, runs_on

    code = "import json; from dtc_entrypoint.preflight import probe; print(json.dumps(probe.library_targets()))"
    done = container("run", "--rm", flavor_image("gpu"), "python", "-c", code, timeout_s=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = {name: {Target(arch, kind) for arch, kind in component["targets"]}
             for name, component in json.loads(done.stdout.strip().splitlines()[-1]).items()}
    components, rows = generations_table()
    assert set(components) == set(found) == {"torch", "tensorflow", "nccl", "dali", "horovod"}, (components, found)
    assert len(rows) == 9, rows
    wrong = {}
    for capability, cells in rows.items():
        for name, cell in cells.items():
            runs = runs_on(found[name], capability)
            if (str(runs) if runs else "none") != cell:
                wrong[(capability, name)] = (cell, str(runs))
    assert not wrong, f"docs/image.md says (table, image): {wrong}"
