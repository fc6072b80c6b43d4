"""The PyTorch trainers' models: the digits CNN (the default, ``make train``'s), or any
torchvision classification architecture (``model=resnet50``, ``mobilenet_v3_large``,
``efficientnet_b0``, ``vit_b_16``, ...), built untrained with one output per class folder,
optionally started from a weights file in a channel (``pretrained-weights``); and how a saved
``model.pth`` is rebuilt from the ``model.json`` beside it.

Input per architecture (``ModelChoice.images``): the digits CNN takes 8x8 grayscale images as
``pixel / 255``; torchvision models take RGB ``image-size`` squares (default 224) normalised
with ImageNet's mean and standard deviation (the transforms of torchvision's pretrained
weights), augmented for training (random resized crop and flip) unless ``augment=off``, and
evaluated on the centre crop after resizing the shorter side to ``image-size / 0.875``.
"""

import difflib
import json
import os
from dataclasses import dataclass

import torch
from torch import nn

from .dali_data import DIGITS_IMAGES, ImageSpec, input_spec

DIGITS = "digits"
INPUT_SHAPE = DIGITS_IMAGES.shape("CHW")   # the digits CNN's: channels, height, width; float32 in [0, 1]
NUM_CLASSES = 10
WEIGHT_SUFFIXES = (".pth", ".pt", ".bin")


class DigitsNet(nn.Module):
    """Two 3x3 convolutions, 2x2 max-pooling and two dense layers: [B, 1, 8, 8] -> [B, classes] logits."""

    def __init__(self, num_classes: int = NUM_CLASSES):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(64 * 4 * 4, 128), nn.ReLU(), nn.Linear(128, num_classes),
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(images))


def _torchvision_models():
    """torchvision.models, or a clear error where torchvision is not installed."""
    try:
        import torchvision.models  # noqa: PLC0415  (only for torchvision architectures)
    except ImportError as error:
        raise ValueError(
            f"the hyperparameter model names a torchvision architecture, and torchvision cannot be imported here "
            f"({type(error).__name__}: {error}): use model={DIGITS}, or the GPU image, or an image whose build reached "
            "PyTorch's CPU index (docs/versions.md, Companion libraries)") from error
    return torchvision.models


def classification_models() -> list[str]:
    """torchvision's classification architectures (``torchvision.models.list_models``)."""
    models = _torchvision_models()
    return models.list_models(module=models)


@dataclass(frozen=True)
class ModelChoice:
    """The model hyperparameters, parsed once.

    Attributes:
        name: ``digits`` or a torchvision classification architecture.
        images: its input and the training augmentation (``dali_data.ImageSpec``).
        pretrained_weights: a weights file in an input channel to start from, or ``None``.
    """

    name: str
    images: ImageSpec
    pretrained_weights: str | None = None

    @classmethod
    def from_args(cls, model: str, image_size: int | None, augment: str, pretrained_weights: str | None
                  ) -> "ModelChoice":
        """Checks and combines the hyperparameters ``model``, ``image-size``, ``augment`` (``auto``:
        on for torchvision architectures, off for the digits CNN) and ``pretrained-weights``
        (``CHANNEL`` or ``CHANNEL/PATH``: ``contract.pretrained_weights_file``).

        Raises:
            ValueError: an unknown architecture (the closest names given), torchvision missing,
                an image size below 1, or the digits CNN at another size than 8.
        """
        if model != DIGITS:
            known = classification_models()
            if model not in known:
                close = difflib.get_close_matches(model, known, n=3) or known[:5]
                raise ValueError(f"model={model!r} is neither {DIGITS!r} nor a torchvision classification architecture "
                                 f"(closest: {', '.join(close)}; all: torchvision.models.list_models)")
        images = input_spec(model == DIGITS, image_size, augment, "a torchvision architecture (model=resnet50, ...)")
        return cls(model, images, pretrained_weights or None)

    def build(self, num_classes: int) -> nn.Module:
        """The untrained model with ``num_classes`` outputs (the caller seeds ``torch``'s RNG, so
        every rank builds the same initial weights)."""
        if self.name == DIGITS:
            return DigitsNet(num_classes)
        options = {"num_classes": num_classes}
        if self.name.startswith("vit_"):   # ViT's position embeddings are sized for the input
            options["image_size"] = self.images.size
        return _torchvision_models().get_model(self.name, weights=None, **options)

    def describe(self, classes: tuple[str, ...], **extra) -> dict:
        """``model.json``: what rebuilds and feeds the saved state dict (``load``)."""
        built_by = "dtc_train.torch_model.DigitsNet" if self.name == DIGITS else f"torchvision.models.{self.name}"
        return {"framework": "pytorch", "format": "state_dict", "model": self.name, "class": built_by,
                "num_classes": len(classes), "input_shape": list(self.images.shape("CHW")),
                "input_normalization": {"mean": list(self.images.mean), "std": list(self.images.std),
                                        "formula": "(pixel - mean) / std, pixel in 0..255"},
                "eval_resize": self.images.eval_resize, "classes": list(classes), **extra}


