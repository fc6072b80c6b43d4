"""What `train` logs: secret-looking values masked everywhere it prints a command line, and a
program's partial lines (progress bars) relayed as they are written."""

import os
import select
import subprocess
import time

import pytest

from conftest import BIN, copy_programs, read_json, run_train
from dtc_entrypoint import redact

SECRETS = {"db_password": "hunter2", "api-key": "k3y-v4lue", "HF_TOKEN": "hf_abcdef", "client_secret": "s3cr3t"}


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


@pytest.mark.mpi
@pytest.mark.parametrize("mpi", [False, True], ids=["single", "mpi"])
def test_secret_hyperparameters_reach_the_program_but_not_the_log(make_job, source_dir, mpi):
    copy_programs(source_dir, "echo_argv.py")
    hps = {"sagemaker_program": "echo_argv.py", "sagemaker_submit_directory": str(source_dir), **SECRETS,
           "lr": 0.5, **({"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2} if mpi else {})}
    root = make_job(hps)
    aws = {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLEKEYID0000", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCY",
           "AWS_SESSION_TOKEN": "FwoGZXIvYXdzEXAMPLETOKEN"}
    plan = run_train(root, "--plan", env=aws)
    result = run_train(root, env=aws)
    assert result.returncode == 0, result.output
    record = read_json(root / "output" / "data" / ("argv-0.json" if mpi else "argv-single.json"))
    assert record["argv"][record["argv"].index("--db_password") + 1] == "hunter2"   # the program gets it
    assert "running:" in result.output and "--lr 0.5" in result.output
    for value in [*SECRETS.values(), *aws.values()]:
        assert value not in result.output
        assert value not in plan.output
    assert "--db_password ****" in result.output


@pytest.mark.mpi
def test_a_progress_bar_reaches_the_log_before_its_line_ends(make_job, source_dir):
    copy_programs(source_dir, "progress_bar.py")
    root = make_job({"sagemaker_program": "progress_bar.py", "sagemaker_submit_directory": str(source_dir)})
    env = {**os.environ, "SAGEMAKER_BASE_DIR": str(root), "PATH": f"{BIN}:{os.environ['PATH']}"}
    proc = subprocess.Popen([str(BIN / "train")], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    seen = b""
    deadline = time.monotonic() + 120
    try:
        while b"step 1/10" not in seen and time.monotonic() < deadline and proc.poll() is None:
            ready, _, _ = select.select([proc.stderr], [], [], 1.0)
            if ready:
                seen += os.read(proc.stderr.fileno(), 65536)
        # the program is still blocked on its unfinished line: train relayed the partial line
        assert b"step 1/10" in seen, seen.decode(errors="replace")[-2000:]
        assert proc.poll() is None
        (root / "output" / "data" / "seen").write_text("")
        rest = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (seen + rest).decode(errors="replace")[-3000:]
    assert b"step 10/10" in rest
