"""Sanity suite run inside the built image (tests/image/test_image.py starts it with pytest there).

Modelled on AWS DLC's in-container checks (image-build.md section 8): versions equal the pins,
a clean `pip check`, Horovod's build, imports, MPI, sshd, every shared object resolving, and
nothing left that should not be. In the GPU flavor also, without a GPU or driver: one CUDA
major and one copy of every CUDA library (one libnccl.so.2), Horovod's NCCL equal to torch's,
its kernels for every architecture we ship, and libfabric's EFA provider.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

import pytest

VERSIONS = Path("/opt/dtc/src/versions.env")
GPU = os.environ.get("FLAVOR") == "gpu"
gpu_flavor = pytest.mark.skipif(not GPU, reason="GPU flavor only")
SITE = Path(metadata.distribution("horovod").locate_file(""))


def pins() -> dict[str, str]:
    values = {}
    for line in VERSIONS.read_text().splitlines():
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            values[key] = value
    return values


def run(*argv: str, **kwargs) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=300, **kwargs).stdout


@pytest.mark.parametrize("distribution, key", [
    ("tensorflow", "TENSORFLOW_VERSION"), ("tf-keras", "TF_KERAS_VERSION"), ("horovod", "HOROVOD_VERSION"),
    ("mpi4py", "MPI4PY_VERSION"), ("sagemaker-training", "SAGEMAKER_TRAINING_VERSION"),
    ("nvidia-dali-cuda120", "DALI_VERSION"), ("nvidia-dali-tf-plugin-cuda120", "DALI_VERSION"),
    ("numpy", "NUMPY_VERSION"), ("protobuf", "PROTOBUF_VERSION"), ("ml-dtypes", "ML_DTYPES_VERSION"),
])
def test_versions_equal_the_pins(distribution, key):
    assert metadata.version(distribution) == pins()[key]


COMPANIONS = [("scipy", "SCIPY_VERSION"), ("pandas", "PANDAS_VERSION"), ("h5py", "H5PY_VERSION"),
              ("opencv-python-headless", "OPENCV_PYTHON_HEADLESS_VERSION"), ("boto3", "BOTO3_VERSION"),
              ("filelock", "FILELOCK_VERSION"), ("tqdm", "TQDM_VERSION"), ("pyyaml", "PYYAML_VERSION"),
              ("mlflow", "MLFLOW_VERSION"), ("sagemaker-mlflow", "SAGEMAKER_MLFLOW_VERSION"),
              ("deepspeed", "DEEPSPEED_VERSION")]


@pytest.mark.parametrize("distribution, key", COMPANIONS + ([("torchvision", "TORCHVISION_GPU_VERSION"),
                                                            ("torchaudio", "TORCHAUDIO_GPU_VERSION")] if GPU else []))
def test_companion_libraries_equal_the_pins(distribution, key):
    assert metadata.version(distribution) == pins()[key]


def patched_torchvision() -> bool:
    """Whether torchvision is PyPI's CUDA build, patched and repacked with build tag 1 (the CPU flavor
    built without PyTorch's CPU index: docker/install-python-packages.sh)."""
    return "Build: 1" in metadata.distribution("torchvision").read_text("WHEEL").splitlines()


def test_the_cpu_flavors_torchvision_is_pytorchs_cpu_build_or_pypis_patched_build():
    """PyPI's torchvision is a CUDA build that fails to import beside torch+cpu unpatched; the CPU flavor
    has the +cpu build where its build reached PyTorch's CPU index, else PyPI's, patched
    (docker/patches/torchvision; docs/versions.md, Companion libraries)."""
    version = metadata.version("torchvision")
    if GPU:
        assert version == pins()["TORCHVISION_GPU_VERSION"]
    elif version == pins()["TORCHVISION_VERSION"]:
        assert patched_torchvision()
    else:
        assert version == pins()["TORCHVISION_VERSION"] + "+cpu"


