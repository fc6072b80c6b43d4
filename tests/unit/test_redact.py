"""Secret-looking values masked in argv and environments (dtc_entrypoint.redact); what `train`
logs: tests/integration/test_logging.py."""


import pytest

from dtc_entrypoint import redact


@pytest.mark.parametrize("argv, shown", [
    (["--db_password", "hunter2", "--lr", "0.1"], ["--db_password", "****", "--lr", "0.1"]),
    (["--api-key=abc", "--epochs=3"], ["--api-key=****", "--epochs=3"]),
    (["env", "AWS_SECRET_ACCESS_KEY=abc", "python"], ["env", "AWS_SECRET_ACCESS_KEY=****", "python"]),
    (["--token", "-5"], ["--token", "****"]),
    (["--use-token", "--lr", "1"], ["--use-token", "--lr", "1"]),     # a flag without a value
    (["-x", "HOROVOD_FUSION_THRESHOLD", "-x", "SM_HP_DB_PASSWORD"],
     ["-x", "HOROVOD_FUSION_THRESHOLD", "-x", "SM_HP_DB_PASSWORD"]),  # names only: nothing to mask
])
def test_redact_argv(argv, shown):
    assert redact.redact_argv(argv) == shown


def test_redact_env_masks_names_and_json_inside():
    env = {"SM_HP_DB_PASSWORD": "hunter2", "SM_HPS": '{"db_password": "hunter2", "lr": 0.1}',
           "SM_USER_ARGS": '["--db_password", "hunter2"]', "PATH": "/usr/bin", "SM_NUM_GPUS": "0"}
    shown = redact.redact_env(env)
    assert "hunter2" not in str(shown)
    assert shown["PATH"] == "/usr/bin" and shown["SM_NUM_GPUS"] == "0"
    assert '"lr": 0.1' in shown["SM_HPS"]
