"""The PyTorch trainers' model hyperparameters (dtc_train.torch_model): architectures by name,
their input, weights from a channel, and a saved model rebuilt from model.json."""

import json
import sys

import pytest
import torch
import torchvision

from dtc_train import contract, dali_data, torch_common, torch_model


def test_digits_is_the_default_input_unchanged():
    choice = torch_model.ModelChoice.from_args("digits", None, "auto", None)
    assert choice.images == dali_data.DIGITS_IMAGES
    assert choice.images.shape("CHW") == (1, 8, 8) and not choice.images.augment
    assert choice.build(4)(torch.zeros(2, 1, 8, 8)).shape == (2, 4)


def test_a_torchvision_architecture_takes_normalised_rgb_of_the_chosen_size():
    choice = torch_model.ModelChoice.from_args("resnet18", 48, "auto", None)
    assert choice.images.shape("CHW") == (3, 48, 48) and choice.images.augment
    assert choice.images.eval_resize == 55   # 48 / 0.875, torchvision's ImageNet evaluation ratio
    assert choice.images.mean == pytest.approx((123.675, 116.28, 103.53))
    assert choice.images.std == pytest.approx((58.395, 57.12, 57.375))
    torch.manual_seed(0)
    assert choice.build(3)(torch.zeros(2, 3, 48, 48)).shape == (2, 3)
    assert torch_model.ModelChoice.from_args("resnet18", None, "off", None).images.size == 224
    assert not torch_model.ModelChoice.from_args("resnet18", None, "off", None).images.augment


def test_vit_is_built_for_the_image_size():
    model = torch_model.ModelChoice.from_args("vit_b_16", 32, "auto", None).build(5)
    assert model.image_size == 32 and model.heads.head.out_features == 5


@pytest.mark.parametrize("model, size, message", [
    ("resnet5O", None, "model='resnet5O' is neither 'digits' nor a torchvision classification architecture "
                       "(closest: resnet50"),
    ("digits", 32, "model=digits takes 8x8 images"),
    ("resnet18", 0, "image-size must be at least 1 pixel"),
])
def test_a_model_that_cannot_be_built_is_named(model, size, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        torch_model.ModelChoice.from_args(model, size, "auto", None)


def _imagenet_weights(tmp_path, name: str = "resnet18.pth", prefix: str = "") -> tuple[dict, str]:
    torch.manual_seed(7)
    state = torch_model.ModelChoice.from_args("resnet18", 32, "auto", None).build(1000).state_dict()
    path = tmp_path / name
    torch.save({prefix + k: v for k, v in state.items()}, path)
    return state, str(path)


@pytest.mark.parametrize("prefix", ["", "module."])
def test_pretrained_weights_load_all_but_a_head_for_another_class_count(tmp_path, prefix):
    saved, path = _imagenet_weights(tmp_path, prefix=prefix)
    torch.manual_seed(0)
    model = torch_model.ModelChoice.from_args("resnet18", 32, "auto", None).build(3)
    head_before = model.fc.weight.detach().clone()
    loaded, left = torch_model.load_pretrained(model, path)
    assert left == ["fc.weight [3, 512] (file: [1000, 512])", "fc.bias [3] (file: [1000])"]   # in the model's order
    assert len(loaded) == len(saved) - 2
    state = model.state_dict()
    assert all(torch.equal(state[k], saved[k]) for k in loaded)
    assert torch.equal(model.fc.weight, head_before)


def test_pretrained_weights_of_another_architecture_are_refused(tmp_path):
    _, path = _imagenet_weights(tmp_path)
    with pytest.raises(ValueError, match="none of its 122 tensors fits this model"):
        torch_model.load_pretrained(torch_model.DigitsNet(3), path)
    torch.save(torch_model.DigitsNet(3), tmp_path / "whole.pth")   # a pickled module, not a state dict
    with pytest.raises(Exception, match="Weights only load failed|holds no state dict"):
        torch_model.load_pretrained(torch_model.DigitsNet(3), str(tmp_path / "whole.pth"))


def test_pretrained_weights_are_found_in_their_channel(tmp_path, monkeypatch):
    monkeypatch.setenv("SM_CHANNEL_WEIGHTS", str(tmp_path))
    _, path = _imagenet_weights(tmp_path)
    (tmp_path / "README.txt").write_text("not weights")
    assert contract.pretrained_weights_file("weights", torch_model.WEIGHT_SUFFIXES) == path
    assert contract.pretrained_weights_file("weights/resnet18.pth", torch_model.WEIGHT_SUFFIXES) == path
    _imagenet_weights(tmp_path, name="other.pt")
    with pytest.raises(FileNotFoundError, match="channel 'weights' holds 2 weights files .*: other.pt, resnet18.pth; "
                                                "name one as pretrained-weights=weights/<path>"):
        contract.pretrained_weights_file("weights", torch_model.WEIGHT_SUFFIXES)
    with pytest.raises(FileNotFoundError, match="pretrained-weights=weights/missing.pth: .* does not exist"):
        contract.pretrained_weights_file("weights/missing.pth", torch_model.WEIGHT_SUFFIXES)
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(tmp_path / "ml"))
    with pytest.raises(FileNotFoundError, match="channel 'absent' was not given to the job"):
        contract.pretrained_weights_file("absent", torch_model.WEIGHT_SUFFIXES)


