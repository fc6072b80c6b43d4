"""What `train` logs: secret-looking values masked everywhere it prints a command line, and a
program's partial lines (progress bars) relayed as they are written."""

import os
import select
import subprocess
import time

import pytest

from helpers import BIN, copy_programs, read_json, run_train

SECRETS = {"db_password": "hunter2", "api-key": "k3y-v4lue", "HF_TOKEN": "hf_abcdef", "client_secret": "s3cr3t"}


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
