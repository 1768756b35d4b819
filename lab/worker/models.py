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


def sequential_layers(name: str, model: nn.Module) -> list[nn.Module]:
    """The model as a list of modules applied one after the other, computing what its
    forward computes, so that it can be cut into pipeline stages. The modules are the
    model's own (same parameters), with the functional steps of forward as modules."""
    if name == "mnist":
        # MnistNet.forward, step by step (F.dropout's default p is 0.5, as nn.Dropout's).
        return [model.conv1, nn.MaxPool2d(2), nn.ReLU(), model.conv2, model.conv2_drop,
                nn.MaxPool2d(2), nn.ReLU(), nn.Flatten(1), model.fc1, nn.ReLU(), nn.Dropout(),
                model.fc2, nn.LogSoftmax(dim=1)]
    if name == "resnet50":
        # torchvision's ResNet.forward (_forward_impl): the stem, every bottleneck block of
        # layer1..layer4 on its own, the pooling, flatten(x, 1), fc.
        m = model
        blocks = [b for layer in (m.layer1, m.layer2, m.layer3, m.layer4) for b in layer]
        return [m.conv1, m.bn1, m.relu, m.maxpool, *blocks, m.avgpool, nn.Flatten(1), m.fc]
    raise ValueError(f"unknown model {name!r}")


def layer_costs(layers: list[nn.Module], sample: torch.Tensor) -> list[int]:
    """Each layer's multiply-accumulates for one sample, counted on the convolutions and
    linear layers it holds from the shapes a forward pass produces: the same on every
    rank (nothing is timed), so every rank cuts the model at the same places."""
    costs = []
    x = sample
    with torch.no_grad():
        for layer in layers:
            macs = [0]

            def count(mod, inputs, out):
                if isinstance(mod, (nn.Conv2d, nn.Linear)):
                    macs[0] += out[0].numel() * mod.weight[0].numel()
            hooks = [m.register_forward_hook(count) for m in layer.modules()]
            try:
                x = layer(x)
            finally:
                for h in hooks:
                    h.remove()
            costs.append(macs[0])
    return costs


def cut_points(costs: list[int], stages: int) -> list[tuple[int, int]]:
    """Cut a list of layer costs into `stages` contiguous, non-empty ranges whose costs
    are as even as a greedy cut at the running total's k/stages marks makes them:
    [(start, end), ...]."""
    n = len(costs)
    if not 1 <= stages <= n:
        raise ValueError(f"{n} layers cannot be cut into {stages} stages")
    total = sum(costs) or 1
    bounds, run, start = [], 0, 0
    for i, c in enumerate(costs):
        run += c
        left_stages = stages - len(bounds) - 1
        # Close a stage once its share is reached, keeping a layer for each stage left.
        if left_stages and (run >= total * (len(bounds) + 1) / stages or n - i - 1 == left_stages):
            bounds.append((start, i + 1))
            start = i + 1
    bounds.append((start, n))
    return bounds
