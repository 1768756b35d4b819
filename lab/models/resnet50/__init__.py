"""ResNet-50, untrained: torchvision's, or where torchvision does not import the same
network built from torch.nn (net.ResNet50)."""
from lab.models import ModelSpec, register

SPEC = register(ModelSpec(
    name="resnet50",
    about="ResNet-50 (torchvision's, or the same network from torch.nn without it)",
    synthetic=(3, 224, 1000),        # ImageNet's shape
    channels_last=True,              # convolutions: NHWC on GPUs below fp32
    most_stages=19,                  # net.layers: conv1, bn1, 16 bottlenecks, fc
    ceiling_steps=(3, 1),            # seconds a step on a CPU: a short measurement
))
