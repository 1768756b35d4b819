"""The gradients of published models, kept as data: for torchvision's VGG-16, ResNet-50,
ResNet-101, ResNet-152 and Inception V3 (and the kit's MNIST CNN, Horovod's example's),
each parameter tensor in the order its gradient becomes ready in the backward pass (the
reverse of registration order: the order DDP's buckets and Horovod's queue see them), its
bytes in fp32, and the share of the backward's work done when it is ready; and each
model's forward FLOPs per image. The cost model reads them to predict published scaling
results (lab.report.published) without torchvision, which CI's CPU image lacks.

The data file (published_gradients.json beside this module) is written once on a CPU by
`python -m lab.models.published_gradients --write` (torch and torchvision imported only
there); `load` reads it with the standard library. tests/test_published.py checks it
against torchvision where torchvision imports.

What is counted: FLOPs are 2 x the multiply-adds of the convolutions and linear layers (the
rest, batch norms, activations and pools, is left out; torchvision's weights list their
multiply-adds as "GFLOPS", meta["_ops"], which the test compares), measured by forward hooks
on a forward in training mode (Inception V3's auxiliary head runs, as it does in training).
A tensor's ready share is the share of those FLOPs in the layers whose forward ran at or
after its own layer's: the backward runs the layers in reverse, each taken to cost the same
multiple of its forward (about 2x: the gradients of the input and of the weights)."""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from lab import models

DATA_FILE = Path(__file__).with_name("published_gradients.json")
DTYPE_BYTES = 4     # fp32

# name -> (torchvision.models' function, its keywords, the input (channels, height, width));
# the input is the one each model is published with (Inception V3 takes 299x299; its
# default, aux_logits=True, keeps the auxiliary head a training run has). ResNet-152 is here
# for the published comparison: a ResNet-101 figure comes from ResNet-50's and -152's.
TORCHVISION = {
    "vgg16": ("vgg16", {"weights": None}, (3, 224, 224)),
    "resnet50": ("resnet50", {"weights": None}, (3, 224, 224)),
    "resnet101": ("resnet101", {"weights": None}, (3, 224, 224)),
    "resnet152": ("resnet152", {"weights": None}, (3, 224, 224)),
    "inception_v3": ("inception_v3", {"weights": None, "init_weights": False}, (3, 299, 299)),
}
# the kit's MNIST CNN (lab.models.mnist.net, Horovod's example's), built by the kit's own code
MNIST = ("lab.models.mnist.net.build(1, 28, 10)", (1, 28, 28))
NAMES = (*TORCHVISION, "mnist")
# torchvision's weights whose meta["_ops"] (multiply-adds, in billions) the test compares
WEIGHTS = {"vgg16": "VGG16_Weights", "resnet50": "ResNet50_Weights", "resnet101": "ResNet101_Weights",
           "resnet152": "ResNet152_Weights", "inception_v3": "Inception_V3_Weights"}


class DataFileError(ValueError):
    """The data file is missing a model or is not what the writer writes."""


@dataclass(frozen=True)
class Gradients:
    """One model's gradients, in the order they become ready in the backward pass."""
    name: str
    built_by: str
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    bytes: tuple[int, ...]              # fp32 bytes of each tensor
    ready_share: tuple[float, ...]      # share of the backward done when each is ready
    forward_flops: float                # per image

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes)

    @property
    def params(self) -> int:
        return self.total_bytes // DTYPE_BYTES

    @property
    def tensors(self) -> int:
        return len(self.bytes)

    def model_order_bytes(self) -> list[float]:
        """The tensors' bytes in the model's (registration) order, as the cost model's
        schedules take them (lab.report.cost_model: tensor_bytes)."""
        return [float(b) for b in reversed(self.bytes)]

    def model_order_ready(self) -> list[float]:
        """Each tensor's ready share, in the model's order (cost_model.horovod_schedule's `ready`)."""
        return list(reversed(self.ready_share))