def test_a_saved_model_is_rebuilt_from_its_model_json(tmp_path):
    choice = torch_model.ModelChoice.from_args("mobilenet_v3_small", 40, "auto", None)
    torch.manual_seed(3)
    model = choice.build(3).eval()
    torch.save(model.state_dict(), tmp_path / "model.pth")
    (tmp_path / "model.json").write_text(json.dumps(choice.describe(("a", "b", "c"), val_accuracy=0.5)))
    images = torch.rand(2, 3, 40, 40)
    assert torch.equal(torch_model.load(str(tmp_path / "model.pth"))(images), model(images))
    described = json.loads((tmp_path / "model.json").read_text())
    assert described["class"] == "torchvision.models.mobilenet_v3_small" and described["classes"] == ["a", "b", "c"]
    assert described["input_shape"] == [3, 40, 40] and described["eval_resize"] == 46


def test_an_architecture_without_torchvision_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision", None)   # as in an image built without it
    monkeypatch.setitem(sys.modules, "torchvision.models", None)
    with pytest.raises(ValueError, match="^the hyperparameter model names a torchvision architecture, and torchvision "
                                         "cannot be imported here"):
        torch_model.ModelChoice.from_args("resnet18", None, "auto", None)
    assert torch_model.ModelChoice.from_args("digits", None, "auto", None).name == "digits"


@pytest.mark.parametrize(("device", "data_parallel", "expected"), [
    ("cuda", "ddp", torch.channels_last),          # cuDNN's NHWC kernels (docs/performance.md, B5)
    ("cuda", "single", torch.channels_last),       # one process: no collectives to refuse the layout
    ("cuda", "horovod", torch.contiguous_format),  # Horovod 0.28.1 refuses tensors that are not contiguous
    ("cuda", "fsdp", torch.contiguous_format),
    ("cpu", "ddp", torch.contiguous_format),
])
def test_ddp_and_one_process_on_a_gpu_train_channels_last(device, data_parallel, expected):
    assert torch_common.memory_format(torch.device(device), data_parallel) == expected


def test_a_channels_last_model_saves_weights_that_load_into_the_default_layout(tmp_path):
    torch.manual_seed(0)
    trained = torchvision.models.resnet18(num_classes=3).to(memory_format=torch.channels_last)
    assert trained.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    torch.save(trained.state_dict(), tmp_path / "model.pth")
    (tmp_path / "model.json").write_text(json.dumps(torch_model.ModelChoice.from_args(
        "resnet18", 32, "off", None).describe(("a", "b", "c"))))
    loaded = torch_model.load(str(tmp_path / "model.pth"))
    assert loaded.conv1.weight.is_contiguous()
    images = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(loaded(images), trained.eval()(images.contiguous(memory_format=torch.channels_last)))
