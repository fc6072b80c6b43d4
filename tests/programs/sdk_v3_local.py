"""Runs a training job with SageMaker Python SDK v3's local container mode, as a user would:
``ModelTrainer(training_mode=Mode.LOCAL_CONTAINER, training_image=...)``, ``.train()`` with
local channels. Without ``--driver`` the job has no ``source_code`` and the image's own
``train`` runs a built-in trainer named in the hyperparameters; with ``--driver torchrun|mpi``
the SDK's own drivers (from its package, mounted into the container) run the user's
``train.py`` from ``--source-dir``.

Run with the SDK's own interpreter (``.venv/sdk-v3/bin/python``). Prints one JSON line with
the container root, where the SDK leaves ``compressed_artifacts/model.tar.gz``.
"""

import json
import logging
import os

import sdk_job_args
from sagemaker.train.configs import Compute, InputData, SourceCode
from sagemaker.train.distributed import MPI, Torchrun
from sagemaker.train.model_trainer import Mode, ModelTrainer

parser = sdk_job_args.parser(__doc__.split("\n\n")[0])
parser.add_argument("--driver", choices=("none", "torchrun", "mpi"), default="none")
args = parser.parse_args()
logging.basicConfig(level=logging.INFO)
os.makedirs(args.work, exist_ok=True)

options = {}
if args.driver == "none":
    hyperparameters = {"sagemaker_program": "builtin:pytorch", "sagemaker_mpi_enabled": "true",
                       "sagemaker_mpi_num_of_processes_per_host": str(args.processes_per_host),
                       "epochs": str(args.epochs)}
else:
    hyperparameters = {"epochs": str(args.epochs)}
    options["source_code"] = SourceCode(source_dir=args.source_dir, entry_script="train.py")
    options["distributed"] = (Torchrun(process_count_per_node=args.processes_per_host) if args.driver == "torchrun"
                              else MPI(process_count_per_node=args.processes_per_host))
trainer = ModelTrainer(
    training_mode=Mode.LOCAL_CONTAINER, training_image=args.image, local_container_root=args.work,
    role="arn:aws:iam::123456789012:role/SageMakerRole", base_job_name="dtc-v3",
    compute=Compute(instance_type="local_cpu", instance_count=args.instance_count),
    hyperparameters=hyperparameters, **options)
trainer.train(input_data_config=[InputData(channel_name="training", data_source=f"{args.data}/training"),
                                 InputData(channel_name="validation", data_source=f"{args.data}/validation")])
print(json.dumps({"container_root": args.work}))
