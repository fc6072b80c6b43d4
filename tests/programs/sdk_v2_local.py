"""Runs a training job with SageMaker Python SDK v2's local mode, the way a user rehearses one:
``Estimator(image_uri=..., instance_type="local")`` and ``.fit()`` with ``file://`` channels.
The SDK writes the /opt/ml trees and its compose file, starts the containers through the
Docker API in DOCKER_HOST, and packs model.tar.gz / output.tar.gz into ``output_path``.

Run with the SDK's own interpreter (``.venv/sdk-v2/bin/python``), e.g.
``sdk_v2_local.py --image dtc:cpu --instance-count 2 --estimator pytorch --data DIR --work DIR``.
Prints one JSON line: the job name, model_data and output_path.
"""

import json
import logging
import os

import sdk_job_args
from sagemaker.estimator import Estimator
from sagemaker.local import LocalSession
from sagemaker.pytorch import PyTorch

parser = sdk_job_args.parser(__doc__.split("\n\n")[0])
parser.add_argument("--estimator", choices=("generic", "pytorch"), default="generic")
args = parser.parse_args()
logging.basicConfig(level=logging.INFO)

os.makedirs(f"{args.work}/containers", exist_ok=True)
session = LocalSession()
session.config = {"local": {"local_code": True, "container_root": f"{args.work}/containers"}}
common = dict(image_uri=args.image, role="arn:aws:iam::123456789012:role/SageMakerRole",
              instance_count=args.instance_count, instance_type="local", sagemaker_session=session,
              output_path=f"file://{args.work}/output",
              metric_definitions=[{"Name": "validation:accuracy", "Regex": r"val_accuracy=([0-9.]+)"}])
mpi = {"mpi": {"enabled": True, "processes_per_host": args.processes_per_host}}
if args.estimator == "generic":
    # A built-in trainer with no source code: the hyperparameters name it and MPI.
    estimator = Estimator(hyperparameters={
        "sagemaker_program": "builtin:pytorch", "sagemaker_mpi_enabled": True,
        "sagemaker_mpi_num_of_processes_per_host": args.processes_per_host, "epochs": args.epochs}, **common)
else:
    # A framework estimator in script mode: the user's train.py from source_dir, under MPI.
    estimator = PyTorch(entry_point="train.py", source_dir=args.source_dir, framework_version="2.3",
                        py_version="py310", distribution=mpi, hyperparameters={"epochs": args.epochs}, **common)
estimator.fit({"training": f"file://{args.data}/training", "validation": f"file://{args.data}/validation"})
print(json.dumps({"job_name": estimator.latest_training_job.name, "model_data": estimator.model_data,
                  "output_path": estimator.output_path}))
