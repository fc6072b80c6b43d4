"""The digits classifier for PyTorch (also used to reload a saved ``model.pth``)."""

import torch
from torch import nn

INPUT_SHAPE = (1, 8, 8)   # channels, height, width; float32 in [0, 1]
NUM_CLASSES = 10


class DigitsNet(nn.Module):
    """Two 3x3 convolutions, 2x2 max-pooling and two dense layers: [B, 1, 8, 8] -> [B, 10] logits."""

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


def load(path: str, map_location: str = "cpu") -> DigitsNet:
    """Rebuilds the network from a ``model.pth`` state dict written by the trainer."""
    model = DigitsNet()
    model.load_state_dict(torch.load(path, map_location=map_location, weights_only=True))
    return model.eval()
