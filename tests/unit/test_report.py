"""Unit: the failure reason's first line names the user's exception, also through mpirun."""

import pytest

from dtc_entrypoint import report

TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "/opt/ml/code/train.py", line 3, in <module>',
    "    main()",
    "    ^^^^^^",
    "ValueError: learning rate must be positive",
]


def test_exception_line_from_a_plain_traceback():
    assert report.exception_line(["some log", *TRACEBACK, "after"]) == "ValueError: learning rate must be positive"


def test_chained_exceptions_report_the_last_one():
    lines = TRACEBACK + ["", "During handling of the above exception, another exception occurred:", "",
                         "Traceback (most recent call last):", '  File "x.py", line 1', "KeyError: 'lr'"]
    assert report.exception_line(lines) == "KeyError: 'lr'"


def test_mpi_tagged_lines_are_grouped_by_rank():
    interleaved = []
    for line in TRACEBACK:
        interleaved.append(f"[1,1]<stderr>:{line}")
        interleaved.append("[1,0]<stderr>:rank 0 still working")
    text = report.describe_failure("train.py", 1, interleaved + ["MPI_ABORT was invoked on rank 1"])
    lines = text.splitlines()
    assert lines[0] == "ValueError: learning rate must be positive"
    assert "rank 1" in lines[2] and "exited with code 1" in lines[2]


def test_no_traceback_reports_the_exit_code_and_a_signal_its_name():
    assert report.describe_failure("run.sh", 3, ["boom"]).splitlines()[0] == "run.sh exited with code 3"
    assert report.describe_failure("t.py", 143, [], "SIGTERM").splitlines()[0] == "t.py was stopped by SIGTERM"


def test_failure_file_first_writer_wins(tmp_path):
    report.write_failure(str(tmp_path), "user's own reason\n")
    report.write_failure(str(tmp_path), "ours\n")
    assert (tmp_path / "failure").read_text() == "user's own reason\n"
    report.write_success(str(tmp_path / "out"))
    assert (tmp_path / "out" / "success").read_text() == ""


def test_interleaved_ranks_with_split_writes():
    """What mpirun --tag-output printed for two TF ranks failing together (abridged, real)."""
    stderr = [
        "[1,1]<stderr>:Traceback (most recent call last):",
        "[1,0]<stderr>:Traceback (most recent call last):",
        '[1,1]<stderr>:  File "/x/horovod/_keras/callbacks.py", line 105, in on_epoch_end',
        "[1,0]<stderr>:raise e.with_traceback(filtered_tb) from None[1,1]<stderr>:    [1,0]<stderr>:",
        "[1,0]<stderr>:self._average_metrics_in_place(logs)[1,0]<stderr>:",
        "[1,0]<stderr>: [1,1]<stderr>: [1,0]<stderr>: ",
        "[1,1]<stderr>:AttributeError: module 'keras.backend' has no attribute 'constant'",
        "[1,0]<stderr>:^^^^^",
        "[1,0]<stderr>:AttributeError: module 'keras.backend' has no attribute 'constant'",
    ]
    first = report.describe_failure("builtin:tensorflow", 1, stderr).splitlines()[0]
    assert first == "AttributeError: module 'keras.backend' has no attribute 'constant'"


def test_qualified_and_bare_exception_names():
    assert report.exception_line(["Traceback (most recent call last):", "  File 'x'",
                                  "tensorflow.python.framework.errors_impl.InvalidArgumentError: bad shape"]) \
        == "tensorflow.python.framework.errors_impl.InvalidArgumentError: bad shape"
    assert report.exception_line(["Traceback (most recent call last):", "KeyboardInterrupt"]) == "KeyboardInterrupt"


USAGE = ["usage: train.py [-h] [--fp16-allreduce]"]


def test_an_argparse_error_comes_first_with_the_model_dir_hint():
    stderr = [*USAGE, "train.py: error: unrecognized arguments: --model_dir /opt/ml/shared/model"]
    lines = report.describe_failure("train.py", 2, stderr).splitlines()
    assert lines[0] == "train.py: error: unrecognized arguments: --model_dir /opt/ml/shared/model"
    assert "--model_dir" in lines[1] and "model_dir=False" in lines[1] and 'add_argument("--model_dir")' in lines[1]


