"""Sharded data parallelism in torch: ZeRO-1 (the optimizer's state split over the
ranks) and FSDP2 (parameters, gradients and optimizer state split)."""
from __future__ import annotations

import torch

from lab.worker import models
from lab.worker.strategies.base import Strategy


class Zero1(Strategy):
    """`zero1`: DDP for the gradients, torch.distributed.optim.ZeroRedundancyOptimizer
    for the update. Each rank keeps the optimizer state of its share of the parameters
    (whole parameters, assigned greedily by size: torch's `_partition_parameters`) and,
    after its step, broadcasts those parameters to the others."""

    name = "zero1"
    parts_note = ("the optimizer part includes ZeroRedundancyOptimizer's broadcast of each rank's "
                  "updated parameters")

    def build(self, model, loss_fn) -> None:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        from torch.nn.parallel import DistributedDataParallel
        self.loss_fn = loss_fn
        model = model.to(self.device)
        ids = [self.d.local_rank] if self.device.type == "cuda" else None
        self.model = DistributedDataParallel(model, device_ids=ids)  # broadcasts rank 0's state
        cls, kwargs = self.optimizer_class()
        self.optimizer = ZeroRedundancyOptimizer(self.model.parameters(), optimizer_class=cls, **kwargs)

    def checkpoint_state(self) -> tuple[dict, dict] | None:
        """Every rank's optimizer shard gathered on rank 0
        (ZeroRedundancyOptimizer.consolidate_state_dict(to=0), called on all ranks); the
        model is replicated. Loading is the base class's: ZeroRedundancyOptimizer's
        load_state_dict takes the whole state and keeps this rank's parameters' part."""
        self.optimizer.consolidate_state_dict(to=0)
        if self.d.rank != 0:
            return None
        return self.eval_module().state_dict(), self.optimizer.state_dict()


class FSDP(Strategy):
    """`fsdp`: FSDP2 (torch.distributed.fsdp.fully_shard) on a one-dimensional device
    mesh of all ranks. Each parameter is a DTensor sharded on dimension 0; forward and
    backward all-gather a unit's parameters and reduce-scatter its gradients.

    Gloo: FSDP2 reduce-scatters fp32 gradients with ReduceOp.AVG
    (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py,
    _get_gradient_divide_factors), and pytorch/pytorch#162338 (open) reports Gloo's AVG
    giving summed, not averaged, FSDP2 gradients. So on Gloo every unit reduces with SUM
    and divides afterwards (FSDPModule.set_force_sum_reduction_for_comms): right whether
    or not a user's torch has the bug. With torch 2.13 the report does not reproduce at
    2 ranks (ProcessGroupGloo gained AVG in pytorch/pytorch#149781): tests/test_strategies.py
    compares both settings' gradients with a one-process run and asserts the SUM one.
    """

    name = "fsdp"
    lockstep_eval = True   # a forward pass all-gathers parameters: every rank must take part
    parts_note = ("forward and backward include FSDP's all-gathers and reduce-scatters (its "
                  "communication is inside them, not apart)")
    hook_gradients = False     # a sharded gradient is ready only after its reduce-scatter
    sharded_gradients = True   # fp16: ShardedGradScaler all-reduces its overflow check

    def build(self, model, loss_fn) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FSDPModule, fully_shard
        self.loss_fn = loss_fn
        model = model.to(self.device)
        # fully_shard keeps each rank's shard of the tensor it is given and broadcasts
        # nothing: rank 0's parameters are sent to all first, as DDP would.
        for t in [*model.parameters(), *model.buffers()]:
            torch.distributed.broadcast(t.data, src=0)
        mesh = init_device_mesh(self.device.type, (self.d.size,))
        for unit in models.fsdp_units(self.cfg.model, model):
            fully_shard(unit, mesh=mesh)
        fully_shard(model, mesh=mesh)
        if self.cfg.backend == "gloo":
            for m in model.modules():
                if isinstance(m, FSDPModule):
                    m.set_force_sum_reduction_for_comms(True)
        self.model = model
        self.optimizer = self.new_optimizer(model.parameters())

    def eval_module(self) -> torch.nn.Module:
        return self.model

    def checkpoint_state(self) -> tuple[dict, dict] | None:
        """The sharded parameters and optimizer state gathered whole on rank 0 by
        torch.distributed.checkpoint.state_dict.get_state_dict (full_state_dict with
        cpu_offload: the other ranks get empty dicts)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
        model_state, optimizer_state = get_state_dict(
            self.model, self.optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return (model_state, optimizer_state) if self.d.rank == 0 else None

    def load_checkpoint_state(self, model_state: dict, optimizer_state: dict) -> None:
        """The whole state, which every rank has read, cut into this rank's shards by
        torch.distributed.checkpoint.state_dict.set_state_dict (full_state_dict)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict
        set_state_dict(self.model, self.optimizer, model_state_dict=model_state,
                       optim_state_dict=optimizer_state, options=StateDictOptions(full_state_dict=True))

    def evaluate(self, split, batch: int) -> tuple[int, int]:
        """The base evaluation, then every unit resharded: the root unit keeps its
        parameters whole after a forward (_fsdp_state.py: "For the root, do not reshard
        after forward"), which would leave them whole when holdings() measures them.
        FSDPModule.reshard is not recursive, so each unit is asked."""
        from torch.distributed.fsdp import FSDPModule
        out = super().evaluate(split, batch)
        for m in self.model.modules():
            if isinstance(m, FSDPModule):
                m.reshard()
        return out
