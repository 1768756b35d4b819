"""Checks from inside the ranks, run by tests/test_strategies.py under
torch.distributed.run with 2 processes: `python -m tests.strategy_probe CHECK OUT.json`.
The rank that can judge writes OUT.json.

- fsdp-grads: FSDP2's gradients (gathered whole) against a one-process backward on the
  whole batch, with the strategy's Gloo setting (SUM, then divide) and with FSDP2's own
  default (ReduceOp.AVG).
- pipeline-outputs: the pipeline's forward (eval mode) against the whole model's, for the
  MNIST network and ResNet-50.
- model-parallel-step: one training step of model-parallel ResNet-50 against a
  one-process step on the same batch: the loss and every updated parameter.
"""
from __future__ import annotations

import copy
import json
import os
import sys

import torch
import torch.nn.functional as F

from lab.common.config import RunConfig
from lab.worker import dist as worker_dist
from lab.worker import models
from lab.worker.strategies import create


def batch(n: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)


class Uneven(torch.nn.Module):
    """The shapes of pytorch/pytorch#162338's report (linear layers 4->3->3->2 without
    bias): first dimensions of 3 and 2, which FSDP2 pads to split over 2 ranks."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(28 * 28, 3, bias=False)
        self.b = torch.nn.Linear(3, 3, bias=False)
        self.c = torch.nn.Linear(3, 10, bias=False)

    def forward(self, x):
        x = torch.relu(self.a(x.flatten(1)))
        return F.log_softmax(self.c(torch.relu(self.b(x))), dim=1)


def fsdp_grads(d) -> dict:
    out = {}
    x, y = batch(8)
    for name, force_sum in (("mnist", True), ("mnist", False), ("uneven", True), ("uneven", False)):
        torch.manual_seed(0)
        model = models.build("mnist", 1, 28, 10)[0] if name == "mnist" else Uneven()
        ref = copy.deepcopy(model).eval()   # eval: no dropout, so both sides compute alike
        F.nll_loss(ref(x), y).backward()
        s = create(RunConfig(strategy="fsdp", framework="ddp", backend="gloo"), d, torch.device("cpu"))
        s.build(model, F.nll_loss)
        if not force_sum:
            for m in s.model.modules():
                if hasattr(m, "set_force_sum_reduction_for_comms"):
                    m.set_force_sum_reduction_for_comms(False)
        s.model.eval()
        half = slice(d.rank * 4, d.rank * 4 + 4)
        F.nll_loss(s.model(x[half]), y[half]).backward()
        err = max(float((p.grad.full_tensor() - r.grad).abs().max())
                  for p, r in zip(s.model.parameters(), ref.parameters()))
        scale = max(float(r.grad.abs().max()) for r in ref.parameters())
        out[f"{name}/{'sum' if force_sum else 'avg'}"] = {"max_abs_error": err,
                                                          "max_abs_gradient": scale}
    return out


def pipeline_outputs(d) -> dict:
    out = {}
    names = ["mnist"]
    try:
        import torchvision  # noqa: F401
        names.append("resnet50")
    except Exception:
        pass
    for name in names:
        for strategy in ("pipeline", "model-parallel"):
            cfg = RunConfig(strategy=strategy, framework="ddp", model=name, batch_size=8)
            torch.manual_seed(cfg.seed)
            model, loss_fn = models.build(name, 1, 28, 10)
            ref = copy.deepcopy(model).eval()
            s = create(cfg, d, torch.device("cpu"))
            s.sample_shape = (1, 28, 28)
            s.build(model, loss_fn)
            s.model.eval()
            x, _ = batch(8)
            got = s.forward_stages(x if s.first else None)
            if s.last:
                with torch.no_grad():
                    want = ref(x)
                out[f"{name}/{strategy}"] = {"max_abs_error": float((got - want).abs().max()),
                                             "stages": s.bounds}
    return out


def model_parallel_step(d) -> dict:
    cfg = RunConfig(strategy="model-parallel", framework="ddp", model="resnet50", batch_size=4)
    torch.manual_seed(cfg.seed)
    model, loss_fn = models.build("resnet50", 1, 28, 10)
    ref = copy.deepcopy(model)
    x, y = batch(4)
    s = create(cfg, d, torch.device("cpu"))
    s.sample_shape = (1, 28, 28)
    s.build(model, loss_fn)
    loss = s.step(x, y)
    # The same step on one process: the whole model, the whole batch, the same optimizer.
    opt = torch.optim.SGD(ref.parameters(), lr=s.lr(), momentum=cfg.momentum)
    ref_loss = loss_fn(ref(x), y)
    ref_loss.backward()
    opt.step()
    a, b = s.bounds[d.rank]
    ref_stage = torch.nn.Sequential(*models.sequential_layers("resnet50", ref)[a:b])
    err = max(float((p - r).abs().max()) for p, r in zip(s.model.parameters(), ref_stage.parameters()))
    moved = max(float((p.grad).abs().max()) for p in s.model.parameters())
    result = {"rank": d.rank, "param_max_abs_error": err, "max_abs_gradient": moved,
              "params": sum(p.numel() for p in s.model.parameters())}
    if s.last:
        result["loss"], result["ref_loss"] = float(loss), float(ref_loss)
    return result


CHECKS = {"fsdp-grads": fsdp_grads, "pipeline-outputs": pipeline_outputs,
          "model-parallel-step": model_parallel_step}


def main(check: str, path: str) -> None:
    torch.set_num_threads(1)
    d = worker_dist.DDP(RunConfig(framework="ddp", backend="gloo"))
    result = CHECKS[check](d)
    parts = d.allgather_object(result)
    if d.rank == 0:
        with open(path, "w") as f:
            json.dump(parts, f)
    d.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    sys.stdout.flush()
    os._exit(0)
