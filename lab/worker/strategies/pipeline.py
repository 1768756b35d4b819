"""The model cut into one stage per process: `pipeline` (torch.distributed.pipelining,
GPipe or 1F1B over --micro-batches) and `model-parallel` (the same cut with one
micro-batch: the source's manual model parallelism, each stage in its own process so
that it also runs on CPUs).

Every rank builds the whole model from the same seed, cuts it at the same places
(lab.worker.models.layer_costs: multiply-accumulates from shapes, identical on every
rank) and keeps its own stage only. Every stage sees the same batches: the batch is
the pipeline's, split into micro-batches.

Checkpoints (--checkpoint-every): the state is sharded by stage, and each stage's is
gathered to rank 0 into the kit's one checkpoint file (lab.worker.checkpoint), with the
stage layout, rather than written by each rank into a folder completed as DeepSpeed's is:
a stage is a part of the kit's models, which fit in one host's memory whole (FSDP's
checkpoint is gathered whole likewise), so one file keeps a single atomic rename, a
single loader and a single place to compare the layout. Each stage keeps its layers
renumbered from 0 (nn.Sequential), so torch.distributed.checkpoint's resharding by
parameter name would not apply across another cut anyway."""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from lab.common.config import ConfigError
from lab.worker import models
from lab.worker.strategies.base import Strategy


def stage_layers(model_name: str, model: torch.nn.Module, sample: torch.Tensor,
                 stages: int) -> tuple[list[list[torch.nn.Module]], list[tuple[int, int]]]:
    """The model's layers cut into `stages` contiguous stages of even cost, each starting
    at a layer with parameters (the model spec's most_stages is how many it has)."""
    layers = models.sequential_layers(model_name, model)
    was = model.training
    model.eval()   # the shape pass must not move batch-norm statistics
    try:
        bounds = models.cut_points(models.layer_costs(layers, sample), stages,
                                   [models.has_parameters(layer) for layer in layers])
    finally:
        model.train(was)
    return [layers[a:b] for a, b in bounds], bounds


