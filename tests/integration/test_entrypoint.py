"""`train` against /opt/ml trees with user scripts: argv fidelity, failures, exit codes, code fetching."""

import os
import re
import shutil
import tarfile
import time

import pytest

from dtc_entrypoint import forensics
from helpers import AWKWARD, PROGRAMS, REPO, copy_programs, read_json, run_train

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("encoding", ["json", "str"])
def test_hyperparameters_reach_the_script_exactly(make_job, source_dir, encoding):
    copy_programs(source_dir, "echo_argv.py")
    hps = {"sagemaker_program": "echo_argv.py", "sagemaker_submit_directory": str(source_dir), **AWKWARD,
           "epochs": 3, "flag": False, "layers": [64, "relu"], "cfg": {"a": 1}}
    root = make_job(hps, encoding=encoding)
    result = run_train(root)
    assert result.returncode == 0, result.output
    record = read_json(root / "output" / "data" / "argv-single.json")
    # JSON-encoded containers arrive as JSON; the generic Estimator's str() of a list or dict is a
    # Python repr, which is not JSON, and arrives as written.
    containers = ['[64, "relu"]', '{"a": 1}'] if encoding == "json" else ["[64, 'relu']", "{'a': 1}"]
    expected = [x for k, v in AWKWARD.items() for x in (f"--{k}", v)] + [
        "--epochs", "3", "--flag", "False", "--layers", containers[0], "--cfg", containers[1]]
    assert record["argv"] == expected
    assert record["sm_user_args"] == expected
    assert record["cwd"] == str(root / "code")
    assert result.succeeded and result.failure is None


