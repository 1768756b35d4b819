"""The CNN of Horovod's PyTorch MNIST example (examples/pytorch/pytorch_mnist.py)."""
from lab.models import ModelSpec, register

SPEC = register(ModelSpec(
    name="mnist",
    about="Horovod's MNIST CNN",
    synthetic=(1, 28, 10),
    channels_last=True,              # convolutions: NHWC on GPUs below fp32
    most_stages=4,                   # net.layers: conv1, conv2, fc1, fc2 hold parameters
    loss="nll",
    synthetic_samples=60000,         # MNIST's training set size
))