class Pipeline(Strategy):
    """One stage per rank: stage k is rank k; the first takes the images, the last the
    labels and computes the loss. PipelineStage + ScheduleGPipe / Schedule1F1B, whose
    gradients are divided by the number of micro-batches (scale_grads, default True:
    torch/distributed/pipelining/schedules.py), so a step equals one on the whole batch
    with a mean loss."""

    parts_note = "a pipeline's step is its schedule of micro-batches over the stages: not split into parts"
    hook_gradients = False
    autocasts = False          # refuses bf16/fp16 (lab.common.config.NO_AUTOCAST)

    replicated = False   # each rank holds its stage only

    def __init__(self, cfg, d, device):
        super().__init__(cfg, d, device)
        self.name = cfg.strategy
        self.micro = cfg.pipeline_micro_batches()
        # Schedule1F1B refuses fewer micro-batches than stages (schedules.py): said first.
        cfg.check_world(d.size)
        self.first, self.last = d.rank == 0, d.rank == d.size - 1

    def build(self, model, loss_fn) -> None:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
        self.loss_fn = loss_fn
        sample = torch.zeros(1, *self.sample_shape)
        stages, self.bounds = stage_layers(self.cfg.model, model, sample, self.d.size)
        # Only this rank's stage is kept (and moved to its device): the rest is freed.
        self.model = torch.nn.Sequential(*stages[self.d.rank]).to(self.device)
        del model, stages
        self.optimizer = self.new_optimizer(self.model.parameters())
        self.stage = PipelineStage(self.model, self.d.rank, self.d.size, self.device)
        # model-parallel is one micro-batch, which Schedule1F1B refuses with more than one
        # stage (schedules.py); with one micro-batch GPipe is that same schedule.
        name = "gpipe" if self.cfg.strategy == "model-parallel" else self.cfg.schedule
        self.schedule_name = name
        schedule = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[name]
        self.schedule = schedule(self.stage, n_microbatches=self.micro, loss_fn=loss_fn)

    sample_shape = (1, 28, 28)   # set by the loop from the data set (train.py)

    def step(self, x, y):
        self.optimizer.zero_grad()
        losses: list = []
        args = (x,) if self.first else ()
        # return_outputs=False: the last stage need not concatenate the micro-batches'
        # outputs every step (the loss is all the loop uses).
        self.schedule.step(*args, target=y if self.last else None,
                           losses=losses if self.last else None, return_outputs=False)
        self.optimizer.step()
        if self.last:
            return torch.stack([loss.detach() for loss in losses]).mean()
        return None

    # -- checkpoints: every stage's state gathered to rank 0 (see the module's docstring)
    def layout(self) -> list[list[int]]:
        """The stage layout: each rank's layers [first, end) of the model's sequence."""
        return [list(b) for b in self.bounds]

    def checkpoint_state(self) -> tuple[dict, dict] | None:
        """Every rank's stage (its layers' and its optimizer's state, on the CPU) gathered
        to rank 0 by torch.distributed.gather_object, a collective of every rank; rank 0
        gets each as the list of the stages in order, with the layout; the others None."""
        mine = _on_cpu((self.model.state_dict(), self.optimizer.state_dict()))
        stages = [None] * self.d.size if self.first else None
        dist.gather_object(mine, stages, dst=0)
        if not self.first:
            return None
        return ({"stage_layers": self.layout(), "stages": [m for m, _ in stages]},
                {"stage_layers": self.layout(), "stages": [o for _, o in stages]})

    def load_checkpoint_state(self, model_state: dict, optimizer_state: dict) -> None:
        """This rank's stage from the whole checkpoint that every rank has read, once its
        stage layout is this run's (a stage's state fits only the layers it was cut to)."""
        saved = model_state.get("stage_layers")
        if saved != self.layout():
            raise ConfigError(f"the checkpoint cuts {self.cfg.model} into the stages {saved} and this "
                              f"run into {self.layout()} (layers per rank): a relaunch must keep "
                              f"--model and --np, or start without that run's checkpoints")
        self.model.load_state_dict(model_state["stages"][self.d.rank])
        self.optimizer.load_state_dict(optimizer_state["stages"][self.d.rank])

    def forward_stages(self, x):
        """A forward pass through every stage, no gradients: each stage receives the
        previous one's activations (their shape first); the last returns the output, the
        others None. Every rank calls it, the first with the input."""
        with torch.no_grad():
            if not self.first:
                shape = torch.zeros(8, dtype=torch.int64, device=self.device)
                dist.recv(shape, src=self.d.rank - 1)
                x = torch.empty([int(v) for v in shape[1:1 + int(shape[0])]], device=self.device)
                dist.recv(x, src=self.d.rank - 1)
            out = self.model(x)
            if self.last:
                return out
            shape = torch.zeros(8, dtype=torch.int64, device=self.device)
            shape[0] = out.dim()
            shape[1:1 + out.dim()] = torch.tensor(out.shape)
            dist.send(shape, dst=self.d.rank + 1)
            dist.send(out.contiguous(), dst=self.d.rank + 1)
            return None

    def evaluate(self, split, batch: int) -> tuple[int, int]:
        """The whole test set through the stages, forward only; only the last rank
        reports a count, so the sum over ranks counts every image once."""
        self.model.eval()
        correct, n = 0, len(split)
        for start in range(0, n, batch):
            x, y = split.take(slice(start, start + batch))
            out = self.forward_stages(x if self.first else None)
            if self.last:
                correct += int((out.argmax(1) == y).sum())
        return (correct, n) if self.last else (0, 0)

    def batch_semantics(self) -> str:
        b = self.cfg.batch_size
        if self.micro == 1:
            return f"{b} in all"
        return f"{b} in all, {self.micro} micro-batches of {b // self.micro}"

    def figures(self) -> dict:
        return {"stage_layers": [list(b) for b in self.bounds], "micro_batches": self.micro,
                "schedule": self.schedule_name}


def _on_cpu(state):
    """A copy of a state (dicts, lists, tuples of tensors) with every tensor on the CPU:
    gather_object pickles it, and a CUDA tensor would be unpickled onto the sender's GPU
    index (its docstring, torch/distributed/distributed_c10d.py: GPU tensors "not well
    supported"). copy.copy keeps a state dict's type and its _metadata (layers' versions)."""
    if isinstance(state, torch.Tensor):
        return state.detach().cpu()
    if isinstance(state, dict):
        out = copy.copy(state)
        for k, v in state.items():
            out[k] = _on_cpu(v)
        return out
    if isinstance(state, (list, tuple)):
        return type(state)(_on_cpu(v) for v in state)
    return state
