"""VGG-16 (Simonyan and Zisserman, "Very Deep Convolutional Networks for Large-Scale Image
Recognition", 2015, configuration D), untrained: torchvision's, or where torchvision does
not import the same network built from torch.nn (net.VGG16). 138,357,544 parameters at
1,000 classes against ResNet-50's 25,557,032 (553 MB of float32 gradients a step against
102 MB), 123.6M of them in its three fully connected layers: the classic
communication-bound model beside ResNet-50's compute-bound one.

What it is fed: its five 2x2 max-poolings halve the image five times, so a side below 32
pools to nothing (torchvision's VGG weights declare min_size (32, 32): torchvision/models/
vgg.py, _COMMON_META). MNIST and the digits (28x28) are padded with their background to
32x32 (min_size below; lab.worker.data.pad_to), as LeNet-5 took MNIST (LeCun et al.,
"Gradient-Based Learning Applied to Document Recognition", 1998, section II.B: its input
is a 32x32 image, larger than the 28x28 field MNIST's digits are centred in); synthetic
data is ImageNet's shape, as ResNet-50's. The
classifier head is torchvision's (4096, 4096, then one output per class of the data:
10 on MNIST and the digits, 1,000 on synthetic data), so the fully connected layers
that make VGG-16 communication-bound are all there at every input size: its adaptive
pooling makes the 512 maps 7x7 whatever the side (a 1x1 map at 32x32, repeated)."""
from lab.models import ModelSpec, register

SPEC = register(ModelSpec(
    name="vgg16",
    about="VGG-16 (torchvision's, or the same network from torch.nn without it; "
          "MNIST and the digits padded to 32x32)",
    synthetic=(3, 224, 1000),        # ImageNet's shape
    min_size=32,                     # five 2x2 poolings: 32 -> 1 (see above)
    channels_last=True,              # convolutions: NHWC on GPUs below fp32
    most_stages=16,                  # net.layers: 13 convolutions, 3 linear layers
    ceiling_steps=(3, 1),            # seconds a step on a CPU at 224x224: a short measurement
))
