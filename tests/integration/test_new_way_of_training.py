"""A way of training added in two files, from outside the image's code (docs/development.md,
"A way of training"): tests/programs/new_way is a distribution whose entry points register a
launcher (``once_per_host.launcher``: the program once on every host, its port) and a trainer
(``once_per_host.numbers``: a backend of plain numbers, as tests/unit/test_loop.py's, under the
built-in trainers' loop). With it on ``PYTHONPATH`` and no other change, ``train --plan`` plans
it on every host and ``train`` runs it through the loop; without it, the job is refused as any
unknown program is. Its run on two hosts in the image: tests/cluster/test_cluster.py."""

import json

from helpers import METRIC, PROGRAMS, read_json, run_train

PLUGIN = {"PYTHONPATH": str(PROGRAMS / "new_way")}
HOSTS = ("algo-1", "algo-2")
JOB = {"sagemaker_program": "builtin:numbers", "sagemaker_once_per_host_enabled": True, "epochs": 3}


def test_a_launcher_and_a_trainer_registered_as_entry_points_are_planned_on_every_host(make_job):
    for index, host in enumerate(HOSTS):
        root = make_job(JOB, hosts=HOSTS, current_host=host)
        done = run_train(root, "--plan", env={**PLUGIN, "DTC_ONCE_PER_HOST_PORT": "7020"})
        assert done.returncode == 0, done.output
        plan = json.loads(done.stdout)
        assert (plan["strategy"], plan["role"], plan["master_host"], plan["world_size"], plan["ranks"]) == \
            ("once_per_host", "launcher", "algo-1", 2, [index])
        assert plan["argv"][1:] == ["-m", "once_per_host.numbers", "--epochs", "3"]
        assert plan["env"]["ONCE_PER_HOST_PORT"] == "7020" and plan["env"]["MASTER_ADDR"] == "algo-1"
        assert "ignoring hyperparameters" not in done.stderr      # its flag is a known one

    clash = run_train(make_job(JOB), "--plan", env={**PLUGIN, "DTC_ONCE_PER_HOST_PORT": "2226"})
    assert clash.returncode == 2 and clash.failure.startswith(
        "DTC_PRESENCE_PORT and DTC_ONCE_PER_HOST_PORT are both 2226: a host under once_per_host listens on both")

    unknown = run_train(make_job(JOB), "--plan")                 # not installed: an unknown program
    assert unknown.returncode == 2 and unknown.failure.startswith(
        "sagemaker_program 'builtin:numbers' names no built-in trainer: use one of builtin:pytorch, builtin:tensorflow")
    assert "ignoring hyperparameters this image does not read: sagemaker_once_per_host_enabled" in unknown.stderr


def test_an_entry_point_that_is_not_a_launcher_fails_the_job_naming_it(make_job, tmp_path):
    broken = tmp_path / "broken-1.0.dist-info"
    broken.mkdir()
    (broken / "METADATA").write_text("Metadata-Version: 2.1\nName: broken\nVersion: 1.0\n")
    (broken / "entry_points.txt").write_text("[dtc.launchers]\nbroken = once_per_host.numbers:TRAINER\n")
    done = run_train(make_job(JOB), "--plan", env={"PYTHONPATH": f"{tmp_path}:{PLUGIN['PYTHONPATH']}"})
    assert done.returncode == 2 and done.failure.startswith(
        "entry point broken = once_per_host.numbers:TRAINER (group dtc.launchers) is a Trainer, not a "
        "dtc_entrypoint.launchers.Launcher"), done.output


def test_the_registered_trainer_runs_through_the_built_in_trainers_loop(make_job):
    root = make_job(JOB)
    done = run_train(root, env=PLUGIN)
    assert done.returncode == 0 and (root / "output" / "success").exists(), done.output
    assert [(int(epoch), float(accuracy)) for epoch, _, accuracy, _ in METRIC.findall(done.stdout)] == \
        [(1, 0.75), (2, 0.75), (3, 0.75)], done.stdout
    assert "strategy=once_per_host" in done.stderr
    assert read_json(root / "model" / "model.json") == {"host": "algo-1", "val_accuracy": 0.75}
    assert read_json(root / "checkpoints" / "numbers.json") == {"epoch": 3, "step": 0}
    assert (root / "output" / "data" / "report").is_dir()          # the loop's observer wrote its report
