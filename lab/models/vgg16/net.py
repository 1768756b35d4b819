"""VGG-16's torch code (inside a rank)."""
from __future__ import annotations

import torch
import torch.nn as nn

# Configuration D (torchvision/models/vgg.py, cfgs["D"]): output channels of each 3x3
# convolution, "M" a 2x2 max-pooling.
CONFIG_D = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


def build(channels: int, size: int, classes: int) -> nn.Module:
    """torchvision's VGG-16, untrained; with one input channel the first convolution
    takes 1 channel. Where torchvision is not installed or does not import (the CPU
    image), the same network built here from torch.nn: same modules, names and
    initialization, so the same state dict and the same outputs. `size` is at least the
    spec's min_size (lab.worker.data pads smaller images)."""
    try:
        import torchvision
        model = torchvision.models.vgg16(weights=None, num_classes=classes)
    except Exception:               # ImportError, or a torchvision built for another torch
        model = VGG16(classes)
    if channels != 3:
        first = nn.Conv2d(channels, 64, kernel_size=3, padding=1)
        nn.init.kaiming_normal_(first.weight, mode="fan_out", nonlinearity="relu")
        nn.init.constant_(first.bias, 0)
        model.features[0] = first
    return model


class VGG16(nn.Module):
    """VGG-16 as torchvision.models.vgg16 builds it (VGG(make_layers(cfgs["D"]))): the
    convolutions and poolings in `features`, adaptive average pooling to 7x7, and the
    classifier Linear(25088, 4096), ReLU, Dropout(0.5), Linear(4096, 4096), ReLU,
    Dropout(0.5), Linear(4096, classes); its initialization (convolutions Kaiming-normal,
    fan out, biases 0; linear weights N(0, 0.01), biases 0). torchvision's state dict
    loads into it unchanged (a test checks)."""

    def __init__(self, classes: int = 1000, dropout: float = 0.5):
        super().__init__()
        layers: list[nn.Module] = []
        width = 3
        for v in CONFIG_D:
            if v == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                layers += [nn.Conv2d(width, v, kernel_size=3, padding=1), nn.ReLU(inplace=True)]
                width = v
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096), nn.ReLU(True), nn.Dropout(p=dropout),
            nn.Linear(4096, 4096), nn.ReLU(True), nn.Dropout(p=dropout),
            nn.Linear(4096, classes))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                nn.init.constant_(m.bias, 0)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.constant_(m.bias, 0)

    def forward(self, x):
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


def layers(m: nn.Module) -> list[nn.Module]:
    """torchvision's VGG.forward: every module of features, the pooling, flatten(x, 1),
    every module of the classifier."""
    return [*m.features, m.avgpool, nn.Flatten(1), *m.classifier]


def fsdp_units(m: nn.Module) -> list[nn.Module]:
    """FSDP2 units before the root: each convolution and each linear layer, so only one
    layer's parameters are gathered at a time (the first linear layer alone holds 103M)."""
    return [x for x in (*m.features, *m.classifier) if isinstance(x, (nn.Conv2d, nn.Linear))]
