"""The pieces of stop and resume that need no training job: the checkpoint schedule, the ranks'
agreement, the stop before training, and the atomic writer's staging (dtc_train.stop, common)."""

import os
import signal

import pytest

from dtc_train import common, stop


@pytest.mark.parametrize("text, expected", [
    ("1", stop.Schedule(1, "epochs")), ("2epochs", stop.Schedule(2, "epochs")),
    (" 3 epoch", stop.Schedule(3, "epochs")),
    ("500steps", stop.Schedule(500, "steps")), ("1step", stop.Schedule(1, "steps")), ("0", stop.Schedule(0, "epochs")),
])
def test_checkpoint_schedules_parse(text, expected):
    assert stop.Schedule.parse(text) == expected


@pytest.mark.parametrize("text", ["", "often", "-1", "2 hours", "1.5"])
def test_a_bad_checkpoint_schedule_names_the_hyperparameter(text):
    with pytest.raises(ValueError, match=r"^checkpoint-every="):
        stop.Schedule.parse(text)


def test_schedules_fall_due_on_their_own_unit_only():
    steps, epochs, never = stop.Schedule(5, "steps"), stop.Schedule(2, "epochs"), stop.Schedule(0, "steps")
    assert [s for s in range(1, 16) if steps.due_after_step(s)] == [5, 10, 15]
    assert not any(steps.due_after_epoch(e) for e in range(1, 5))
    assert [e for e in range(1, 7) if epochs.due_after_epoch(e)] == [2, 4, 6]
    assert not any(never.due_after_step(s) for s in range(1, 100))


def test_ranks_agree_on_a_stop_only_at_the_agreement_steps():
    request = stop.StopRequest.__new__(stop.StopRequest)   # no handlers in the test process
    request.signum, request.deferring = None, True
    calls = []

    def sum_over_ranks(value):   # this rank unsignalled, another rank signalled
        calls.append(value)
        return value + signal.SIGTERM

    assert request.agreed(stop.AGREE_EVERY_STEPS - 1, sum_over_ranks) is None and calls == []
    assert request.agreed(stop.AGREE_EVERY_STEPS, sum_over_ranks) == signal.SIGTERM and calls == [0.0]
    assert request.agreed(2 * stop.AGREE_EVERY_STEPS, lambda value: value) is None   # nobody asked


def test_a_signal_during_training_is_noted_once_with_a_line_saying_when_it_arrived(capfd):
    request = stop.StopRequest.__new__(stop.StopRequest)   # no handlers in the test process
    request.signum, request.deferring = None, True
    request._note(signal.SIGTERM, None)
    request._note(signal.SIGINT, None)   # a second signal changes nothing: the first one stops the job
    assert request.signum == signal.SIGTERM
    assert capfd.readouterr().err == ("SIGTERM received: stopping after the step the ranks agree on, "
                                      "with a checkpoint\n")


def test_atomic_writes_are_staged_outside_the_directory_and_leave_nothing_behind(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    seen_while_writing = []

    def write(tmp):
        seen_while_writing.append((os.path.dirname(tmp), sorted(os.listdir(checkpoints))))
        with open(tmp, "w") as handle:
            handle.write("new")

    checkpoints.mkdir()
    (checkpoints / "checkpoint.pt").write_text("old")
    common.atomic_write(str(checkpoints / "checkpoint.pt"), write)
    assert seen_while_writing == [(str(tmp_path / ".checkpoints.staging"), ["checkpoint.pt"])]
    assert (checkpoints / "checkpoint.pt").read_text() == "new"
    assert sorted(os.listdir(tmp_path)) == ["checkpoints"] and os.listdir(checkpoints) == ["checkpoint.pt"]


def test_an_atomic_write_into_another_file_system_stages_inside_the_directory(tmp_path):
    """/dev/shm is a tmpfs: a checkpoint directory there, reached through a symlink from a disk
    directory, cannot take a rename from the disk-side staging folder."""
    if not os.path.isdir("/dev/shm") or os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on a file system of its own")
    target = tmp_path.name + "-checkpoints"
    os.makedirs(f"/dev/shm/{target}")
    try:
        (tmp_path / "checkpoints").symlink_to(f"/dev/shm/{target}")
        common.write_text(str(tmp_path / "checkpoints" / "checkpoint.json"), "{}\n")
        assert os.listdir(f"/dev/shm/{target}") == ["checkpoint.json"]
        assert sorted(os.listdir(tmp_path)) == ["checkpoints"]
    finally:
        import shutil
        shutil.rmtree(f"/dev/shm/{target}")
