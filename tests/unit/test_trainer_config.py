"""The built-in trainers' hyperparameters (dtc_train.config): one frozen, typed config per job;
each backend applies the options it declares and refuses, naming them, the ones it does not."""

import dataclasses

import pytest

from dtc_train import config, stop


def test_every_option_is_a_typed_field_of_the_config_and_nothing_else_is():
    fields = {field.name for field in dataclasses.fields(config.TrainerConfig)}
    assert fields == {option.dest for option in config._options()} | {"backend"}


def test_the_defaults_and_values_are_parsed_once_into_their_types():
    parsed = config.parse(config.TENSORFLOW_HOROVOD, ["--epochs", "3", "--checkpoint-every", "500steps",
                                                      "--learning-rate", "0.02", "--warmup-epochs", "0.5"])
    assert (parsed.backend, parsed.epochs, parsed.learning_rate, parsed.warmup_epochs) == \
        (config.TENSORFLOW_HOROVOD, 3, 0.02, 0.5)
    assert parsed.checkpoint_every == stop.Schedule(500, "steps")
    assert config.parse(config.PYTORCH_DDP, []).checkpoint_every == stop.Schedule(1, "epochs")
    with pytest.raises(dataclasses.FrozenInstanceError):
        parsed.epochs = 4


@pytest.mark.parametrize("backend, flag, value", [
    (config.TENSORFLOW_MIRRORED, "data-device", "cpu"),        # tf.data input: no DALI
    (config.TENSORFLOW_PS, "dali-threads", "2"),
    (config.TENSORFLOW_PS, "progress-seconds", "5"),           # asynchronous steps: no progress within an epoch
    (config.TENSORFLOW_PS, "nonfinite-loss", "continue"),
    (config.PYTORCH_DDP, "allreduce-compression", "fp16"),     # Horovod's
    (config.PYTORCH_HOROVOD, "data-parallel", "fsdp"),
    (config.PYTORCH_HOROVOD, "cpu-replicas", "2"),
    (config.PYTORCH_SINGLE, "allreduce-compression", "fp16"),  # one process: no allreduce
    (config.PYTORCH_SINGLE, "data-parallel", "fsdp"),
])
def test_an_option_the_backend_does_not_apply_is_refused_naming_it_and_who_applies_it(backend, flag, value, capsys):
    with pytest.raises(SystemExit) as exited:
        config.parse(backend, [f"--{flag}", value])
    assert exited.value.code == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"error: hyperparameter {flag} does not apply to {config.BACKENDS[backend]}: remove it from the job's " \
           "hyperparameters (it applies to " in message, message


@pytest.mark.parametrize("backend", sorted(config.TENSORFLOW))
def test_the_tensorflow_trainers_take_bf16_and_fp16_but_the_parameter_server_refuses_fp16_saying_why(backend, capsys):
    assert config.parse(backend, ["--precision", "bf16"]).precision == "bf16"
    if backend != config.TENSORFLOW_PS:
        assert config.parse(backend, ["--precision", "fp16"]).precision == "fp16"
        return
    with pytest.raises(SystemExit) as exited:
        config.parse(backend, ["--precision", "fp16"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        f"error: hyperparameter precision=fp16 does not apply to {config.BACKENDS[backend]}: fp16 needs loss scaling, "
        "which Keras' LossScaleOptimizer does not do under ParameterServerStrategy; use precision=bf16, which needs "
        "none")


@pytest.mark.parametrize("backend, other, accepted_by, why", [
    (config.TENSORFLOW_HOROVOD, ["--gradient-accumulation-steps", "2"],
     [config.TENSORFLOW_MIRRORED, config.PYTORCH_HOROVOD, config.PYTORCH_DDP],
     "its loss scaling would judge each rank's gradients between allreduces alone; use precision=bf16 with "
     "accumulation, or fp16 without it"),
    (config.PYTORCH_DDP, ["--data-parallel", "fsdp"], [],     # data-parallel applies to DDP alone
     "loss scaling would judge each rank's gradient shard alone; use precision=bf16, which needs no loss scaling"),
])
def test_fp16_is_refused_with_a_value_it_does_not_combine_with_saying_why(backend, other, accepted_by, why, capsys):
    both = ["--precision", "fp16", *other]
    for elsewhere in accepted_by:
        assert config.parse(elsewhere, both).precision == "fp16"
    assert config.parse(backend, ["--precision", "bf16", *other]).precision == "bf16"
    assert config.parse(backend, ["--precision", "fp16"]).precision == "fp16"
    with pytest.raises(SystemExit) as exited:
        config.parse(backend, both)
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        f"error: hyperparameters precision=fp16 and {other[0][2:]}={other[1]} do not combine under "
        f"{config.BACKENDS[backend]}: {why}")


@pytest.mark.parametrize("backend", sorted(config.BACKENDS))
def test_the_loops_rules_apply_to_every_backend(backend):
    parsed = config.parse(backend, ["--early-stopping-patience", "2", "--lr-schedule", "cosine",
                                    "--checkpoint-every", "2epochs"])
    assert (parsed.early_stopping_patience, parsed.lr_schedule) == (2, "cosine")


@pytest.mark.parametrize("argv, message", [
    (["--epochs", "0"], "argument --epochs: invalid positive_int value: '0'"),
    (["--learning-rate", "0"], "argument --learning-rate: invalid positive value: '0'"),
    (["--checkpoint-every", "3days"], "argument --checkpoint-every: checkpoint-every='3days': use a count of epochs"),
    (["--progress-seconds", "-1"], "argument --progress-seconds: invalid non_negative value: '-1'"),
    (["--profile-steps", "5:2"], "argument --profile-steps: invalid step_range value: '5:2'"),
    (["--label-smoothing", "1"], "argument --label-smoothing: invalid fraction value: '1'"),
    (["--epochs", "3x"], "argument --epochs: invalid positive_int value: '3x'"),
])
def test_a_bad_value_names_the_option_and_the_value(argv, message, capsys):
    with pytest.raises(SystemExit):
        config.parse(config.PYTORCH_HOROVOD, argv)
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--epochz", "--epoch"])   # not an abbreviation of --epochs either
def test_an_unknown_option_is_refused(flag, capsys):
    with pytest.raises(SystemExit):
        config.parse(config.PYTORCH_HOROVOD, [flag, "3"])
    assert f"unrecognized arguments: {flag} 3" in capsys.readouterr().err


def test_the_pytorch_trainers_map_every_choice_the_config_offers():
    from dtc_train import torch_common

    assert tuple(torch_common.PRECISIONS) == config.PRECISIONS
