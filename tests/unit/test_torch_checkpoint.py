"""The PyTorch trainers' checkpoint record (dtc_train.torch_checkpoint): written and read back
whole, a file without a version read as version 1, a newer version refused, a foreign or
truncated file ignored."""

import pytest
import torch

from dtc_train import torch_checkpoint


def record(**changes) -> torch_checkpoint.Checkpoint:
    fields = dict(epoch=2, step=7, steps_per_epoch=23, rng=torch.get_rng_state(),
                  train_sums=torch.tensor([1.5, 2.0, 3.0], dtype=torch.float64), data_positions=["a", "b"],
                  data_order={"start": [2, 0, 0], "samples": 1437}, rank_buffers=None, grad_scaler={"scale": 8.0},
                  plateau={"best": 0.5}, model={"w": torch.ones(2)}, optimizer={"state": {}}, sharded_state=None)
    return torch_checkpoint.Checkpoint(**{**fields, **changes})


def test_a_checkpoint_is_read_back_as_written(tmp_path):
    written = record()
    path = torch_checkpoint.write(str(tmp_path), written)
    assert path == str(tmp_path / "checkpoint.pt")
    read = torch_checkpoint.read(str(tmp_path))
    assert read.version == torch_checkpoint.VERSION == 1
    assert (read.epoch, read.step, read.steps_per_epoch, read.data_positions, read.data_order, read.plateau) == \
        (2, 7, 23, ["a", "b"], {"start": [2, 0, 0], "samples": 1437}, {"best": 0.5})
    assert torch.equal(read.train_sums, written.train_sums) and torch.equal(read.model["w"], torch.ones(2))
    assert torch.equal(read.rng, written.rng) and read.grad_scaler == {"scale": 8.0}
    assert torch_checkpoint.read(str(tmp_path / "none")) is None


def test_a_file_written_before_the_version_field_reads_as_version_1(tmp_path):
    torch.save({"epoch": 3, "model": {}, "optimizer": {}, "rng": torch.get_rng_state()}, tmp_path / "checkpoint.pt")
    read = torch_checkpoint.read(str(tmp_path))
    assert (read.version, read.epoch, read.step, read.steps_per_epoch, read.sharded_state) == (1, 3, 0, None, None)


def test_a_newer_version_is_refused_and_a_foreign_file_is_ignored(tmp_path, caplog):
    torch_checkpoint.write(str(tmp_path), record(version=2))
    with pytest.raises(ValueError, match=r"checkpoint .*checkpoint.pt has version 2, newer than this image's 1"):
        torch_checkpoint.read(str(tmp_path))
    torch.save({"weights": torch.ones(1)}, tmp_path / "checkpoint.pt")
    assert torch_checkpoint.read(str(tmp_path)) is None and "not one this trainer wrote" in caplog.text
    (tmp_path / "checkpoint.pt").write_bytes(b"truncated")
    assert torch_checkpoint.read(str(tmp_path)) is None and "cannot be read" in caplog.text
