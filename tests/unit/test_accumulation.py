"""Gradient accumulation's rules (dtc_train.torch_common.Accumulation): steps per epoch from a
rank's batches, the hyperparameter's bounds, and one step over k micro-batches."""

import pytest
import torch

from dtc_train import config, torch_common, torch_model


@pytest.mark.parametrize("batches, micro_batches, steps", [(11, 1, 11), (11, 2, 5), (12, 4, 3), (3, 3, 1)])
def test_steps_per_epoch_are_the_whole_groups_of_batches(batches, micro_batches, steps):
    assert torch_common.Accumulation(micro_batches).optimizer_steps(batches, batch_size=32) == steps


def test_more_micro_batches_than_an_epoch_has_fails_naming_the_hyperparameters():
    with pytest.raises(ValueError) as error:
        torch_common.Accumulation(8).optimizer_steps(5, batch_size=64)
    assert str(error.value) == ("gradient-accumulation-steps=8 is more than the 5 batches of batch-size 64 each rank "
                                "reads per epoch: lower gradient-accumulation-steps or batch-size")


@pytest.mark.parametrize("value", ["0", "-2", "1.5"])
def test_the_hyperparameter_is_a_positive_integer(value, capsys):
    assert config.parse(config.PYTORCH_DDP, []).gradient_accumulation_steps == 1
    with pytest.raises(SystemExit):
        config.parse(config.PYTORCH_DDP, ["--gradient-accumulation-steps", value])
    assert "argument --gradient-accumulation-steps: invalid positive_int value" in capsys.readouterr().err


def test_a_step_reads_k_batches_and_steps_once_on_their_mean_loss():
    torch.manual_seed(0)
    model = torch_model.DigitsNet()
    batches = [(torch.rand(4, 1, 8, 8), torch.arange(4) % 10) for _ in range(3)]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = []
    optimizer.register_step_post_hook(lambda *_: steps.append(1))
    stream = iter(batches)
    sums = torch_common.train_step(model, optimizer, stream, accumulation=torch_common.Accumulation(3))
    assert next(stream, None) is None and len(steps) == 1      # three batches read, one step taken
    assert float(sums[2]) == 12                                 # samples: every batch's