def test_torchvision_and_torchaudio_run_on_the_images_torch():
    """A torchvision model and its compiled op (nms; the patched CPU build has none and says so in
    torchvision's own words), and a torchaudio transform, on the CPU."""
    lines = ["import torch, torchvision",
             "m = torchvision.models.resnet18(num_classes=3).eval()",
             "assert m(torch.zeros(1, 3, 64, 64)).shape == (1, 3)",
             "boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.], [20., 20., 30., 30.]])",
             "nms = lambda: torchvision.ops.nms(boxes, torch.tensor([0.9, 0.8, 0.7]), 0.5).tolist()"]
    if not GPU and patched_torchvision():
        lines += ["try:", "    nms()",
                  "except RuntimeError as e:", "    assert str(e).startswith(\"Couldn't load custom C++ ops\"), e",
                  "else:", "    raise AssertionError('nms ran without compiled ops')"]
    else:
        lines += ["assert nms() == [0, 2]"]
    if GPU:
        lines += ["import torchaudio",
                  "x = torchaudio.transforms.MelSpectrogram(16000, n_mels=40)(torch.ones(1, 16000))",
                  "assert x.shape[:2] == (1, 40)"]
    code = "\n".join(lines)
    run("python", "-c", code)


def test_deepspeeds_cpu_op_is_prebuilt_for_this_torch_and_loads_without_a_compiler():
    """DeepSpeed loads deepspeed_shm_comm on every CPU init_distributed; the runtime image has no
    compiler, so it must be the one docker/install-deepspeed.sh built, for this torch."""
    code = ("from deepspeed.git_version_info import installed_ops, torch_info; import torch; "
            "assert installed_ops['deepspeed_shm_comm'], installed_ops; "
            "assert torch_info['version'] == '.'.join(torch.__version__.split('.')[:2]), torch_info; "
            "from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder; ShareMemCommBuilder().load()")
    run("python", "-c", code, env={**os.environ, "DS_ACCELERATOR": "cpu"})


def test_data_libraries_round_trip(tmp_path):
    """pandas, h5py, OpenCV and scipy on real data: written, read back, equal."""
    code = f"""
import cv2, h5py, numpy as np, pandas as pd, scipy.ndimage
frame = pd.DataFrame({{"x": [1, 2, 3]}}); frame.to_csv("{tmp_path}/f.csv", index=False)
assert pd.read_csv("{tmp_path}/f.csv")["x"].sum() == 6
with h5py.File("{tmp_path}/d.h5", "w") as f: f["a"] = np.arange(6)
with h5py.File("{tmp_path}/d.h5") as f: assert f["a"][:].sum() == 15
image = np.zeros((8, 8, 3), np.uint8); image[2:6, 2:6] = 255
assert cv2.imwrite("{tmp_path}/i.png", image) and (cv2.imread("{tmp_path}/i.png") == image).all()
assert cv2.resize(image, (4, 4)).shape == (4, 4, 3)
assert scipy.ndimage.label(image[..., 0] > 0)[1] == 1
"""
    run("python", "-c", code)


def test_mlflow_logs_runs_and_resolves_sagemaker_tracking_server_arns(tmp_path):
    """mlflow records a run in a local SQLite store and reads it back; a tracking URI that is a
    SageMaker tracking server's ARN gets sagemaker-mlflow's store, pointed at SageMaker's MLflow
    endpoint of the ARN's region (requests then need AWS credentials and the server: not made)."""
    code = f"""
import mlflow
mlflow.set_tracking_uri("sqlite:///{tmp_path}/mlflow.db")
with mlflow.start_run() as run:
    mlflow.log_metric("val_accuracy", 0.97, step=3)
assert mlflow.get_run(run.info.run_id).data.metrics == {{"val_accuracy": 0.97}}
from mlflow.tracking._tracking_service.utils import _tracking_store_registry
store = _tracking_store_registry.get_store("arn:aws:sagemaker:us-west-2:123456789012:mlflow-tracking-server/dtc")
assert type(store).__module__.startswith("sagemaker_mlflow"), type(store)
assert store.get_host_creds().host == "https://us-west-2.experiments.sagemaker.aws", store.get_host_creds().host
"""
    run("python", "-c", code, env={**os.environ, "AWS_DEFAULT_REGION": "us-west-2"})


