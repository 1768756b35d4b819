"""The strategy interface, data parallelism by the framework (`ddp`), and one process
over several GPUs (`dataparallel`)."""
from __future__ import annotations

import collections
import contextlib

import torch

from lab import models
from lab.common.config import ConfigError
from lab.worker import collective, compiled, data, precision
from lab.worker.compression import bytes_per_step, loss_scale_of
from lab.worker.strategies import memory


class Strategy:
    """Data parallelism: every rank holds the whole model and trains on its own shard;
    the subclasses change how the model and optimizer are wrapped, or how a step runs."""

    name = "ddp"
    # The model's forward is itself a collective (FSDP, ZeRO-3): every rank must run
    # the same number of evaluation batches.
    lockstep_eval = False
    # Every rank holds (or can gather) the whole model, and all must agree after a step.
    replicated = True

    # What the step's parts (lab.worker.step_parts) cannot separate here; None: every part.
    parts_note: str | None = None
    # The end of the backward's compute is taken from the last gradient's hook.
    hook_gradients = True
    # Each rank holds a shard of the gradients: fp16's scaler must agree over the ranks
    # on a step's overflow (lab.worker.precision.scaler).
    sharded_gradients = False
    # The step is the base class's (autocast around forward and loss, a gradient scaler
    # for fp16): False where a strategy does its precision itself, or refuses it
    # (lab.common.config.NO_AUTOCAST), and takes its images in torch's default layout.
    autocasts = True
    # The dtype the model's layers computed in, in the first training step on this rank
    # (lab.worker.precision.layer_dtypes), as the record's figures.forward_dtype
    # ("bfloat16" under bf16's autocast); None: no step yet
    forward_dtype: str | None = None

    @staticmethod
    def mark(where: str) -> None:
        """Where in its step the rank is (the training loop sets the rank's heartbeat's:
        lab.worker.heartbeat.Heartbeat.mark)."""

    def __init__(self, cfg, d, device):
        self.cfg, self.d, self.device = cfg, d, device
        self.model = self.optimizer = self.loss_fn = None
        # --compile: the module the training step calls, compiled (lab.worker.compiled);
        # None: the step calls self.model
        self.compiled = None
        own = self.autocasts
        self.scaler = precision.scaler(cfg.precision, device, self.sharded_gradients) if own else None
        # the CNNs channels-last on a GPU below fp32 (train.py converts the model)
        self.channels_last = own and precision.channels_last(cfg.precision, device, cfg.model,
                                                             cfg.framework, cfg.strategy)

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """A batch of images as the model takes them (its layout; DeepSpeed: its dtype)."""
        return precision.to_layout(x, self.channels_last)

    # -- what the training loop asks
    @property
    def data_world(self) -> int:
        """Among how many ranks the training data is split."""
        return self.cfg.data_world(self.d.size)

    @property
    def data_rank(self) -> int:
        return self.d.rank if self.data_world > 1 else 0

    def lr(self) -> float:
        """The learning rate, scaled for SGD by the data-parallel width (the linear scaling
        rule: Goyal et al. 2017, "Accurate, Large Minibatch SGD"). Adam's step does not
        grow with the gradient's size, so its rate is not scaled."""
        if models.get(self.cfg.model).optimizer == "sgd":
            return self.cfg.lr * self.data_world
        return self.cfg.lr

    def optimizer_class(self) -> tuple[type, dict]:
        """The model's optimizer (its spec: SGD with --momentum, or Adam) and its arguments,
        for every strategy that builds one (directly, ZeRO-1, RPC, DeepSpeed)."""
        if models.get(self.cfg.model).optimizer == "adam":
            return torch.optim.Adam, {"lr": self.lr()}
        return torch.optim.SGD, {"lr": self.lr(), "momentum": self.cfg.momentum}

    def new_optimizer(self, params):
        cls, kwargs = self.optimizer_class()
        return cls(params, **kwargs)

    def build(self, model: torch.nn.Module, loss_fn) -> None:
        self.loss_fn = loss_fn
        self.model = model.to(self.device)
        self.optimizer = self.new_optimizer(self.model.parameters())

    def step(self, x, y) -> torch.Tensor | None:
        """One training step on this rank's batch; the loss (detached) where this rank
        computes one. --precision bf16/fp16: autocast around the forward and the loss
        only; fp16 scales the loss and steps through the scaler (lab.worker.precision)."""
        self.optimizer.zero_grad()  # set_to_none by default; Horovod takes no argument
        x = self.prepare(x)
        # Where the rank is, for the stall watch: DDP's all-reduce is waited for at the
        # end of the backward (torch/csrc/distributed/c10d/reducer.cpp,
        # Reducer::finalize_backward: "Wait for asynchronous reduction to complete");
        # Horovod's in its optimizer's step (horovod/torch/optimizer.py 0.28.1,
        # _DistributedOptimizer.step calls self.synchronize()).
        self.mark("forward")
        module = self.model if self.compiled is None else self.compiled
        with precision.autocast(self.cfg.precision, self.device):
            with self.watching(self.model) as seen, compiled.eager(self.watched(module)):
                out = module(x)
            loss = self.loss_fn(out, y)
        self.saw(seen, out)
        self.mark("backward")
        (self.scaler.scale(loss) if self.scaler else loss).backward()
        if hasattr(self.optimizer, "skip_synchronize"):
            # Horovod: wait for the gradients' all-reduce apart from the update, so that
            # the step's parts separate them (horovod/torch/optimizer.py 0.28.1: the
            # pattern of skip_synchronize's docstring; step() would otherwise call
            # synchronize() itself). With fp16's scaler, Horovod's AMP pattern: the
            # all-reduced gradients unscaled in place between synchronize() and the step
            # under skip_synchronize(), then scaler.update() (horovod/horovod
            # examples/pytorch/pytorch_mnist.py, train_mixed_precision, 0.28.1).
            self.mark("communication")
            self.optimizer.synchronize()
            if self.scaler:
                self.scaler.unscale_(self.optimizer)
            self.mark("optimizer")
            with self.optimizer.skip_synchronize():
                self.optimizer_step()
        else:
            self.mark("optimizer")
            self.optimizer_step()
        return loss.detach()

    def watching(self, model: torch.nn.Module):
        """Around a training step's forward: the first one's layers watched for the dtype
        they compute in (lab.worker.precision.layer_dtypes); later ones, nothing."""
        if self.forward_dtype is None:
            return precision.layer_dtypes(model)
        return contextlib.nullcontext(collections.Counter())

    def watched(self, module) -> bool:
        """Whether this forward of a compiled module runs eagerly: the first one, whose
        layers `watching` hooks (traced, the hooks would be compiled into the graph)."""
        return module is self.compiled and self.forward_dtype is None

    def compile(self) -> None:
        """--compile: the training step's forward through the compiled module (the
        framework's wrapper included: lab.worker.compiled); evaluation, checkpoints and
        the figures keep the module itself."""
        self.compiled = compiled.compile_module(self.model)

    def saw(self, seen: collections.Counter, out: torch.Tensor) -> None:
        """After the forward `watching` watched: the first step's forward_dtype."""
        if self.forward_dtype is None:
            self.forward_dtype = precision.forward_dtype(seen, out)

    def optimizer_step(self) -> None:
        """The update: through fp16's scaler (which skips a step whose gradients overflowed
        and adjusts its scale), else the optimizer's own."""
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()

    def train_mode(self, training: bool) -> None:
        self.model.train(training)

    def eval_module(self) -> torch.nn.Module:
        return getattr(self.model, "module", self.model)

    def checkpoint_state(self) -> tuple[dict, dict] | None:
        """The model's and the optimizer's whole state for rank 0 to save, asked of every
        rank (a collective where the strategy shards it; None where a rank gets nothing)."""
        return self.eval_module().state_dict(), self.optimizer.state_dict()

    def load_checkpoint_state(self, model_state: dict, optimizer_state: dict) -> None:
        """The whole state that checkpoint_state gave, loaded on every rank."""
        self.eval_module().load_state_dict(model_state)
        self.optimizer.load_state_dict(optimizer_state)

    def evaluate(self, split, batch: int) -> tuple[int, int]:
        """(correct, total) over this rank's share of the test set."""
        model = self.eval_module()
        idx = data.eval_indices(len(split), self.d.rank, self.d.size)
        batches = -(-len(idx) // batch)
        if self.lockstep_eval:   # the most any rank has, so that every rank calls forward alike
            batches = -(-(-(-len(split) // self.d.size)) // batch)
        model.eval()
        correct = 0
        with torch.no_grad():
            for i in range(batches):
                sel = idx[i * batch:(i + 1) * batch].to(self.device)
                if len(sel) == 0:   # a lock-step pass with nothing left to count
                    model(self.prepare(split.take(slice(0, 1))[0]))
                    continue
                x, y = split.take(sel)
                out = model(self.prepare(x))
                correct += int((out.argmax(1) == y).sum())
        return correct, len(idx)

    def holdings(self) -> dict[str, int]:
        """This rank's bytes in parameters, gradients and optimizer state, measured."""
        return memory.holdings(self.model.parameters(), self.optimizer)

    def parameter_digest(self) -> str | None:
        """A digest of the whole model's parameters as this rank sees them (a sharded
        parameter gathered whole: a collective, so every rank calls it); None where a
        rank holds only its part of the model."""
        if not self.replicated:
            return None
        import hashlib
        h = hashlib.sha256()
        for p in self.eval_module().parameters():
            t = p.full_tensor() if hasattr(p, "full_tensor") else p
            h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()[:16]

    def images_per_step(self) -> int:
        """Images the whole job trains on per step."""
        return self.cfg.batch_size * self.data_world

    def batch_semantics(self) -> str:
        b, n = self.cfg.batch_size, self.data_world
        return f"{b} per process ({b * n} in all)" if n > 1 else f"{b} in all"

    def devices_per_node(self) -> int:
        return self.d.local_size

    def workers(self) -> int:
        """What the tables count as workers: the processes (a GPU or a CPU core each)."""
        return self.d.size

    def figures(self) -> dict:
        """Figures of this strategy for the record."""
        return {}

    def time_collective(self) -> dict | None:
        """The step's collective timed alone before training (DataParallel); None where a
        strategy's exchange is not one collective of the whole gradient."""
        return None

    def close(self) -> None:
        """Called on every rank once the last figures are gathered."""


class DataParallel(Strategy):
    """`ddp`: the framework's data parallelism (Horovod's DistributedOptimizer, torch's
    DistributedDataParallel), with gradient compression."""

    @property
    def parts_note(self) -> str | None:
        """DDP's 8-bit codecs all-gather inside their communication hook, which waits
        (lab.worker.compression.ddp_hook): the buckets before the last one are exchanged
        inside the backward, not behind it."""
        if self.cfg.framework == "ddp" and self.cfg.compression.startswith("int8"):
            return ("with an 8-bit codec DDP's hook waits for each bucket's all-gather, so the "
                    "backward part holds the exchange of every bucket but the last")
        return None

    def build(self, model, loss_fn) -> None:
        super().build(model, loss_fn)
        self.model, self.optimizer = self.d.wrap(self.model, self.optimizer, self.cfg.compression)
        codec = getattr(self.d, "codec", None)
        if self.scaler is not None and hasattr(codec, "loss_scale"):
            # the int8 codec's stored error kept unscaled (lab.worker.compression)
            codec.loss_scale = lambda: loss_scale_of(self.scaler)

    def time_collective(self) -> dict | None:
        """The step's collective timed alone on this run's payload and world
        (lab.worker.collective), before training; None with one rank. A failure is
        recorded as the figure's error, never the run's."""
        if self.d.size < 2:
            return None
        n = sum(p.numel() for p in self.eval_module().parameters())
        b = bytes_per_step(self.cfg.compression, n, self.d.size)
        try:
            return collective.measure(self.d, b["collective"], b["payload_bytes"], self.device,
                                      half=self.cfg.compression == "fp16")
        except Exception as e:      # the probe is a figure: the training goes on without it
            return {"op": b["collective"], "error": f"{type(e).__name__}: {e}"}

    def figures(self) -> dict:
        """Gradient bytes per step: what a rank hands to the collective, and an estimate
        of what it sends (lab.worker.compression.bytes_per_step)."""
        sizes = [p.numel() for p in self.eval_module().parameters()]
        n = sum(sizes)
        b = bytes_per_step(self.cfg.compression, n, self.d.size)
        out = {"gradient_values": n, "gradient_tensors": sizes, "payload_bytes_per_step": b["payload_bytes"],
               "wire_bytes_per_step_estimate": b["wire_bytes_estimate"],
               "collective": b["collective"]}
        codec = getattr(self.d, "codec", None)
        if codec is not None and codec.stats["values"]:
            # rank 0's share of nonzero gradient values its codec sent as 0 (all steps)
            out["codec_zeroed_fraction"] = codec.stats["zeroed"] / codec.stats["values"]
        return out


class SingleProcessDataParallel(Strategy):
    """`dataparallel`: torch.nn.DataParallel, one process whose every step scatters the
    batch over the GPUs, runs a replica of the model on each and gathers the outputs on
    the first (PyTorch's DataParallel docs). The batch is the whole step's, split over
    the GPUs. GPU only; untested here (no GPU)."""

    name = "dataparallel"
    parts_note = ("forward includes scattering the batch and replicating the model over the GPUs, "
                  "backward the reduction of the gradients onto the first GPU")

    def __init__(self, cfg, d, device):
        super().__init__(cfg, d, device)
        visible = torch.cuda.device_count()
        self.gpus = cfg.devices or visible
        if self.gpus > visible:
            raise ConfigError(f"--np {self.gpus} asks DataParallel for {self.gpus} GPUs and torch "
                              f"sees {visible}: lower --np")

    def build(self, model, loss_fn) -> None:
        super().build(model, loss_fn)
        # The module must sit on device_ids[0] before DataParallel replicates it; its
        # replicas' threads take autocast from inside their forward (bf16, fp16).
        if precision.autocast_dtype(self.cfg.precision) is not None:
            self.model = precision.AutocastForward(self.model, self.cfg.precision, self.device)
        self.model = torch.nn.DataParallel(self.model, device_ids=list(range(self.gpus)))

    def holdings(self) -> dict[str, int]:
        # The replicas live only during a step; what the process keeps is on GPU 0.
        return memory.holdings(self.eval_module().parameters(), self.optimizer)

    def batch_semantics(self) -> str:
        return f"{self.cfg.batch_size} in all, split over {self.gpus} GPUs"

    def devices_per_node(self) -> int:
        return self.gpus

    def workers(self) -> int:
        return self.gpus

    def figures(self) -> dict:
        return {"max_memory_allocated_per_gpu": [int(torch.cuda.max_memory_allocated(i))
                                                 for i in range(self.gpus)]}
