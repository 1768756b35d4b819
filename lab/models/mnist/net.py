"""The MNIST CNN's torch code (inside a rank)."""
from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F


class MnistNet(nn.Module):
    """The CNN of Horovod's PyTorch MNIST example (examples/pytorch/pytorch_mnist.py):
    conv 1->10 k5, conv 10->20 k5 with 2-D dropout, fc 320->50->10, log-softmax output,
    so that figures compare with the reference and with the source reports."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.flatten(1)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


def build(channels: int, size: int, classes: int) -> nn.Module:
    if (channels, size, classes) != (1, 28, 10):
        raise ValueError("the MNIST network takes 1x28x28 images of 10 classes")
    return MnistNet()


def layers(model: MnistNet) -> list[nn.Module]:
    """MnistNet.forward, step by step (F.dropout's default p is 0.5, as nn.Dropout's)."""
    return [model.conv1, nn.MaxPool2d(2), nn.ReLU(), model.conv2, model.conv2_drop,
            nn.MaxPool2d(2), nn.ReLU(), nn.Flatten(1), model.fc1, nn.ReLU(), nn.Dropout(),
            model.fc2, nn.LogSoftmax(dim=1)]


def fsdp_units(model: MnistNet) -> list[nn.Module]:
    """FSDP2 units before the root: the convolutions and linear layers."""
    return [m for m in model.children() if isinstance(m, (nn.Conv2d, nn.Linear))]
