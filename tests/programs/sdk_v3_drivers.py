"""Writes the ``sm_drivers`` channel SDK v3 uploads for a ``ModelTrainer`` with ``source_code``
and ``distributed=MPI(...)`` or ``Torchrun(...)``, made by the SDK's own code
(``ModelTrainer._prepare_train_script``, ``_write_source_code_json``, ``_write_distributed_json``
and its ``container_drivers`` package, as ``ModelTrainer._create_training_job`` assembles
them), so that a real cluster can run the SDK's drivers as SageMaker would: the container's
command is then ``/bin/bash -c "chmod +x .../sm_train.sh && .../sm_train.sh"``
(``sagemaker.train.constants.DEFAULT_CONTAINER_ARGUMENTS``, printed).

SDK v3's local container mode runs the same files, but names the network interface ``ethwe``
in every container's resourceconfig, which no local container has (docs/sdk.md); this is how
the MPI driver is run here outside local mode.

Run with the SDK's own interpreter: ``.venv/sdk-v3/bin/python sdk_v3_drivers.py OUT --driver mpi
--source-dir SRC --processes-per-host 2``. Prints one JSON line: the channel and the command.
"""

import argparse
import json
import os
import shutil
import warnings
from types import SimpleNamespace

import sagemaker.core.utils.install_requirements as install_requirements
from sagemaker.train import constants
from sagemaker.train.distributed import MPI, Torchrun
from sagemaker.train.model_trainer import Mode, ModelTrainer

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from sagemaker.train.configs import Compute, SourceCode

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("out", help="the sm_drivers channel's directory (created)")
parser.add_argument("--driver", choices=("mpi", "torchrun"), required=True)
parser.add_argument("--source-dir", required=True, help="the user's code, with train.py")
parser.add_argument("--instance-count", type=int, default=2)
parser.add_argument("--processes-per-host", type=int, default=2)
args = parser.parse_args()

distributed = (MPI if args.driver == "mpi" else Torchrun)(process_count_per_node=args.processes_per_host)
source_code = SourceCode(source_dir=args.source_dir, entry_script="train.py")
trainer = ModelTrainer(training_mode=Mode.LOCAL_CONTAINER, training_image="unused", source_code=source_code,
                       role="arn:aws:iam::123456789012:role/SageMakerRole", distributed=distributed,
                       compute=Compute(instance_type="local_cpu", instance_count=args.instance_count))
# the steps of ModelTrainer._create_training_job for source_code + distributed, in its order
shutil.copytree(constants.SM_DRIVERS_LOCAL_PATH, args.out, dirs_exist_ok=True)
shutil.copy2(install_requirements.__file__, os.path.join(args.out, "scripts", "install_requirements.py"))
shutil.copytree(distributed.driver_dir, os.path.join(args.out, "distributed_drivers"), dirs_exist_ok=True)
channel = SimpleNamespace(name=args.out)    # the TemporaryDirectory the SDK passes
trainer._prepare_train_script(tmp_dir=channel, source_code=source_code, distributed=distributed)
trainer._write_source_code_json(tmp_dir=channel, source_code=source_code)
trainer._write_distributed_json(tmp_dir=channel, distributed=distributed)
print(json.dumps({"sm_drivers": args.out,
                  "command": constants.DEFAULT_CONTAINER_ENTRYPOINT + constants.DEFAULT_CONTAINER_ARGUMENTS}))
