"""Prints the hyperparameters.json the SageMaker Python SDK v2 writes for each `distribution=`
this image handles or refuses, as JSON (the source of tests/fixtures/sdk_v2_hyperparameters.json).

(Heterogeneous instance groups are left out: `hyperparameters()` does not carry
`sagemaker_distribution_instance_groups`, which the SDK adds when the job is created; tests write
that case by hand.) Needs `pip install "sagemaker>=2.250,<3"` (not part of the test environment) and no network:
    AWS_DEFAULT_REGION=us-east-1 python scripts/sdk-v2-hyperparameters.py > tests/fixtures/sdk_v2_hyperparameters.json
Framework estimators JSON-encode every value (EstimatorBase._json_encode_hyperparameters); the
generic Estimator without source_dir sends str(value) (_TrainingJob._get_train_args).
"""

import json
import os
import sys

RESULT = sys.stdout
sys.stdout = sys.stderr   # the SDK logs its config lookup to stdout; keep stdout for the JSON
os.environ.setdefault("AWS_ACCESS_KEY_ID", "x")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "x")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

import sagemaker  # noqa: E402
from sagemaker.estimator import Estimator  # noqa: E402
from sagemaker.pytorch import PyTorch  # noqa: E402
from sagemaker.tensorflow import TensorFlow  # noqa: E402

ROLE = "arn:aws:iam::111122223333:role/SageMakerRole"
IMAGE = "111122223333.dkr.ecr.us-east-1.amazonaws.com/dtc:cpu"


def framework(cls, distribution, instance_type="ml.p4d.24xlarge", **kwargs):
    common = dict(entry_point="train.py", image_uri=IMAGE, role=ROLE, sagemaker_session=SESSION,
                  hyperparameters={"epochs": 3}, distribution=distribution, py_version="py311")
    if "instance_groups" not in kwargs:
        common.update(instance_count=2, instance_type=instance_type)
    common.update(kwargs)
    return cls(**common).hyperparameters()


SESSION = sagemaker.Session()
PT = dict(framework_version="2.3")
TF = dict(framework_version="2.16")
cases = {
    "pytorch_mpi": framework(PyTorch, {"mpi": {"enabled": True, "processes_per_host": 2,
                                               "custom_mpi_options": "-x A=1"}}, **PT),
    "pytorch_torch_distributed": framework(PyTorch, {"torch_distributed": {"enabled": True}}, **PT),
    "pytorch_pytorchddp": framework(PyTorch, {"pytorchddp": {"enabled": True}}, **PT),
    "pytorch_smddp": framework(PyTorch, {"smdistributed": {"dataparallel": {"enabled": True}}}, **PT),
    "tensorflow_mpi": framework(TensorFlow, {"mpi": {"enabled": True, "processes_per_host": 2}}, **TF),
    "tensorflow_multi_worker_mirrored_strategy": framework(
        TensorFlow, {"multi_worker_mirrored_strategy": {"enabled": True}}, **TF),
    "tensorflow_parameter_server": framework(TensorFlow, {"parameter_server": {"enabled": True}}, **TF),
}
generic = Estimator(image_uri=IMAGE, role=ROLE, instance_count=2, instance_type="ml.c5.xlarge",
                    sagemaker_session=SESSION, hyperparameters={
                        "sagemaker_program": "builtin:pytorch", "sagemaker_mpi_enabled": True,
                        "sagemaker_mpi_num_of_processes_per_host": 2, "epochs": 3, "flag": False})
cases["generic_estimator_mpi"] = {k: str(v) for k, v in generic.hyperparameters().items()}
json.dump({"sdk": sagemaker.__version__, "cases": cases}, RESULT, indent=2, sort_keys=True)
RESULT.write("\n")