def _state_dict_in(saved: object, path: str) -> dict:
    """The state dict in a loaded weights file: the file itself, or its ``state_dict`` or
    ``model`` entry (PyTorch Lightning's and this trainer's checkpoint layouts), without the
    ``module.`` prefix that a DDP-wrapped model's keys carry."""
    for key in ("state_dict", "model"):
        if isinstance(saved, dict) and isinstance(saved.get(key), dict):
            saved = saved[key]
    if not isinstance(saved, dict) or not all(isinstance(v, torch.Tensor) for v in saved.values()):
        raise ValueError(f"pretrained-weights file {path} holds no state dict (a dict of tensors, as torch.save("
                         "model.state_dict()) writes); a whole pickled model cannot be read safely")
    return {k.removeprefix("module."): v for k, v in saved.items()}


def load_pretrained(model: nn.Module, path: str) -> tuple[list[str], list[str]]:
    """Copies the tensors of the state dict at ``path`` into ``model`` where name and shape match
    (``torch.load(weights_only=True)``: no code runs). A classifier head sized for another
    number of classes (``fc``, ``classifier.N``, ``heads.head``) keeps its initial values.

    Returns:
        (names loaded, names of ``model``'s state left at their initial values, each with its
        shape in the model and in the file).

    Raises:
        ValueError: the file holds no state dict, or none of its tensors fits ``model``.
    """
    saved = _state_dict_in(torch.load(path, map_location="cpu", weights_only=True), path)
    own = model.state_dict()
    fitting = {k: v for k, v in saved.items() if k in own and own[k].shape == v.shape}
    if not fitting:
        raise ValueError(f"pretrained-weights file {path}: none of its {len(saved)} tensors fits this model (names "
                         f"{', '.join(list(saved)[:3])} ...; the model's {', '.join(list(own)[:3])} ...): give the "
                         "weights of the architecture the hyperparameter model names")
    model.load_state_dict(fitting, strict=False)
    left = [f"{k} {list(v.shape)}" + (f" (file: {list(saved[k].shape)})" if k in saved else " (not in the file)")
            for k, v in own.items() if k not in fitting]
    return sorted(fitting), left


def load(path: str, map_location: str = "cpu") -> nn.Module:
    """Rebuilds a model saved by the trainer from ``model.pth`` (state dict) and the
    ``model.json`` beside it (architecture and class count; a ``model.pth`` without one is the
    10-class digits CNN), in evaluation mode."""
    described = os.path.join(os.path.dirname(path), "model.json")
    meta = {}
    if os.path.exists(described):
        with open(described) as handle:
            meta = json.load(handle)
    name = meta.get("model", DIGITS)
    size = None if name == DIGITS else meta["input_shape"][-1]
    model = ModelChoice.from_args(name, size, "off", None).build(meta.get("num_classes", NUM_CLASSES))
    model.load_state_dict(torch.load(path, map_location=map_location, weights_only=True))
    return model.eval()
