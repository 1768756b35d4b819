"""`rpc-pipeline`: the model cut into one stage per process and driven over
torch.distributed.rpc, as PyTorch's "Distributed Pipeline Parallelism Using RPC"
tutorial does with ResNet-50 (pytorch/examples, distributed/rpc/pipeline/main.py:
DistResNet50). torch.distributed.rpc is in maintenance mode upstream (no new features;
torch.distributed.pipelining is what `--strategy pipeline` uses): this strategy is here
to reproduce the source benchmark, not as the recommended way to pipeline.

Every rank builds the whole model from the same seed (lab.worker.train), cuts it where
`pipeline` cuts it (lab.worker.strategies.pipeline.stage_layers) and keeps its own stage:
stage k lives in rank k's process. Rank 0 is the driver and also holds stage 0. For each
step the driver splits the batch into micro-batches and sends each through the stages
with asynchronous RPCs, each stage fetching its input from the one before (RRef.to_here),
so that stage k works on micro-batch i while stage k-1 works on micro-batch i+1. The loss
is the mean over micro-batches of the loss function on each micro-batch's output, so a
step equals one on the whole batch; distributed autograd carries the backward pass back
through the RPCs, and torch.distributed.optim.DistributedOptimizer updates every stage
where it lives. The other ranks' main threads do no work of their own: their processes
serve the driver's RPCs on the RPC agent's threads."""
from __future__ import annotations

import threading

import torch

from lab.common.config import ConfigError
from lab.worker.strategies import memory
from lab.worker.strategies.base import Strategy
from lab.worker.strategies.pipeline import stage_layers

# What this process holds, reachable from module-level functions that run on the RPC
# agent's threads (the driver's calls) and from holdings() on this rank's main thread:
# its stage, its share of the DistributedOptimizer (the local optimizer made in this
# process by torch.distributed.optim.optimizer._new_script_local_optimizer), and the
# bytes of the gradients distributed autograd held for its parameters in a step.
_LOCAL: dict = {"stage": None, "optimizer": None, "context_gradient_bytes": None,
                "steps_done": None}


def worker_name(rank: int) -> str:
    return f"worker{rank}"


class _Stage:
    """One stage in the process that owns it: its layers, the device they are on, and a
    lock, because the RPC agent runs the driver's calls on several threads and two
    micro-batches must not run through the same layers at once (batch-norm statistics;
    the tutorial's ResNetPart1/2 lock likewise)."""

    def __init__(self, layers: list[torch.nn.Module], device: torch.device):
        self.module = torch.nn.Sequential(*layers).to(device)
        self.device = device
        self.lock = threading.Lock()


# -- run by the RPC agent in the process that owns the stage or optimizer

def _local_stage() -> _Stage:
    """This process's stage (rpc.remote makes the caller an RRef to it)."""
    if _LOCAL["stage"] is None:
        raise RuntimeError("this process has built no rpc-pipeline stage")
    return _LOCAL["stage"]


def _stage_forward(stage_rref, x_rref, grad: bool) -> torch.Tensor:
    """Run one micro-batch through the stage: its input fetched from where the previous
    stage left it (or where the driver put it), the output returned on the CPU (the
    tutorial's forward: TensorPipe sends CPU tensors without a device map)."""
    stage = stage_rref.local_value()
    x = x_rref.to_here().to(stage.device)
    # Grad mode is per thread: the agent's threads must take the driver's.
    with stage.lock, torch.set_grad_enabled(grad):
        return stage.module(x).cpu()


def _stage_train(stage_rref, training: bool) -> None:
    stage_rref.local_value().module.train(training)


def _stage_parameter_rrefs(stage_rref) -> list:
    """One RRef per parameter of the stage, owned here (the tutorial's _parameter_rrefs)."""
    return [torch.distributed.rpc.RRef(p) for p in stage_rref.local_value().module.parameters()]


def _keep_local_optimizer(optimizer_rref) -> None:
    """Keep this process's local optimizer of the DistributedOptimizer, so that
    holdings() on this rank can measure its state."""
    _LOCAL["optimizer"] = optimizer_rref.local_value()


def _measure_context_gradients(context_id: int) -> int:
    """The bytes of the gradients distributed autograd holds in this process for the
    context (torch.distributed.autograd.get_gradients: parameter -> gradient)."""
    import torch.distributed.autograd as dist_autograd
    grads = dist_autograd.get_gradients(context_id)
    _LOCAL["context_gradient_bytes"] = memory.storage_bytes(grads.values())
    return _LOCAL["context_gradient_bytes"]


def _step_done() -> None:
    """The driver finished a step (see RpcPipeline.step on the other ranks)."""
    _LOCAL["steps_done"].release()