def test_hyperparameters_reach_every_mpi_rank_exactly(make_job, source_dir):
    copy_programs(source_dir, "echo_argv.py")
    hps = {"sagemaker_program": "echo_argv.py", "sagemaker_submit_directory": str(source_dir),
           "sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2, **AWKWARD}
    root = make_job(hps)
    result = run_train(root)
    assert result.returncode == 0, result.output
    expected = [x for k, v in AWKWARD.items() for x in (f"--{k}", v)]
    for rank in ("0", "1"):
        record = read_json(root / "output" / "data" / f"argv-{rank}.json")
        assert record["argv"] == expected and record["world_size"] == "2"


def test_failing_script_writes_its_exception_first_and_exits_nonzero(make_job, source_dir):
    copy_programs(source_dir, "raise_error.py")
    root = make_job({"sagemaker_program": "raise_error.py", "sagemaker_submit_directory": str(source_dir)})
    result = run_train(root)
    assert result.returncode == 1
    first = result.failure.splitlines()[0]
    assert first == "ValueError: learning rate must be positive; got -0.1 for $LR"
    assert not result.succeeded


@pytest.mark.parametrize("mode, first, code", [
    ("raise-rank-1", "ValueError: learning rate must be positive; got -0.1 for $LR", 1),
    ("exit-3-rank-1", "rank 1 on host algo-1 exited with code 3", 3),
], ids=["exception", "exit-code"])
def test_a_failing_rank_under_mpi_comes_first_named_with_its_host(make_job, source_dir, mode, first, code):
    copy_programs(source_dir, "raise_error.py")
    root = make_job({"sagemaker_program": "raise_error.py", "sagemaker_submit_directory": str(source_dir),
                     "sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2, "mode": mode})
    result = run_train(root, timeout_s=60)
    assert result.returncode == code, result.output
    assert result.failure.splitlines()[0] == first, result.failure
    assert "rank 1 on host algo-1" in result.failure


def test_a_rank_that_aborts_leaves_every_threads_python_stack_in_the_failure_file(make_job, source_dir):
    """Python's fault handler is on in every process the entrypoint starts (plan.job_env): a rank
    killed by SIGABRT (a C++ library's std::terminate at teardown, issue #41) leaves each thread's
    Python stack, the aborting thread's first, in its stderr and so in the failure file."""
    copy_programs(source_dir, "raise_error.py")
    root = make_job({"sagemaker_program": "raise_error.py", "sagemaker_submit_directory": str(source_dir),
                     "sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2,
                     "mode": "abort-rank-1"})
    result = run_train(root, timeout_s=60)
    assert result.returncode == 128 + 6, result.output
    assert result.failure.splitlines()[0].startswith("rank 1 on host algo-1 was killed by SIGABRT"), result.failure
    untagged = re.sub(r"\[1,1\]<stderr>:", "", result.failure)   # mpirun tags each of the handler's writes
    stacks = untagged[untagged.index("Fatal Python error: Aborted"):]
    aborting, waiting = stacks.index("in close_transport"), stacks.index("in leave_process_group")
    assert stacks.index("Current thread") < aborting < stacks.index("Thread 0x") < waiting, result.failure


def _horovod_stall_job(make_job, source_dir, program: str):
    copy_programs(source_dir, program)
    root = make_job({"sagemaker_program": program, "sagemaker_submit_directory": str(source_dir),
                     "sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2,
                     "sagemaker_stall_timeout_s": 8, "sagemaker_stall_startup_grace_s": 30})
    started = time.monotonic()
    result = run_train(root, timeout_s=180)
    return root, result, time.monotonic() - started


def _kept_stacks(root) -> list[str]:
    folder = root / "output" / "data" / "forensics" / "stacks"
    return sorted(name.split("-pid")[0] for name in os.listdir(folder) if name.startswith("rank"))


def test_a_horovod_rank_that_skips_an_all_reduce_ends_the_job_at_the_stall_timeout_naming_it(make_job, source_dir):
    """Rank 1 never submits the all-reduce rank 0 waits in. Horovod's stall inspector warns every
    third of the stall timeout (plan.horovod_stall_env), which is not progress: the job's stall
    rule ends it soon after the timeout, exit 5, naming where each rank is (from their stacks)
    and the tensor Horovod says rank 1 did not submit (issue #41)."""
    root, result, took_s = _horovod_stall_job(make_job, source_dir, "horovod_stall.py")
    assert result.returncode == 5, result.output[-3000:]
    lines = (PROGRAMS / "horovod_stall.py").read_text().splitlines()
    sleep = lines.index("    time.sleep(3600)") + 1
    skipped = lines.index('    hvd.allreduce(torch.ones(4), name="grad.skipped")') + 1
    assert re.fullmatch(
        rf"stalled \d+ s: rank 1 on algo-1 is in horovod_stall\.py:{sleep} \(<module>\) while rank 0 on algo-1 waits "
        rf"in allreduce at horovod_stall\.py:{skipped} \(<module>\); Horovod's stall inspector: rank 1 did not submit "
        r"allreduce\.grad\.skipped \(no output and no heartbeat for \d+ s: sagemaker_stall_timeout_s=8; every "
        rf"process's stacks in {root}/output/data/forensics/stacks\)", result.failure.splitlines()[0]), result.failure
    assert _kept_stacks(root) == ["rank0-algo-1", "rank1-algo-1"]
    assert took_s < 8 + 30 + 45, f"the job ended {took_s:.0f} s after it started"


def test_horovod_tensorflow_ranks_all_reducing_under_different_names_end_at_the_stall_timeout(make_job, source_dir):
    """Horovod TensorFlow, each rank all-reducing its own name: both ranks wait, each for the
    other's tensor. The stacks say that every rank waits in a collective, at the same line of the
    program, and Horovod's stall inspector names the tensor each did not submit; exit 5 soon
    after the timeout (issue #41)."""
    root, result, took_s = _horovod_stall_job(make_job, source_dir, "horovod_tf_names.py")
    assert result.returncode == 5, result.output[-3000:]
    line = (PROGRAMS / "horovod_tf_names.py").read_text().splitlines().index(
        'all_reduce(tf.ones(4), f"grad_rank{hvd.rank()}")   # the names differ: never completes') + 1
    first = result.failure.splitlines()[0]
    assert re.match(rf"stalled \d+ s: ranks 0-1 on algo-1 wait in all_reduce at horovod_tf_names\.py:{line} "
                    rf"\(<module>\){re.escape(forensics.EVERY_RANK_WAITS)}; Horovod's stall inspector: rank 0 did not "
                    r"submit \S*grad_rank1\S*, rank 1 did not submit \S*grad_rank0\S* \(no output", first), first
    assert _kept_stacks(root) == ["rank0-algo-1", "rank1-algo-1"]
    assert took_s < 8 + 30 + 60, f"the job ended {took_s:.0f} s after it started"


@pytest.mark.parametrize("options, first", [
    ("--bogus-option", 'mpirun rejected its options: unknown option "--bogus-option": fix '
                       "sagemaker_mpi_custom_mpi_options in the job's hyperparameters"),
    ("-x NCCL_DEBUG=INFO verbose", "mpirun took 'verbose' for the program to run: an option in "
                                   "sagemaker_mpi_custom_mpi_options is misspelled or lacks its value"),
], ids=["unknown-option", "word-taken-for-the-program"])
def test_mpirun_rejecting_custom_options_is_reported_as_mpiruns_error(make_job, source_dir, options, first):
    copy_programs(source_dir, "raise_error.py")
    root = make_job({"sagemaker_program": "raise_error.py", "sagemaker_submit_directory": str(source_dir),
                     "sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2,
                     "sagemaker_mpi_custom_mpi_options": options, "mode": "exit-3"})
    result = run_train(root, timeout_s=60)
    assert result.returncode != 0 and not result.succeeded
    assert result.failure.splitlines()[0].startswith(first), result.failure


def test_exit_code_of_the_script_is_passed_through(make_job, source_dir):
    copy_programs(source_dir, "raise_error.py")
    root = make_job({"sagemaker_program": "raise_error.py", "sagemaker_submit_directory": str(source_dir),
                     "mode": "exit-3"})
    result = run_train(root)
    assert result.returncode == 3
    assert result.failure.splitlines()[0] == "raise_error.py exited with code 3"


def test_submit_directory_as_a_tarball_and_program_from_the_environment(make_job, source_dir, tmp_path):
    copy_programs(source_dir, "echo_argv.py")
    tarball = tmp_path / "sourcedir.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(source_dir / "echo_argv.py", arcname="echo_argv.py")
    root = make_job({"sagemaker_program": "not_this.py", "sagemaker_submit_directory": str(tarball), "k": "v"})
    result = run_train(root, env={"SAGEMAKER_PROGRAM": "echo_argv.py"})   # the variable wins, as in the toolkit
    assert result.returncode == 0, result.output
    assert read_json(root / "output" / "data" / "argv-single.json")["argv"] == ["-k", "v"]


FLAG_HPS = {"fp16-allreduce": "", "use-adasum": True, "model_dir": "/opt/ml/shared/model"}


@pytest.mark.parametrize("encoding", ["json", "str"])
def test_flags_declared_as_docs_entrypoint_shows_parse_sagemakers_values(make_job, source_dir, encoding):
    """docs/entrypoint.md, Flags: the declarations it shows are tests/programs/flags.py's."""
    copy_programs(source_dir, "flags.py")
    program = (PROGRAMS / "flags.py").read_text()
    shown = program[program.index("def flag"):program.index("# --- docs/entrypoint.md, Flags: end")].strip()
    assert shown in (REPO / "docs" / "entrypoint.md").read_text()
    root = make_job({"sagemaker_program": "flags.py", "sagemaker_submit_directory": str(source_dir), **FLAG_HPS},
                    encoding=encoding)
    result = run_train(root)
    assert result.returncode == 0, result.output
    parsed = read_json(root / "output" / "data" / "flags.json")
    assert parsed == {"fp16_allreduce": True, "use_adasum": True, "model_dir": "/opt/ml/shared/model",
                      "argv": ["--fp16-allreduce", "", "--use-adasum", "True", "--model_dir", "/opt/ml/shared/model"]}
    root = make_job({"sagemaker_program": "flags.py", "sagemaker_submit_directory": str(source_dir),
                     "use-adasum": False}, encoding=encoding)
    assert run_train(root).returncode == 0
    assert read_json(root / "output" / "data" / "flags.json")["use_adasum"] is False


@pytest.mark.parametrize("mode, first, hint", [
    ("store-true", "flags.py: error: unrecognized arguments:", 'action="store_true"'),
    ("no-model-dir", "flags.py: error: unrecognized arguments: --model_dir /opt/ml/shared/model", "model_dir=False"),
], ids=["store-true", "no-model-dir"])
def test_a_script_rejecting_its_arguments_fails_with_argparses_line_and_a_hint(make_job, source_dir, mode, first,
                                                                               hint):
    copy_programs(source_dir, "flags.py")
    root = make_job({"sagemaker_program": "flags.py", "sagemaker_submit_directory": str(source_dir), **FLAG_HPS})
    result = run_train(root, env={"FLAGS_MODE": mode}, timeout_s=60)
    assert result.returncode == 2
    lines = result.failure.splitlines()
    assert lines[0] == first, lines
    assert hint in lines[1]


def test_a_syntax_error_in_the_script_is_the_failures_first_line(make_job, source_dir):
    source_dir.mkdir()
    (source_dir / "train.py").write_text("import os\nx = (\n")
    root = make_job({"sagemaker_program": "train.py", "sagemaker_submit_directory": str(source_dir)})
    result = run_train(root, timeout_s=60)
    assert result.returncode == 1
    assert result.failure.splitlines()[0] == "SyntaxError: '(' was never closed"


def test_a_built_in_trainers_bad_hyperparameter_shows_argparses_message_first(make_job):
    root = make_job({"sagemaker_program": "builtin:tensorflow", "epochs": "abc"})
    result = run_train(root, timeout_s=120)
    assert result.returncode == 2
    lines = result.failure.splitlines()
    assert lines[0].endswith("error: argument --epochs: invalid positive_int value: 'abc'"), lines
    assert "builtin:tensorflow" in lines[1] and "docs/environment.md" in lines[1]


def test_shell_program_gets_its_arguments(make_job, source_dir):
    source_dir.mkdir()
    (source_dir / "run.sh").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$SM_OUTPUT_DATA_DIR/args.txt"\n')
    root = make_job({"sagemaker_program": "run.sh", "sagemaker_submit_directory": str(source_dir), "a": "x y; z"})
    result = run_train(root)
    assert result.returncode == 0, result.output
    assert (root / "output" / "data" / "args.txt").read_text() == "-a\nx y; z\n"


@pytest.mark.parametrize("hps, key", [
    ({"sagemaker_program": "train.py", "sagemaker_mpi_enabled": "maybe"}, "sagemaker_mpi_enabled"),
    ({"sagemaker_program": "train.py", "sagemaker_mpi_enabled": True,
      "sagemaker_mpi_num_of_processes_per_host": 0}, "sagemaker_mpi_num_of_processes_per_host"),
    ({"sagemaker_program": "builtin:jax"}, "sagemaker_program"),
    ({}, "sagemaker_program"),
    ({"sagemaker_program": "missing.py"}, "sagemaker_program"),
])
def test_bad_input_fails_fast_naming_the_key(make_job, hps, key):
    root = make_job(hps)
    result = run_train(root, timeout_s=60)
    assert result.returncode == 2, result.output
    assert key in result.failure.splitlines()[0]


def test_missing_config_names_the_variable_to_set(tmp_path):
    result = run_train(tmp_path / "nowhere", timeout_s=60)
    assert result.returncode == 2
    assert "SAGEMAKER_BASE_DIR" in result.stderr


def test_code_dir_with_files_does_not_silently_hide_the_submit_dir(make_job, source_dir):
    copy_programs(source_dir, "echo_argv.py")
    root = make_job({"sagemaker_program": "echo_argv.py", "sagemaker_submit_directory": str(source_dir)})
    (root / "code" / "stale.py").write_text("")      # an image that left files in /opt/ml/code
    result = run_train(root, timeout_s=60)
    assert result.returncode == 2
    assert "not found in" in result.failure.splitlines()[0]
    assert "already holds files" in result.stderr


def test_sdk_local_mode_tree_with_container_paths(make_job, source_dir):
    """SDK local mode: hosts algo-1-xxxxx, no instance_groups, sagemaker_submit_directory
    "/opt/ml/code" with the code already mounted there; the tree itself lives elsewhere."""
    root = make_job({"sagemaker_program": "echo_argv.py", "sagemaker_submit_directory": "/opt/ml/code",
                     "sagemaker_container_log_level": 20, "sagemaker_job_name": "job-local-1",
                     "sagemaker_region": "us-east-1", "lr": 0.1},
                    hosts=("algo-1-ab12c",), current_host="algo-1-ab12c", local_mode_shape=True)
    shutil.copy(PROGRAMS / "echo_argv.py", root / "code")
    result = run_train(root)
    assert result.returncode == 0, result.output
    assert read_json(root / "output" / "data" / "argv-single.json")["argv"] == ["--lr", "0.1"]
    assert "not unpacked" not in result.stderr


def test_a_peer_that_never_resolves_fails_the_host_in_seconds_naming_it(make_job, source_dir):
    """Issue #8, on the host: a two-host MPI job whose other host's name does not resolve exits 3
    within the resolve timeout, with that host in the failure's first line."""
    source_dir.mkdir()
    shutil.copy(PROGRAMS / "echo_argv.py", source_dir)
    root = make_job({"sagemaker_program": "echo_argv.py", "sagemaker_submit_directory": str(source_dir),
                     "sagemaker_mpi_enabled": True}, hosts=("algo-1", "dtc-no-such-host.invalid"))
    start = time.monotonic()
    result = run_train(root, env={"DTC_HOST_RESOLVE_TIMEOUT_S": "2"}, timeout_s=60)
    assert result.returncode == 3 and time.monotonic() - start < 20
    assert result.failure.splitlines()[0].startswith(
        "host dtc-no-such-host.invalid could not be resolved by name within 2 s")
