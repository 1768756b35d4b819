"""The networks of the experiments."""
from __future__ import annotations

import torch
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


class ModelUnavailable(RuntimeError):
    """The model's package is missing; the message says how to install it."""


def resnet50(channels: int, classes: int) -> nn.Module:
    """torchvision's ResNet-50, untrained; with one input channel the stem's first
    convolution takes 1 channel (ResNet-50 on MNIST, as in the source benchmark)."""
    try:
        import torchvision
    except ImportError:
        raise ModelUnavailable("--model resnet50 needs torchvision: pip install "
                               "torchvision built for this torch (see README, 'ResNet-50')") from None
    except Exception as e:  # a torchvision built for another torch fails in many ways
        raise ModelUnavailable(f"torchvision does not import ({e}): install the torchvision "
                               f"built for torch {torch.__version__}") from None
    model = torchvision.models.resnet50(weights=None, num_classes=classes)
    if channels != 3:
        model.conv1 = nn.Conv2d(channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return model


def build(name: str, channels: int, classes: int) -> tuple[nn.Module, callable]:
    """The model and its loss function (taking model output and labels)."""
    if name == "mnist":
        if channels != 1 or classes != 10:
            raise ValueError("the MNIST network takes 1 channel and 10 classes")
        return MnistNet(), F.nll_loss
    if name == "resnet50":
        return resnet50(channels, classes), F.cross_entropy
    raise ValueError(f"unknown model {name!r}")