def load(name: str, path: Path = DATA_FILE) -> Gradients:
    """One model of the data file."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise DataFileError(f"{path} is missing: write it with `python -m lab.models.published_gradients "
                            "--write` where torchvision is installed") from None
    models = data.get("models", {})
    if name not in models:
        raise DataFileError(f"{path} has no model {name!r}: it holds {', '.join(models) or 'none'}")
    m = models[name]
    g = m["gradients"]
    return Gradients(name, m["built_by"], tuple(t["name"] for t in g), tuple(tuple(t["shape"]) for t in g),
                     tuple(t["bytes"] for t in g), tuple(t["ready_share"] for t in g), m["forward_flops_per_image"])


def measure(name: str) -> dict:
    """One model's entry of the data file, computed from its torch code (torch,
    torchvision: imported here only)."""
    import torch
    if name == "mnist":
        built_by, (c, h, w) = MNIST
        model = models.get("mnist").net.build(1, 28, 10)    # the spec imports its torch code
    else:
        import torchvision
        function, keywords, (c, h, w) = TORCHVISION[name]
        built_by = f"torchvision.models.{function}({', '.join(f'{k}={v}' for k, v in keywords.items())})"
        model = getattr(torchvision.models, function)(**keywords)
    model.train()
    order, flops = [], {}

    def hook(module, inputs, output):
        out = output[0] if isinstance(output, tuple) else output
        if isinstance(module, torch.nn.Conv2d):
            per_out = module.in_channels // module.groups * module.kernel_size[0] * module.kernel_size[1]
            flops[module] = 2 * out.numel() * per_out
        elif isinstance(module, torch.nn.Linear):
            flops[module] = 2 * out.numel() * module.in_features
        else:
            flops[module] = 0
        order.append(module)

    leaves = [m for m in model.modules() if not list(m.children())]
    handles = [m.register_forward_hook(hook) for m in leaves]
    batch = 2       # batch norm in training mode needs more than one value per channel
    with torch.no_grad():
        model(torch.zeros(batch, c, h, w))
    for handle in handles:
        handle.remove()
    total = sum(flops.values())
    # the share of the backward done once a layer's own backward is: its forward and all after it
    after, done = {}, 0
    for module in reversed(order):
        done += flops[module]
        after[module] = done / total
    owner = {id(p): m for m in leaves for p in m.parameters(recurse=False)}
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    gradients = [{"name": n, "shape": list(p.shape), "bytes": p.numel() * DTYPE_BYTES,
                  "ready_share": round(after[owner[id(p)]], 6)} for n, p in reversed(params)]
    return {"built_by": built_by, "input": [c, h, w], "params": sum(p.numel() for _, p in params),
            "bytes": sum(t["bytes"] for t in gradients), "tensors": len(gradients),
            "forward_flops_per_image": total // batch, "gradients": gradients}


def write(path: Path = DATA_FILE) -> dict:
    """Compute every model's entry and write the data file; returns what it wrote."""
    import torch
    import torchvision
    data = {"about": "Each model's parameter tensors in the order their gradients become ready in the "
                     "backward pass (reverse registration order), fp32 bytes, the share of the backward "
                     "done when each is ready, and forward FLOPs per image (2 x multiply-adds of "
                     "convolutions and linear layers). Written by python -m lab.models.published_gradients "
                     "--write.",
            "torch": torch.__version__, "torchvision": torchvision.__version__,
            "models": {name: measure(name) for name in NAMES}}
    Path(path).write_text(_text(data))
    return data


def _text(data: dict) -> str:
    """The data file's JSON, one tensor a line (diffs read as lists)."""
    models = []
    for name, m in data["models"].items():
        head = ",\n".join(f"   {json.dumps(k)}: {json.dumps(v)}" for k, v in m.items() if k != "gradients")
        rows = ",\n".join(f"    {json.dumps(t)}" for t in m["gradients"])
        models.append(f'  {json.dumps(name)}: {{\n{head},\n   "gradients": [\n{rows}\n   ]\n  }}')
    top = ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in data.items() if k != "models")
    return "{\n" + top + ',\n "models": {\n' + ",\n".join(models) + "\n }\n}\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lab.models.published_gradients", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"compute with torchvision and write {DATA_FILE.name}")
    args = parser.parse_args(argv)
    if args.write:
        data = write()
        print(f"wrote {DATA_FILE} (torch {data['torch']}, torchvision {data['torchvision']})")
    for name in NAMES:
        g = load(name)
        print(f"{name:13} {g.params:>12,} params  {g.total_bytes:>13,} bytes  {g.tensors:>4} tensors  "
              f"{g.forward_flops / 1e9:8.3f} GFLOPs per image  ({g.built_by})")


if __name__ == "__main__":
    main()
