"""torchvision's ResNet-50, untrained (the source benchmark's model, seeds/004)."""
from lab.models import ModelSpec, register

SPEC = register(ModelSpec(
    name="resnet50",
    about="torchvision's ResNet-50",
    synthetic=(3, 224, 1000),        # ImageNet's shape
    most_stages=19,                  # net.layers: conv1, bn1, 16 bottlenecks, fc
    needs=("torchvision",),
    ceiling_steps=(3, 1),            # seconds a step on a CPU: a short measurement
))
