"""A job that stops making progress ends at the stall timeout, naming where each rank is, with
every process's stacks kept in output/data/forensics/stacks (issue #41): the real ``train``, its
stall rule (supervise.StallRule) and the stacks every Python process writes on SIGUSR2
(dtc_entrypoint.stack_dump, through the .pth hook the host setup installs), under each launcher
that runs on this host. Horovod's own stall inspector: test_entrypoint.py."""

import re
import time

import pytest

from helpers import PROGRAMS, copy_programs, processes_of_job, run_train

pytestmark = pytest.mark.e2e
TIMEOUT_S = 6


def _line(text: str) -> int:
    """The number of stall.py's first line holding ``text``."""
    lines = (PROGRAMS / "stall.py").read_text().splitlines()
    return next(number for number, line in enumerate(lines, 1) if text in line)


LOCK = _line("lock.acquire()   # held already")
SLEEP = _line("time.sleep(3600)")
ALL_REDUCE = _line("dist.all_reduce(gradient)")
BARRIER = _line("comm.Barrier()")


def _stalled_job(make_job, source_dir, mode: str, grace_s: int = 2, **hyperparameters):
    copy_programs(source_dir, "stall.py")
    return make_job({"sagemaker_program": "stall.py", "sagemaker_submit_directory": str(source_dir), "mode": mode,
                     "sagemaker_stall_timeout_s": TIMEOUT_S, "sagemaker_stall_startup_grace_s": grace_s,
                     **hyperparameters})


def _run(root, timeout_s: float = 120):
    started = time.monotonic()
    result = run_train(root, timeout_s=timeout_s)
    return result, time.monotonic() - started


def _stacks(root) -> dict[str, str]:
    folder = root / "output" / "data" / "forensics" / "stacks"
    return {path.name: path.read_text() for path in sorted(folder.iterdir())} if folder.is_dir() else {}


def test_a_process_waiting_on_a_lock_it_holds_is_ended_at_the_timeout_naming_the_line(make_job, source_dir):
    root = _stalled_job(make_job, source_dir, "lock")
    result, took_s = _run(root)
    assert result.returncode == 5, result.output[-3000:]
    first = result.failure.splitlines()[0]
    assert re.fullmatch(rf"stalled \d+ s: process \d+ is in stall\.py:{LOCK} \(hold_the_lock\) \(no output and no "
                        rf"heartbeat for \d+ s: sagemaker_stall_timeout_s={TIMEOUT_S}; every process's stacks in "
                        rf"{root}/output/data/forensics/stacks\)", first), result.failure
    stacks = _stacks(root)
    assert len(stacks) == 1, stacks
    assert re.search(rf'File ".*stall\.py", line {LOCK} in hold_the_lock\n  File ".*stall\.py", line '
                     rf'{_line("    hold_the_lock(lock)")} in <module>',
                     next(iter(stacks.values()))), stacks
    assert took_s < TIMEOUT_S + 2 + 30, f"the job ended {took_s:.0f} s after it started"
    assert not processes_of_job(root)


def test_a_torchrun_rank_stuck_in_its_data_loading_is_named_against_the_rank_waiting_in_all_reduce(
        make_job, source_dir):
    root = _stalled_job(make_job, source_dir, "torch-loader", sagemaker_torch_distributed_enabled=True,
                        sagemaker_mpi_num_of_processes_per_host=2)
    result, took_s = _run(root)
    assert result.returncode == 5, result.output[-3000:]
    assert "rank 0 step 2 sum 2" in result.output and "rank 0 step 3" not in result.output, result.output[-3000:]
    first = result.failure.splitlines()[0]
    assert first.startswith("stalled "), result.failure
    assert re.search(rf": rank 1 on algo-1 is in stall\.py:{SLEEP} \(load_batch\) while rank 0 on algo-1 waits in "
                     rf"all_reduce at stall\.py:{ALL_REDUCE} \(<module>\) \(no output", first), result.failure
    stacks = _stacks(root)
    ranks = sorted(name for name in stacks if name.startswith("rank"))
    assert [name.split("-")[0] for name in ranks] == ["rank0", "rank1"], stacks.keys()
    assert "in all_reduce" in stacks[ranks[0]] and "in load_batch" in stacks[ranks[1]]
    assert took_s < TIMEOUT_S + 2 + 45, f"the job ended {took_s:.0f} s after it started"
    assert not processes_of_job(root)


