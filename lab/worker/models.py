"""The networks of the experiments, as a rank uses them: each model's own code is in its
folder under lab/models (registered there); here is what every model shares — building
one by name, its pipeline layers, their costs and where to cut them."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from lab import models


def build(name: str, channels: int, size: int, classes: int) -> tuple[nn.Module, callable]:
    """The registered model (lab.models) for this input, and its loss function (taking
    model output and labels)."""
    spec = models.get(name)
    loss = F.nll_loss if spec.loss == "nll" else F.cross_entropy
    return spec.net.build(channels, size, classes), loss


def sequential_layers(name: str, model: nn.Module) -> list[nn.Module]:
    """The model as a list of modules applied one after the other, computing what its
    forward computes, so that it can be cut into pipeline stages (the model's own
    modules, same parameters; its net.layers)."""
    return models.get(name).net.layers(model)


def fsdp_units(name: str, model: nn.Module) -> list[nn.Module]:
    """The submodules FSDP2 shards as units of their own before the root (its net.fsdp_units)."""
    return models.get(name).net.fsdp_units(model)


def has_parameters(layer: nn.Module) -> bool:
    return any(True for _ in layer.parameters())


def layer_costs(layers: list[nn.Module], sample: torch.Tensor) -> list[int]:
    """Each layer's multiply-accumulates for one sample, counted on the convolutions,
    linear and recurrent layers it holds from the shapes a forward pass produces: the same on every
    rank (nothing is timed), so every rank cuts the model at the same places."""
    costs = []
    x = sample
    with torch.no_grad():
        for layer in layers:
            macs = [0]

            def count(mod, inputs, out):
                if isinstance(mod, (nn.Conv2d, nn.Linear)):
                    macs[0] += out[0].numel() * mod.weight[0].numel()
                elif isinstance(mod, nn.RNNBase):   # every step: the gates over input and state
                    steps = out[0].shape[1 if mod.batch_first else 0]
                    macs[0] += steps * sum(p.numel() for n, p in mod.named_parameters()
                                           if n.startswith("weight"))
            hooks = [m.register_forward_hook(count) for m in layer.modules()]
            try:
                x = layer(x)
            finally:
                for h in hooks:
                    h.remove()
            costs.append(macs[0])
    return costs


def cut_points(costs: list[int], stages: int, cuttable: list[bool] | None = None) -> list[tuple[int, int]]:
    """Cut a list of layer costs into `stages` contiguous, non-empty ranges whose costs
    are as even as a greedy cut at the running total's k/stages marks makes them:
    [(start, end), ...]. With `cuttable` (a layer holds parameters), a stage starts only
    at such a layer, so every stage has parameters to train: the layers without any
    join the stage before them (those in front, the first stage)."""
    n = len(costs)
    if cuttable is None:
        starts = list(range(n))
    else:
        first = next((i for i, c in enumerate(cuttable) if c), 0)
        starts = [0] + [i for i in range(first + 1, n) if cuttable[i]]
    units = list(zip(starts, starts[1:] + [n]))
    if not 1 <= stages <= len(units):
        raise ValueError(f"{len(units)} layers cannot be cut into {stages} stages")
    unit_costs = [sum(costs[a:b]) for a, b in units]
    total = sum(unit_costs) or 1
    bounds, run, start = [], 0, 0
    for i, c in enumerate(unit_costs):
        run += c
        left_stages = stages - len(bounds) - 1
        # Close a stage once its share is reached, keeping a unit for each stage left.
        if left_stages and (run >= total * (len(bounds) + 1) / stages
                            or len(units) - i - 1 == left_stages):
            bounds.append((start, i + 1))
            start = i + 1
    bounds.append((start, len(units)))
    return [(units[a][0], units[b - 1][1]) for a, b in bounds]