def test_a_pip_constraint_file_protects_the_compiled_builds():
    """/etc/pip/constraint.txt (PIP_CONSTRAINT) pins every build compiled against another at the
    installed version; pip refuses another version, and a bare name installs nothing."""
    assert os.environ["PIP_CONSTRAINT"] == "/etc/pip/constraint.txt"
    pinned = {}
    for line in Path("/etc/pip/constraint.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pinned[name] = version
    installed = {re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower(): d.version for d in metadata.distributions()}
    for name in ("torch", "tensorflow", "tf-keras", "horovod", "mpi4py", "deepspeed", "numpy", "nvidia-dali-cuda120",
                 "nvidia-dali-tf-plugin-cuda120", "torchvision") + (("torchaudio", "triton", "nvidia-nccl-cu12") if GPU
                                                                    else ()):
        assert pinned.get(name) == installed[name], name
    for name, version in pinned.items():
        assert installed.get(name) == version, (name, version)
    env = {**os.environ, "PIP_NO_INDEX": "1"}
    refused = subprocess.run(["python", "-m", "pip", "install", "numpy==1.26.4"], capture_output=True, text=True,
                             env=env, timeout=120)
    pinned_line = f"The user requested (constraint) numpy=={installed['numpy']}"
    assert refused.returncode != 0 and pinned_line in refused.stdout + refused.stderr
    named = subprocess.run(["python", "-m", "pip", "install", "torch", "horovod", "numpy"], capture_output=True,
                           text=True, env=env, timeout=120)
    assert named.returncode == 0 and "Successfully installed" not in named.stdout, named.stdout + named.stderr


def test_torch_is_the_flavors_build():
    expected = pins()["TORCH_GPU_VERSION"] if GPU else pins()["TORCH_VERSION"] + "+cpu"
    assert metadata.version("torch") == expected


def _shared_objects(*patterns: str) -> list[Path]:
    found = [p for pattern in patterns for p in SITE.glob(pattern)]
    assert found, patterns
    return found


def test_every_shared_object_of_horovod_mpi4py_and_the_dali_plugin_resolves():
    """`ldd` without LD_LIBRARY_PATH: nothing missing, nothing from a stubs directory."""
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    for path in _shared_objects("horovod/**/*.so", "mpi4py/**/*.so", "nvidia/dali/plugin/tf/**/*.so"):
        out = run("ldd", str(path), env=env)
        assert "not found" not in out and "/stubs/" not in out, f"{path}:\n{out}"


def test_pip_check_is_clean():
    run("python", "-m", "pip", "check")


def test_the_environment_is_the_builder_stages_lock():
    """The runtime stage installs /opt/dtc/requirements.lock (docker/lock-environment.py wrote it
    in the builder stage): exactly those distributions at those versions, nothing else."""
    lock, local = set(), set()
    for line in Path("/opt/dtc/requirements.lock").read_text().splitlines():
        if line.startswith(("#", "-")):
            continue
        requirement, hash_ = line.split(" --hash=sha256:")     # every line has its wheel's sha256
        assert re.fullmatch(r"[0-9a-f]{64}", hash_), line
        if " @ file://" in requirement:    # a wheel the builder compiled: name @ file:///opt/dtc/wheels/<name>-<version>-...
            name, wheel = requirement.split(" @ file://")
            lock.add(f"{name}=={Path(wheel).name.split('-')[1]}")
            local.add(name)
        else:
            lock.add(requirement)
    installed = {f"{re.sub(r'[-_.]+', '-', d.metadata['Name']).lower()}=={d.version}"
                 for d in metadata.distributions() if d.metadata["Name"] != "dtc"}
    assert len(lock) > 50 and installed == lock, (sorted(installed - lock), sorted(lock - installed))
    assert {"horovod", "mpi4py", "deepspeed", "sagemaker-training", "nvidia-dali-tf-plugin-cuda120"} <= local, local


def test_the_sbom_is_what_pip_and_dpkg_list_with_each_wheels_sha256():
    """/opt/dtc/sbom.cdx.json (docker/sbom.py): every distribution `pip list` shows and every package
    `dpkg -l` shows as installed, at their versions, nothing missing and nothing extra; each Python
    one with the sha256 the lock installed it by; what was built here with its sources and patches;
    the pins' release dates."""
    bom = json.loads(Path("/opt/dtc/sbom.cdx.json").read_text())
    assert (bom["bomFormat"], bom["specVersion"], bom["metadata"]["component"]["name"]) == ("CycloneDX", "1.6", "dtc")
    def canonical(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()
    python = {c["purl"]: c for c in bom["components"] if c["purl"].startswith("pkg:pypi/")}
    debian = {c["purl"]: c for c in bom["components"] if c["purl"].startswith("pkg:deb/")}
    assert len(python) + len(debian) == len(bom["components"])
    pip_list = {(canonical(d["name"]), d["version"])
                for d in json.loads(run("python", "-m", "pip", "list", "--format", "json")) if d["name"] != "dtc"}
    assert {(canonical(c["name"]), c["version"]) for c in python.values()} == pip_list
    dpkg = set()
    for line in run("dpkg", "-l").splitlines():
        if line.startswith("ii "):
            _, package, version = line.split()[:3]
            dpkg.add((package.split(":")[0], version))
    assert len(dpkg) > 50 and {(c["name"], c["version"]) for c in debian.values()} == dpkg
    hashes = {}
    for line in Path("/opt/dtc/requirements.lock").read_text().splitlines():
        if not line.startswith(("#", "-")):
            hashes[canonical(re.split(r"[ =]", line, maxsplit=1)[0])] = line.rsplit("--hash=sha256:", 1)[1]
    assert {canonical(c["name"]): c["hashes"] for c in python.values()} == {
        name: [{"alg": "SHA-256", "content": digest}] for name, digest in hashes.items()}
    by_name = {canonical(c["name"]): c for c in python.values()}
    built = {name for name, c in by_name.items() if any(p["name"] == "dtc:built-by" for p in c.get("properties", []))}
    assert {"horovod", "mpi4py", "deepspeed", "sagemaker-training", "nvidia-dali-tf-plugin-cuda120"} <= built, built
    patches = sorted(Path("/opt/dtc/src/docker/patches").glob("*.patch")) + (
        sorted(Path("/opt/dtc/src/docker/patches/gpu").glob("*.patch")) if GPU else [])
    assert [p["diff"]["text"]["content"] for p in by_name["horovod"]["pedigree"]["patches"]] == [
        p.read_text() for p in patches]
    assert {"type": "source-distribution", "url": f"https://pypi.org/project/horovod/{pins()['HOROVOD_VERSION']}/#files",
            "comment": "built here by docker/build-horovod.sh"} in by_name["horovod"]["externalReferences"]
    released = {p["value"] for p in by_name["tensorflow"]["properties"] if p["name"] == "dtc:pin:released"}
    assert released == {f"{pins()['TENSORFLOW_VERSION_RELEASED']} (TENSORFLOW_VERSION={pins()['TENSORFLOW_VERSION']}, "
                        "versions.env)"}


def test_every_component_of_the_sbom_has_its_license_and_its_text_in_opt_dtc_licenses():
    """/opt/dtc/licenses (dtc_local.licenses, the build's last step): a manifest row for each
    component of the SBOM, with where its source is and its license, and its license text shipped
    (or, where its wheel has none, the text_url accepted_licenses.toml gives)."""
    bom = json.loads(Path("/opt/dtc/sbom.cdx.json").read_text())
    root = Path("/opt/dtc/licenses")
    rows = json.loads((root / "manifest.json").read_text())
    assert sorted((r["name"], r["version"]) for r in rows) == sorted(
        (c["name"], c["version"]) for c in bom["components"])
    for row in rows:
        assert row["source"].startswith("https://") and row["kind"] in ("python", "debian"), row
        assert row["files"] or row["text_url"].startswith("https://"), row
        assert all((root / name).stat().st_size > 0 for name in row["files"]), row
        assert row["license"] or row["kind"] == "debian", row   # a Debian copyright file that is not DEP-5 names none
    assert sum(not row["files"] for row in rows) <= 2
    assert {r["name"]: r["license"] for r in rows}["tensorflow"] == "License :: OSI Approved :: Apache Software License"


def test_horovod_check_build():
    out = run("horovodrun", "--check-build")
    wanted = ["TensorFlow", "PyTorch", "MPI", "Gloo"] + (["NCCL"] if os.environ["FLAVOR"] == "gpu" else [])
    for name in wanted:
        assert re.search(rf"\[X\] {name}\b", out), out


@pytest.mark.parametrize("module", [
    "tensorflow", "torch", "horovod.tensorflow", "horovod.tensorflow.keras", "horovod.torch", "mpi4py.MPI",
    "nvidia.dali", "nvidia.dali.plugin.tf", "nvidia.dali.plugin.pytorch", "sagemaker_training.environment",
    "dtc_entrypoint.cli", "dtc_train.dali_data", "pandas", "scipy", "sklearn", "h5py", "cv2", "boto3", "tqdm",
    "yaml", "filelock", "mlflow", "sagemaker_mlflow", "deepspeed",
])
def test_imports(module):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    run("python", "-c", f"import {module}", env=env)


@pytest.mark.parametrize("code", [
    "import horovod.torch as h, torch; h.init(); s = int(h.allreduce(torch.tensor([h.rank() + 1]), op=h.Sum))",
    "import horovod.tensorflow as h, tensorflow as tf; h.init(); "
    "s = int(h.allreduce(tf.constant([h.rank() + 1]), op=h.Sum)[0])",
], ids=["torch", "tensorflow"])
def test_horovod_allreduce_on_two_ranks(code):
    # one write per rank (print writes the value and the newline apart, which mpirun may interleave)
    out = run("mpirun", "-np", "2", "-x", "TF_CPP_MIN_LOG_LEVEL=3", "python", "-c",
              code + "; import sys; sys.stdout.write(f'sum={s}\\n')")
    assert out.split() == ["sum=3", "sum=3"]


def test_mpirun_wrapper_and_openmpi_version():
    assert "--allow-run-as-root" in Path("/usr/local/bin/mpirun").read_text()
    assert shutil.which("mpirun") == "/usr/local/bin/mpirun"
    info = run("ompi_info", "--parsable")
    assert f"ompi:version:full:{pins()['OPENMPI_VERSION']}" in info.splitlines()
    assert shutil.which("orted")


def test_sshd_is_ready_for_multi_host_mpi():
    config = run("/usr/sbin/sshd", "-T")
    settings = dict(line.split(" ", 1) for line in config.splitlines() if " " in line)
    assert settings["port"] == "22"
    assert settings["permitrootlogin"] in ("without-password", "prohibit-password")
    assert settings["passwordauthentication"] == "no"
    assert list(Path("/etc/ssh").glob("ssh_host_*_key"))
    # the key only from the job's hosts: no authorized_keys file; sshd asks dtc-authorized-keys,
    # which outside a training job (no resourceconfig.json here) allows the loopback only
    assert not Path("/root/.ssh/authorized_keys").exists()
    assert settings["authorizedkeysfile"] == "none"
    assert settings["authorizedkeyscommand"] == "/opt/dtc/venv/bin/dtc-authorized-keys %u"
    public_key = Path("/root/.ssh/id_ed25519.pub").read_text().strip()
    assert Path("/etc/ssh/dtc_job_key.pub").read_text().strip() == public_key
    assert run("dtc-authorized-keys", "root").strip() == f'from="127.0.0.1,::1" {public_key}'
    assert "StrictHostKeyChecking no" in Path("/root/.ssh/config").read_text()
    assert "session optional pam_loginuid.so" in Path("/etc/pam.d/sshd").read_text()


def test_opt_ml_code_is_empty():
    assert not any(Path("/opt/ml/code").iterdir())


def test_no_compilers_in_the_runtime_image():
    assert [c for c in ("gcc", "g++", "cc", "c++", "clang", "nvcc", "cicc") if shutil.which(c)] == []
    assert not Path("/usr/local/cuda").exists()      # the GPU builder's CUDA toolkit stays there
    # Debian's openmpi-bin ships the mpicc wrapper; with no compiler behind it, it cannot compile.
    if shutil.which("mpicc"):
        assert subprocess.run(["mpicc", "--version"], capture_output=True).returncode != 0


def test_no_build_ca_or_pip_config_left():
    assert not Path("/run/secrets/pip_ca").exists()
    assert not Path("/etc/pip.conf").exists() and "PIP_CERT" not in os.environ


# ------------------------------------------------------------------- GPU flavor, no GPU needed
# A CUDA library's file name, auditwheel's renamed copies (libcudart.e8e8b82a.so.12) included.
CUDA_LIBRARY = re.compile(r"^lib(cudart|cublas|cublasLt|cudnn\w*|cufft\w*|curand|cusolver\w*|cusparse\w*|nccl|"
                          r"nvrtc\w*|nvJitLink|nvjpeg\w*|cupti|nvperf_\w+|pcsamplingutil|nvToolsExt|nvvm)"
                          r"(\.[0-9a-f]{8})?\.so(\.[\d.]+)?$")
# PyPI's torchvision bundles its own libcudart and libnvjpeg (auditwheel-renamed and patched, so
# not byte-identical to the nvidia-* wheels' and not replaceable by links): the one exception
# (docs/versions.md, The GPU flavor).
BUNDLED_COPIES = "/torchvision.libs/"


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@gpu_flavor
def test_one_copy_of_every_cuda_library_and_exactly_one_libnccl():
    """By name (one file per library and major version) and by content (no byte-identical copy
    under another name or directory, as triton's bundled CUPTI was before it was linked)."""
    by_name: dict[str, list[str]] = {}
    by_content: dict[str, list[str]] = {}
    for root in ("/opt", "/usr"):
        for directory, _, files in os.walk(root):
            for name in files:
                path = os.path.join(directory, name)
                if (match := CUDA_LIBRARY.match(name)) and not os.path.islink(path) and BUNDLED_COPIES not in path:
                    version = (match.group(3) or "").split(".")[:2]
                    by_name.setdefault(f"lib{match.group(1)}.so{'.'.join(version)}", []).append(path)
                    by_content.setdefault(_sha256(path), []).append(path)
    assert len(by_name.get("libnccl.so.2", [])) == 1, by_name.get("libnccl.so.2")
    assert len(by_name) >= 15, sorted(by_name)
    twice = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert not twice, twice
    copies = [paths for paths in by_content.values() if len(paths) > 1]
    assert not copies, copies


@gpu_flavor
def test_no_distribution_of_another_cuda_major():
    major = pins()["CUDA_MAJOR"]
    names = {d.metadata["Name"].lower() for d in metadata.distributions()}
    tagged = {n: m.group(1) or m.group(2) for n in names if (m := re.search(r"-cu(\d+)$|-cuda(\d\d)\d$", n))}
    assert len(tagged) >= 10 and set(tagged.values()) == {major}, tagged


@gpu_flavor
def test_horovods_nccl_is_torchs_nccl():
    code = ("import torch, horovod.torch as h, horovod.tensorflow as ht; "
            "v = torch.cuda.nccl.version(); print(h.nccl_built(), ht.nccl_built(), v[0] * 10000 + v[1] * 100 + v[2])")
    quiet = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    horovod_torch, horovod_tf, torch_nccl = run("python", "-c", code, env=quiet).split()
    major, minor, patch = (int(x) for x in pins()["NCCL_VERSION"].split("."))
    assert horovod_torch == horovod_tf == torch_nccl == str(major * 10000 + minor * 100 + patch)


@gpu_flavor
def test_horovod_links_the_shared_nccl_of_torchs_wheel():
    nccl = SITE / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
    for path in _shared_objects("horovod/torch/*.so", "horovod/tensorflow/*.so"):
        resolved = re.search(r"libnccl\.so\.2 => (\S+)", run("ldd", str(path)))
        assert resolved and os.path.realpath(resolved.group(1)) == str(nccl), (path, resolved)


@gpu_flavor
def test_horovods_cuda_kernels_cover_every_architecture_we_ship():
    cuobjdump = shutil.which("cuobjdump") or str(SITE / "triton" / "backends" / "nvidia" / "bin" / "cuobjdump")
    wanted = {f"sm_{cc}" for cc in pins()["HOROVOD_CUDA_CC_LIST"].split(",")}
    for path in _shared_objects("horovod/torch/*.so", "horovod/tensorflow/*.so"):
        listed = set(re.findall(r"sm_\d+", run(cuobjdump, "--list-elf", str(path))))
        assert wanted <= listed, f"{path}: {sorted(listed)}"


@gpu_flavor
def test_torch_and_tensorflow_were_built_for_the_same_cuda_major():
    code = ("import torch, tensorflow as tf; "
            "print(torch.version.cuda.split('.')[0], tf.sysconfig.get_build_info()['cuda_version'].split('.')[0])")
    quiet = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    assert run("python", "-c", code, env=quiet).split() == [pins()["CUDA_MAJOR"]] * 2


@gpu_flavor
def test_horovod_initialises_without_a_driver_in_both_frameworks():
    code = ("import horovod.torch as h, horovod.tensorflow as ht; h.init(); ht.init(); "
            "assert h.cuda_built() and h.nccl_built() and ht.cuda_built(); print(h.size(), ht.size())")
    assert run("python", "-c", code, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}).split() == ["1", "1"]


@gpu_flavor
def test_libfabric_has_its_efa_provider():
    out = run("ldd", "/usr/lib/x86_64-linux-gnu/libfabric.so.1")
    assert re.search(r"libefa\.so\.1 => /\S+", out), out


def test_gpu_check_without_a_gpu_checks_nothing_and_says_so():
    done = subprocess.run(["gpu-check"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stdout + done.stderr
    assert done.stderr.startswith("gpu-check: no NVIDIA GPU is visible here (nvidia-smi lists none): nothing was "
                                  "checked."), done.stderr


def test_the_preflight_probe_reads_every_component_of_the_image(tmp_path):
    """The probe as train runs it on one host (no GPU here: no GPU checks), and the compiled GPU
    architectures it reads: the GPU flavor's five components; in the CPU flavor the two whose PyPI
    wheels carry device code whatever the flavor (TensorFlow's and DALI's). Nothing fails; /dev/shm
    warns when this container has less than 1 GiB (the engine's default is 64 MB)."""
    import json

    from dtc_entrypoint.preflight import probe

    done = subprocess.run(["python", "-m", "dtc_entrypoint.preflight.probe", "--host", "algo-1", "--hosts", "algo-1",
                           "--master", "algo-1", "--port", "2227", "--workdir", str(tmp_path), "--out",
                           str(tmp_path / "preflight.json")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    record = json.loads((tmp_path / "preflight.json").read_text())
    findings = record["summaries"]["algo-1"]["findings"]
    assert record["verdict"] != "fail" and {f["check"] for f in findings} == {"driver", "shm", "efa"}, findings
    small_shm = shutil.disk_usage("/dev/shm").total < 1 << 30
    assert [f["check"] for f in findings if f["status"] == "warn"] == (["shm"] if small_shm else []), findings
    expected = ["dali", "horovod", "nccl", "tensorflow", "torch"] if GPU else ["dali", "tensorflow"]
    assert sorted(probe.library_targets()) == expected
