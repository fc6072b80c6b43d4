"""Unit: the failure reason's first line names the user's exception, also through mpirun."""

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