def test_a_store_true_flag_given_a_value_gets_the_flags_hint_also_under_mpi():
    for value in ("True", "", "false"):
        stderr = [f"[1,0]<stderr>:{line}" for line in
                  [*USAGE, f"train.py: error: unrecognized arguments: {value}"]]
        lines = report.describe_failure("train.py", 2, stderr).splitlines()
        assert lines[0] == f"train.py: error: unrecognized arguments: {value}".rstrip()
        assert "store_true" in lines[1] and "docs/entrypoint.md, Flags" in lines[1]
        assert "raised on rank 0" in lines[3]


def test_another_argparse_error_names_where_the_arguments_come_from():
    stderr = [*USAGE, "train.py: error: argument --lr: invalid float value: 'fast'"]
    lines = report.describe_failure("train.py", 2, stderr).splitlines()
    assert lines[0] == "train.py: error: argument --lr: invalid float value: 'fast'"
    assert "hyperparameters.json" in lines[1]


def test_an_error_line_without_argparses_usage_is_not_taken_for_one():
    assert report.usage_error(["prog: error: something"]) is None
    assert report.describe_failure("t.py", 2, ["prog: error: x"]).splitlines()[0] == "t.py exited with code 2"


def test_a_syntax_error_without_a_traceback_header_comes_first():
    stderr = ['  File "/opt/ml/code/train.py", line 2', "    x = (", "        ^", "SyntaxError: '(' was never closed"]
    assert report.describe_failure("train.py", 1, stderr).splitlines()[0] == "SyntaxError: '(' was never closed"
    tagged = [f"[1,1]<stderr>:{line}" for line in stderr]
    assert report.describe_failure("train.py", 1, tagged).splitlines()[0] == "SyntaxError: '(' was never closed"


def test_a_built_in_trainers_argument_error_names_its_hyperparameters():
    stderr = ["usage: tensorflow_horovod.py [-h] [--epochs EPOCHS]",
              "tensorflow_horovod.py: error: argument --epochs: invalid int value: 'abc'"]
    lines = report.describe_failure("builtin:tensorflow", 2, stderr).splitlines()
    assert lines[0] == "tensorflow_horovod.py: error: argument --epochs: invalid int value: 'abc'"
    assert "builtin:tensorflow" in lines[1] and "Read by the built-in trainers" in lines[1]


def test_a_missing_module_names_it_and_says_where_to_add_it():
    stderr = ["[1,0]<stderr>:Traceback (most recent call last):",
              '[1,0]<stderr>:  File "train.py", line 1, in <module>',
              "[1,0]<stderr>:ModuleNotFoundError: No module named 'timm.models'"]
    lines = report.describe_failure("train.py", 1, stderr).splitlines()
    assert lines[0] == "ModuleNotFoundError: No module named 'timm.models'"
    assert lines[1].startswith("this image has no module 'timm': add the package that provides it to requirements.txt")
    assert report.missing_module_hint("ImportError: cannot import name 'x' from 'y'") is None


def test_a_rank_that_exits_non_zero_without_an_exception_is_named_with_its_host():
    stderr = ["[1,0]<stderr>:epoch 1", "[1,1]<stderr>:[dtc] rank 1 on host algo-2 exited with code 3",
              "--------------------------------------------------------------------------",
              "Primary job  terminated normally, but 1 process returned a non-zero exit code."]
    assert report.describe_failure("train.py", 3, stderr).splitlines()[0] == "rank 1 on host algo-2 exited with code 3"


def test_an_exception_names_the_rank_and_host_it_was_raised_on():
    stderr = [f"[1,3]<stderr>:{line}" for line in TRACEBACK] + [
        "[1,3]<stderr>:[dtc] rank 3 on host algo-2 exited with code 1"]
    lines = report.describe_failure("train.py", 1, stderr).splitlines()
    assert lines[0] == "ValueError: learning rate must be positive"
    assert lines[2] == ("Training program 'train.py' exited with code 1; the error above was raised on rank 3 on "
                        "host algo-2.")


def test_a_torchrun_ranks_exception_is_the_first_line_with_its_rank_and_host():
    """PyTorch prefixes a torchrun rank's traceback with "[rankN]: "; the exception comes first,
    then where it was raised (torchrun's Root Cause block gives the host)."""
    stderr = [f"[rank1]: {line}" for line in TRACEBACK] + [
        "Root Cause (first observed failure):", "[0]:", "  host      : algo-2", "  rank      : 1 (local_rank: 0)",
        "  exitcode  : 1 (pid: 42)"]
    lines = report.describe_failure("builtin:pytorch", 1, stderr).splitlines()
    assert lines[0] == "ValueError: learning rate must be positive"
    assert lines[2] == ("Training program 'builtin:pytorch' exited with code 1; the error above was raised on rank 1 "
                        "on host algo-2.")