@pytest.mark.mpi
def test_an_mpi_rank_stuck_on_a_lock_is_named_against_the_rank_waiting_in_a_barrier(make_job, source_dir):
    root = _stalled_job(make_job, source_dir, "mpi-lock", sagemaker_mpi_enabled=True,
                        sagemaker_mpi_num_of_processes_per_host=2)
    result, took_s = _run(root)
    assert result.returncode == 5, result.output[-3000:]
    first = result.failure.splitlines()[0]
    assert re.search(rf"^stalled \d+ s: rank 1 on algo-1 is in stall\.py:{LOCK} \(hold_the_lock\) while rank 0 on "
                     rf"algo-1 waits in barrier at stall\.py:{BARRIER} \(<module>\)", first), result.failure
    assert sorted(name.split("-")[0] for name in _stacks(root) if name.startswith("rank")) == ["rank0", "rank1"]
    assert took_s < TIMEOUT_S + 2 + 45, f"the job ended {took_s:.0f} s after it started"
    assert not processes_of_job(root)


def test_a_healthy_job_with_a_long_silent_first_step_is_not_flagged(make_job, source_dir):
    """The first step is silent for 2.5 times the timeout (within the start-up grace), the steps
    after it print a line a second: the job succeeds, and nothing is kept."""
    root = _stalled_job(make_job, source_dir, "slow-start", grace_s=15, **{"first-step-s": 15, "steps": 8})
    result, _ = _run(root)
    assert result.returncode == 0 and result.succeeded, result.output[-3000:]
    assert "step 8 of 8" in result.output
    assert not _stacks(root)


def test_a_silent_job_that_computes_is_not_flagged(make_job, source_dir):
    """Three times the timeout without a word, past the grace, but busy on a core: progress."""
    root = _stalled_job(make_job, source_dir, "busy", grace_s=0, **{"first-step-s": 3 * TIMEOUT_S})
    result, _ = _run(root)
    assert result.returncode == 0 and result.succeeded, result.output[-3000:]
    assert "computed True" in result.output


def test_a_program_that_touches_the_heartbeat_file_is_not_flagged(make_job, source_dir):
    """Silent for twice the timeout after the grace, but touching $DTC_HEARTBEAT_FILE each second."""
    copy_programs(source_dir, "stall.py")
    (source_dir / "beat.py").write_text(
        "import os, pathlib, time\n"
        "for _ in range(14):\n"
        "    pathlib.Path(os.environ['DTC_HEARTBEAT_FILE']).touch()\n"
        "    time.sleep(1)\n")
    root = make_job({"sagemaker_program": "beat.py", "sagemaker_submit_directory": str(source_dir),
                     "sagemaker_stall_timeout_s": TIMEOUT_S, "sagemaker_stall_startup_grace_s": 0})
    result, _ = _run(root)
    assert result.returncode == 0 and result.succeeded, result.output[-3000:]


def test_with_the_dump_action_a_stalled_job_keeps_its_stacks_and_runs_on(make_job, source_dir):
    """sagemaker_stall_action=dump: a first step silent past the timeout and the grace is read
    (stacks kept, the account logged), not ended; the job then goes on and succeeds."""
    root = _stalled_job(make_job, source_dir, "slow-start", grace_s=0, sagemaker_stall_action="dump",
                        **{"first-step-s": 3 * TIMEOUT_S, "steps": 2})
    result, _ = _run(root)
    assert result.returncode == 0 and result.succeeded, result.output[-3000:]
    assert "step 2 of 2" in result.output
    sleeping = _line("    time.sleep(args.first_step_s)")
    assert re.search(rf"\[dtc\] ERROR stalled \d+ s: process \d+ is in stall\.py:{sleeping} \(<module>\) ",
                     result.output), result.output[-3000:]
    assert "the job runs on (it is not ended for a stall)" in result.output
    stacks = _stacks(root)
    assert len(stacks) == 1 and f"stall.py\", line {sleeping} in <module>" in next(iter(stacks.values())), stacks