def _optimizer_state(local_optimizer) -> list:
    """The state a local optimizer keeps: the functional optimizer's per-parameter dict
    (torch.distributed.optim.functional_sgd._FunctionalSGD.state: the momentum buffers)
    inside the TorchScript module _ScriptLocalOptimizer, or a torch.optim optimizer's
    state inside _LocalOptimizer (optimizers without a functional twin)."""
    if local_optimizer is None:
        return []
    optim = getattr(local_optimizer, "optim", None)
    state = getattr(optim, "state", None) if optim is not None else None
    if state is None:
        return []
    return [dict(state)]


class RpcPipeline(Strategy):
    """`rpc-pipeline`: one stage per process over torch.distributed.rpc (TensorPipe),
    next to the process group that lab.worker.dist made.

    RPC's rendezvous is init_method env:// (its default), the same MASTER_ADDR and
    MASTER_PORT as the process group's. It coexists with it: under
    torch.distributed.run (TORCHELASTIC_USE_AGENT_STORE=True) every rank is a client of
    the launcher's store, and otherwise rank 0's TCPStore is multi-tenant (one server
    per port in a process) (torch/distributed/rendezvous.py, _create_c10d_store);
    init_rpc puts its keys under a prefix of its own (rpc_prefix_N,
    torch/distributed/rpc/__init__.py).

    Gradients: under distributed autograd they live in the autograd context
    (dist_autograd.get_gradients), not in the parameters' .grad, and the context is
    freed at the end of each step; the DistributedOptimizer's local optimizers
    (functional SGD under TorchScript) take them from there. holdings() counts, as
    gradients, what the context held in this process during the first step, measured
    there from its tensors; after a step no gradient is left."""

    parts_note = "a pipeline's step is its schedule of micro-batches over the stages: not split into parts"
    hook_gradients = False
    autocasts = False          # refuses bf16/fp16 (lab.common.config.NO_AUTOCAST)

    replicated = False   # each rank holds its stage only: no digest of a replica

    name = "rpc-pipeline"
    sample_shape = (1, 28, 28)   # set by the loop from the data set (train.py)

    def __init__(self, cfg, d, device):
        super().__init__(cfg, d, device)
        import torch.distributed.rpc as rpc
        if not rpc.is_available():
            raise ConfigError("this torch build has no torch.distributed.rpc (rpc.is_available() "
                              "is False): use --strategy pipeline, or a Linux build of torch")
        self.rpc = rpc
        self.micro = cfg.pipeline_micro_batches()
        self.driver = d.rank == 0
        self.stages = d.size
        self.bounds: list[tuple[int, int]] = []
        self.stage_rrefs: list = []
        self.optimizer = None
        self.started = False
        self.steps = 0

    def build(self, model, loss_fn) -> None:
        """Keep this rank's stage, then join RPC: init_rpc returns once every rank has
        joined, so every stage exists when the driver asks for it."""
        from lab.worker.dist import COLLECTIVE_TIMEOUT_S
        self.loss_fn = loss_fn
        sample = torch.zeros(1, *self.sample_shape)
        stages, self.bounds = stage_layers(self.cfg.model, model, sample, self.stages)
        _LOCAL["stage"] = _Stage(stages[self.d.rank], self.device)
        _LOCAL["optimizer"] = _LOCAL["context_gradient_bytes"] = None
        _LOCAL["steps_done"] = threading.Semaphore(0)
        self.model = _LOCAL["stage"].module   # this rank's stage only
        del model, stages
        self.timeout = COLLECTIVE_TIMEOUT_S
        # The RPC timeout is the collectives' (lab.worker.dist), not RPC's 60 s default:
        # a ResNet-50 micro-batch on a slow CPU may take longer.
        options = self.rpc.TensorPipeRpcBackendOptions(rpc_timeout=COLLECTIVE_TIMEOUT_S)
        self.rpc.init_rpc(worker_name(self.d.rank), rank=self.d.rank, world_size=self.d.size,
                          rpc_backend_options=options)
        self.started = True
        if not self.driver:
            return
        from torch.distributed.optim import DistributedOptimizer
        rpc = self.rpc
        self.stage_rrefs = [rpc.remote(worker_name(k), _local_stage) for k in range(self.stages)]
        params = []
        for rref in self.stage_rrefs:
            params += rpc.rpc_sync(rref.owner(), _stage_parameter_rrefs, args=(rref,))
        # One local optimizer per worker, made there (DistributedOptimizer.__init__).
        cls, kwargs = self.optimizer_class()
        self.optimizer = DistributedOptimizer(cls, params, **kwargs)
        for opt_rref in self.optimizer.remote_optimizers:
            rpc.rpc_sync(opt_rref.owner(), _keep_local_optimizer, args=(opt_rref,))

    # -- the driver's pipeline
    def forward(self, x: torch.Tensor, grad: bool = False, micro: int | None = None) -> list:
        """The outputs of the stages for each micro-batch of `x` (on the CPU), in order:
        each micro-batch goes through the stages as a chain of RPCs (rpc.remote up to the
        last stage, whose output comes back by rpc_async), and the driver sends the next
        micro-batch without waiting for the previous one to come out."""
        rpc = self.rpc
        futures = []
        for part in x.cpu().tensor_split(micro or self.micro):
            if len(part) == 0:
                continue
            ref = rpc.RRef(part)
            for k, stage in enumerate(self.stage_rrefs):
                args = (stage, ref, grad)
                if k < self.stages - 1:
                    ref = rpc.remote(stage.owner(), _stage_forward, args=args)
                else:
                    futures.append(rpc.rpc_async(stage.owner(), _stage_forward, args=args))
        return [f.wait() for f in futures]

    def step(self, x, y):
        """The driver: one pipelined step. The other ranks: wait until the driver has
        finished the step (it tells them by RPC), so that every rank stays within a step
        of the others and no collective of the loop (the per-epoch all-gather) waits for
        a whole epoch; their share of the work runs on their RPC threads meanwhile."""
        if not self.driver:
            if not _LOCAL["steps_done"].acquire(timeout=self.timeout):
                raise RuntimeError(f"the driver (rank 0) finished no step in {self.timeout} s "
                                   f"(LAB_COLLECTIVE_TIMEOUT)")
            return None
        import torch.distributed.autograd as dist_autograd
        ys = y.cpu().tensor_split(self.micro)
        with dist_autograd.context() as context_id:
            outs = self.forward(x, grad=True)
            loss = torch.stack([self.loss_fn(o, t) for o, t in zip(outs, ys)]).mean()
            dist_autograd.backward(context_id, [loss])
            if self.steps == 0:   # once: the gradients each process holds in a step
                self.rpc_all(_measure_context_gradients, context_id)
            self.optimizer.step(context_id)
        self.steps += 1
        for k in range(1, self.stages):   # not waited for: the worker waits on it
            self.rpc.rpc_async(worker_name(k), _step_done)
        return loss.detach()

    def rpc_all(self, fn, *args) -> list:
        """fn(*args) in every stage's process, waited for."""
        futs = [self.rpc.rpc_async(worker_name(k), fn, args=args) for k in range(self.stages)]
        return [f.wait() for f in futs]

    def train_mode(self, training: bool) -> None:
        if self.driver:
            futs = [self.rpc.rpc_async(r.owner(), _stage_train, args=(r, training))
                    for r in self.stage_rrefs]
            for f in futs:
                f.wait()

    def evaluate(self, split, batch: int) -> tuple[int, int]:
        """The driver runs the whole test set through the stages, forward only; the
        other ranks count nothing (their stages compute on the driver's RPCs)."""
        if not self.driver:
            return 0, 0
        self.train_mode(False)
        correct, n = 0, len(split)
        with torch.no_grad():
            for start in range(0, n, batch):
                x, y = split.take(slice(start, start + batch))
                out = torch.cat(self.forward(x, grad=False))
                labels = y.cpu()
                correct += int((out.argmax(1) == labels).sum())
        return correct, n

    def holdings(self) -> dict[str, int]:
        """This process's stage: its parameters, the state of its local optimizer, and
        as gradients what the autograd context held here during a step (see the class)."""
        held = memory.holdings(self.model.parameters(), None,
                               extra_state=_optimizer_state(_LOCAL["optimizer"]))
        grads = _LOCAL["context_gradient_bytes"] or 0
        held["gradients"] += grads
        held["total"] += grads
        return held

    def images_per_step(self) -> int:
        return self.cfg.batch_size

    def batch_semantics(self) -> str:
        b = self.cfg.batch_size
        if self.micro == 1:
            return f"{b} in all"
        return f"{b} in all, {self.micro} micro-batches of {b // self.micro}"

    def figures(self) -> dict:
        return {"stage_layers": [list(b) for b in self.bounds], "micro_batches": self.micro,
                "rpc_backend": "tensorpipe"}

    def close(self) -> None:
        """rpc.shutdown(graceful=True): waits until every worker has reached it and no
        RPC is outstanding."""
        if self.started:
            self.stage_rrefs = []
            self.optimizer = None
            self.rpc.shutdown()
            self.started = False
