"""How a rank's work is spread over the processes: one class per strategy, each
offering the same few calls (build, step, evaluate, holdings), so the training loop
(lab.worker.train) is written once. The framework adapter (lab.worker.dist) has made
the process group before a strategy is built.

- ddp: the framework's data parallelism (Horovod's DistributedOptimizer, torch's DDP),
  with gradient compression (lab.worker.strategies.base).
- zero1, fsdp: sharded data parallelism in torch (lab.worker.strategies.sharded).
- pipeline, model-parallel: the model cut into one stage per process
  (lab.worker.strategies.pipeline).
- deepspeed (lab.worker.strategies.deepspeed), rpc-pipeline (lab.worker.strategies.rpc),
  dataparallel (lab.worker.strategies.base).
"""
from __future__ import annotations

import importlib

# strategy -> (module, class)
_CLASSES = {
    "ddp": ("base", "DataParallel"),
    "zero1": ("sharded", "Zero1"),
    "fsdp": ("sharded", "FSDP"),
    "pipeline": ("pipeline", "Pipeline"),
    "model-parallel": ("pipeline", "Pipeline"),
    "deepspeed": ("deepspeed", "DeepSpeed"),
    "rpc-pipeline": ("rpc", "RpcPipeline"),
    "dataparallel": ("base", "SingleProcessDataParallel"),
}


def create(cfg, d, device):
    """The strategy object of a run (its module imported only when used: DeepSpeed and
    RPC are not needed by the others)."""
    module, cls = _CLASSES[cfg.strategy]
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)(cfg, d, device)
