"""The launcher and trainer records (dtc_entrypoint.launchers, dtc_train.trainers) and what reads
them: docs/strategies.md's strategy and ports tables, the option groups of dtc_train.config, the
entrypoint's table of built-in trainers, the SDK hyperparameters the local cluster writes."""

import re

from dtc_entrypoint import launchers, program
from dtc_local import cluster
from dtc_train import config, trainers
from helpers import REPO

STRATEGIES_MD = (REPO / "docs" / "strategies.md").read_text()


def _rows(header: str) -> list[list[str]]:
    """The cells of the markdown table whose header row starts with ``header``."""
    table = STRATEGIES_MD[STRATEGIES_MD.index(header):].split("\n\n")[0].splitlines()[2:]
    return [[cell.strip() for cell in row.strip().strip("|").split("|")] for row in table]


def test_the_strategy_table_has_each_launchers_flag_and_trainers():
    rows = _rows("| `distribution=` (SDK v2) |")
    assert len(rows) == len(launchers.BUILT_IN)
    for launcher in launchers.BUILT_IN:
        [row] = [r for r in rows if (r[1] == f"`{launcher.flag}`" if launcher.flag else r[0] == "none")]
        assert launcher.flag is None or f'"{launcher.strategy}"' in row[0], row
        for trainer in trainers.BUILT_IN:
            if launcher.strategy in trainer.strategies:
                assert trainer.module in row[-1], (launcher.strategy, trainer.module)


def test_the_ports_table_is_the_ports_of_the_records():
    documented = {(port, variable.strip("`"), used_by) for port, variable, used_by in _rows("| port | variable |")
                  if variable}
    declared = {(str(port.default), port.variable, port.used_by) for port in launchers.ports()}
    assert documented == declared


def test_the_option_groups_and_the_entrypoints_trainer_table_come_from_the_trainer_records():
    assert config.PYTORCH == {"pytorch_single", "pytorch_horovod", "pytorch_ddp"}
    assert config.TENSORFLOW == {"tensorflow_horovod", "tensorflow_mwms", "tensorflow_ps"}
    assert config.DALI == config.PYTORCH | {"tensorflow_horovod"}
    assert config.SYNCHRONOUS == config.ALL - {"tensorflow_ps"}
    assert program.builtin_trainers() == {
        "pytorch": {"single": "dtc_train.pytorch_single", "mpi": "dtc_train.pytorch_horovod",
                    "torch_distributed": "dtc_train.pytorch_ddp"},
        "tensorflow": {"single": "dtc_train.tensorflow_mwms", "mpi": "dtc_train.tensorflow_horovod",
                       "multi_worker_mirrored_strategy": "dtc_train.tensorflow_mwms",
                       "parameter_server": "dtc_train.tensorflow_ps"}}


def test_the_local_cluster_writes_what_each_launchers_record_says_sdk_v2_writes():
    assert cluster.DISTRIBUTIONS == ("none", "mpi", "torch_distributed", "multi_worker_mirrored_strategy",
                                     "parameter_server")
    for launcher in launchers.distributed():
        job = cluster.ClusterJob(image="", instance_count=2, processes_per_host=2, distribution=launcher.strategy,
                                 program="builtin:pytorch", instance_type="ml.g5.xlarge")
        written = cluster.distribution_hyperparameters(job)
        assert written[launcher.flag] is True and written["sagemaker_mpi_num_of_processes_per_host"] == 2
        assert ("sagemaker_instance_type" in written) == launcher.sdk_instance_type
        assert launchers.select(written, {}) == launcher.strategy


def test_a_launcher_record_names_no_port_variable_twice():
    variables = [port.variable for port in launchers.ports()]
    assert len(variables) == len(set(variables)) and all(re.fullmatch(r"DTC_[A-Z_]+_PORT", v) for v in variables)