ROOT_CAUSE_SIGABRT = ["Root Cause (first observed failure):", "[0]:", "  host      : algo-1",
                      "  rank      : 1 (local_rank: 1)", "  exitcode  : -6 (pid: 42)  (SIGABRT)"]


def test_a_rank_that_raised_then_aborted_at_exit_is_named_by_its_exception():
    """PyTorch 2.13's Gloo can abort a rank's exit after its exception (pytorch#179291), and
    torchrun then names the SIGABRT as the root cause (seen in test_fsdp, 2026-11-24)."""
    stderr = [f"[rank0]: {line}" for line in TRACEBACK] + [f"[rank1]: {line}" for line in TRACEBACK] + [
        "[rank1]: terminate called without an active exception", *ROOT_CAUSE_SIGABRT]
    lines = report.describe_failure("builtin:pytorch", 1, stderr).splitlines()
    assert lines[0] == "ValueError: learning rate must be positive"
    assert lines[2].endswith("the error above was raised on rank 1 on host algo-1.")


def test_a_rank_that_raised_then_segfaulted_at_exit_is_named_by_its_exception():
    """The same teardown can end in SIGSEGV (test_fsdp's rank 0 after its checkpoint error, make test
    of 606c977, 2026-12-06: the failure file's first line named the signal)."""
    stderr = [f"[rank0]: {line}" for line in TRACEBACK] + [f"[rank1]: {line}" for line in TRACEBACK] + [
        line.replace("-6 (pid: 42)  (SIGABRT)", "-11 (pid: 42)  (SIGSEGV)") for line in ROOT_CAUSE_SIGABRT]
    lines = report.describe_failure("builtin:pytorch", 1, stderr).splitlines()
    assert lines[0] == "ValueError: learning rate must be positive"
    assert lines[2].endswith("the error above was raised on rank 1 on host algo-1.")


def test_a_rank_aborted_without_an_exception_of_its_own_is_the_first_line():
    """Another rank's exception (a lost peer's connection, say) follows from the abort."""
    stderr = [f"[rank0]: {line}" for line in TRACEBACK] + ROOT_CAUSE_SIGABRT
    assert report.describe_failure("builtin:pytorch", 1, stderr).splitlines()[0] == (
        "rank 1 on host algo-1 was killed by SIGABRT")


def test_torchruns_root_cause_with_an_exit_code_names_rank_and_host():
    stderr = ["Root Cause (first observed failure):", "[0]:", "  time      : 2026-11-24_08:00:00",
              "  host      : algo-2", "  rank      : 1 (local_rank: 0)", "  exitcode  : 3 (pid: 42)"]
    assert report.describe_failure("train.py", 1, stderr).splitlines()[0] == "rank 1 on host algo-2 exited with code 3"


def test_mpirun_rejecting_an_option_is_mpiruns_error_naming_the_option_and_the_hyperparameter():
    stderr = ['/usr/bin/orterun: Error: unknown option "--bogus"', "Type '/usr/bin/orterun --help' for usage."]
    first = report.describe_failure("train.py", 1, stderr).splitlines()[0]
    assert first == ('mpirun rejected its options: unknown option "--bogus": fix sagemaker_mpi_custom_mpi_options '
                     "in the job's hyperparameters")


def test_mpirun_taking_an_option_for_the_program_says_an_option_is_misspelled():
    stderr = ["-" * 74, "orterun was unable to find the specified executable file, and therefore",
              "did not launch the job.  This error was first reported for process", "", "Node:       algo-1",
              "Executable: verbose", "-" * 74]
    first = report.describe_failure("train.py", 134, stderr).splitlines()[0]
    assert first.startswith("mpirun took 'verbose' for the program to run: an option in "
                            "sagemaker_mpi_custom_mpi_options is misspelled"), first


@pytest.mark.parametrize("exception", [
    "AttributeError: module 'tensorflow.keras.utils' has no attribute 'multi_gpu_model'",
    "AttributeError: module 'keras.utils' has no attribute 'multi_gpu_model'",
    "ImportError: cannot import name 'multi_gpu_model' from 'tensorflow.keras.utils' (/opt/dtc/venv/lib/x.py)",
])
def test_a_removed_keras_api_is_translated_first_and_the_exception_follows(exception):
    stderr = ["[1,0]<stderr>:Traceback (most recent call last):", '[1,0]<stderr>:  File "train.py", line 9',
              f"[1,0]<stderr>:{exception}"]
    lines = report.describe_failure("train.py", 1, stderr).splitlines()
    assert lines[0].startswith("keras.utils.multi_gpu_model was removed from Keras in TensorFlow 2.4: build and "
                               "compile the model inside tf.distribute.MirroredStrategy().scope()")
    assert "mpi distribution with Horovod" in lines[0]
    assert lines[1] == exception
    assert report.removed_api("AttributeError: 'Model' object has no attribute 'fit_generator'") is None


@pytest.mark.parametrize("layout, text, count", [
    ("memory.events", "low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\noom_group_kill 0\n", 2),           # cgroup v2
    ("memory/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n", 1),          # cgroup v1
    (None, "", None),                                                                             # no controller
])
def test_the_containers_oom_kill_count_is_read_from_cgroup_v2_or_v1(tmp_path, layout, text, count):
    from dtc_entrypoint import memory

    if layout:
        (tmp_path / layout).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / layout).write_text(text)
    assert memory.oom_kills(str(tmp_path)) == count
    assert memory.oom_killed_since(0, str(tmp_path)) is bool(count)
    assert memory.oom_killed_since(count, str(tmp_path)) is False   # no new kill since the job started


def test_a_sigkill_is_called_an_out_of_memory_kill_only_when_the_count_grew():
    oom = report.describe_failure("train.py", 137, ["Killed"], oom_killed=True).splitlines()[0]
    assert oom == ("train.py was killed by SIGKILL from the kernel's out-of-memory killer (exit code 137): the "
                   "container ran out of memory: lower batch-size or the processes per host, or use an instance "
                   "type with more memory")
    plain = report.describe_failure("train.py", 137, ["Killed"]).splitlines()[0]
    assert plain == f"train.py was killed by SIGKILL (exit code 137): {report.OOM_HINT}"
    # rank_shim's line crosses hosts through mpirun's output; the master's failure keeps what it said
    line = report.rank_death(3, "algo-2", "SIGKILL", oom_killed=True)
    assert report.dead_rank([f"[1,3]<stderr>:[dtc] {line} (exit code 137)"]) == line
    assert report.dead_rank(["[dtc] rank 3 on host algo-2 was killed by SIGKILL (exit code 137)"]) == (
        f"rank 3 on host algo-2 was killed by SIGKILL ({report.OOM_HINT})")


def test_horovods_stall_shutdown_names_the_rank_and_tensor_before_the_shutdown_exceptions():
    """Horovod 0.28.1's stall inspector output, as mpirun tagged it in a real run (2026-11-28)."""
    tail = [
        "[1,0]<stderr>:[[1,0]<stderr>:2026-11-28 03:13:13[1,0]<stderr>:.[1,0]<stderr>: 67128[1,0]<stderr>:: W "
        "stall_inspector.cc:107] One or more tensors were submitted to be reduced, gathered or broadcasted by subset "
        "of ranks and are waiting for remainder of ranks for more than 3 seconds. ",
        "[1,0]<stderr>:Missing ranks:",
        "[1,0]<stderr>:1: [allreduce.grad.skipped][1,0]<stderr>:",
        "[1,0]<stderr>:[2026-11-28 03:13:16. 67961: E stall_inspector.cc:105] One or more tensors were submitted ...",
        "[1,0]<stderr>:Missing ranks:",
        "[1,0]<stderr>:1!: [allreduce.grad.skipped]",
        '[1,0]<stderr>:One or more rank (marked by "!") is stalled for longer than 8 seconds. Will shutdown.',
        "[1,0]<stderr>:Traceback (most recent call last):",
        '[1,0]<stderr>:  File "/opt/ml/code/train.py", line 11, in <module>',
        "[1,0]<stderr>:horovod.common.exceptions.HorovodInternalError: Horovod has been shut down. This was caused by "
        "an exception on one of the ranks ...",
    ]
    first = report.describe_failure("train.py", 1, tail).splitlines()[0]
    assert first.startswith("stalled 8 s: rank 1 did not submit allreduce.grad.skipped, which the other ranks wait "
                            "for (Horovod's stall inspector ended the job"), first
    assert report.horovod_stall([line for line in tail if "Will shutdown" not in line]) is None   # a warning only
    # the report is not progress, and train's own stall account names the ranks it lists last
    assert [report.horovod_stall_line(line) for line in tail] == [True] * 7 + [False] * 3
    assert report.horovod_missing(tail[:3]) == "Horovod's stall inspector: rank 1 did not submit allreduce.grad.skipped"
    assert report.horovod_missing(tail[7:]) is None
    assert not report.horovod_stall_line("[1,0]<stdout>:epoch=1/2 loss=0.5")
