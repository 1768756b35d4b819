"""What a run is: the one list of models, frameworks, back ends, devices and data
sets, and the configuration that the launcher hands to every worker.

Nothing here imports torch, Horovod or the Docker SDK, so host and worker share it.
"""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

from lab import models
from lab.common import ccl

MODELS = models.names()           # each model is one folder and one spec (lab.models)
FRAMEWORKS = ("none", "horovod", "ddp")
# ccl: oneCCL, Horovod's third CPU back end (its CCL operations, under the MPI controller;
# lab.common.ccl), built by docker/install-horovod.sh beside MPI and Gloo.
BACKENDS = ("gloo", "mpi", "nccl", "ccl")
DEVICES = ("cpu", "cuda")
DATASETS = ("mnist", "synthetic", "digits")
COMPRESSIONS = ("none", "fp16", "int8", "int8-naive")   # lab.worker.compression has the 8-bit ones
# How the work is spread over the processes (lab.worker.strategies): data parallelism by
# the framework (ddp: Horovod's DistributedOptimizer or torch's DDP), sharded data
# parallelism (zero1, fsdp, deepspeed), the model cut into stages (pipeline,
# model-parallel: one micro-batch; rpc-pipeline over torch.distributed.rpc), and one
# process over several GPUs (dataparallel).
STRATEGIES = ("ddp", "zero1", "fsdp", "pipeline", "model-parallel", "deepspeed", "rpc-pipeline",
              "dataparallel")
# Strategies in which each rank trains on its own shard of the data; in the others every
# stage sees the same batches, and the batch is the pipeline's.
DATA_PARALLEL_STRATEGIES = ("ddp", "zero1", "fsdp", "deepspeed")
# Strategies run by torch.distributed.run (framework ddp) rather than by the framework's
# own data parallelism; dataparallel is one process (framework none).
TORCH_STRATEGIES = ("zero1", "fsdp", "pipeline", "model-parallel", "deepspeed", "rpc-pipeline")
PIPELINE_SCHEDULES = ("gpipe", "1f1b")
# What lab.worker.checkpoint saves and restores (--checkpoint-every).
CHECKPOINTED_STRATEGIES = ("ddp", "zero1", "fsdp", "deepspeed", "pipeline", "model-parallel")
# The arithmetic of a rank's forward, backward and update (lab.worker.precision does it):
# fp32; tf32 (fp32 tensors, matrix products on NVIDIA tensor cores with a 10-bit
# mantissa: CUDA only); bf16 and fp16 (torch.autocast around forward and loss, fp32
# weights and update; fp16 with a gradient scaler; DeepSpeed: its own bf16/fp16 modes).
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
# The strategies whose step cannot take autocast, and why (one clause each):
# torch.distributed.pipelining's schedule runs forward, loss and backward in one call,
# and autocast must not cover a backward; RPC runs each stage's forward in a thread of
# RPC's own, where the caller's autocast (a thread's state) does not reach.
NO_AUTOCAST = {
    "pipeline": "torch.distributed.pipelining's schedule runs forward, loss and backward in one "
                "call, and autocast must not cover a backward",
    "model-parallel": "it is the pipeline's schedule with one micro-batch, which runs forward, "
                      "loss and backward in one call, and autocast must not cover a backward",
    "rpc-pipeline": "each stage's forward runs in one of RPC's threads, which the caller's "
                    "autocast (a thread's state) does not reach",
}
# --compile (torch.compile of the model: lab.worker.compiled): the strategies that cannot
# take it, and why (one clause each).
NO_COMPILE = {
    "pipeline": "torch.distributed.pipelining's schedule runs each stage's forward and backward "
                "itself, outside the model the kit would compile",
    "model-parallel": "it is the pipeline's schedule with one micro-batch, which runs each "
                      "stage's forward and backward itself",
    "rpc-pipeline": "each stage's forward runs inside RPC's agent, in threads of its own",
    "deepspeed": "DeepSpeed's engine wraps the model and owns its forward (it has a compile of "
                 "its own, engine.compile, which the kit does not drive)",
    "dataparallel": "nn.DataParallel replicates the module into threads at every step, which "
                    "TorchDynamo does not trace",
}


def framework_of(strategy: str) -> str | None:
    """The strategy-to-framework rule, the one place it is written: the framework a
    strategy runs on, or None for ddp (data parallelism by either framework: Horovod's
    DistributedOptimizer or torch's DDP)."""
    if strategy in TORCH_STRATEGIES:
        return "ddp"                 # started by torch.distributed.run
    if strategy == "dataparallel":
        return "none"                # one process over the GPUs
    return None
# --fault RANK:STEP[:MODE]: an exception, SIGKILL to itself, or a hang at that step:
# `hang` stops calling collectives (its peers wait in theirs), `hang-data` sleeps inside
# its data loading (lab.worker.train; bench's stall watch ends the job: lab.host.watch.stall);
# `slow` makes every step from that one on take SLOW_FAULT_S longer on that rank (its
# peers wait for it in each collective: lab.worker.step_parts names that waiting);
# `slow-save` makes the first checkpoint saved at or after that step sleep SLOW_SAVE_S on
# that rank once it has said its size, as a save on slow shared storage would (the
# heartbeat's checkpoint phase bounds it: lab.common.heartbeat.bound_s)
FAULT_MODES = ("raise", "kill", "hang", "hang-data", "slow", "slow-save")
SLOW_FAULT_S = 0.05
SLOW_SAVE_S = 15.0
# scikit-learn's bundled digits: 1,797 images, 300 of them held out for testing.
DIGITS_SAMPLES, DIGITS_TEST = 1797, 300


class ConfigError(ValueError):
    """Bad input: the message is one sentence that says what to do."""


@dataclass
class RunConfig:
    """One training run, as every rank sees it."""

    model: str = "mnist"
    framework: str = "ddp"
    backend: str = "gloo"
    device: str = "cpu"
    data: str = "synthetic"
    data_dir: str = "data"
    epochs: int = 1
    batch_size: int = 64          # per rank
    test_batch_size: int = 1000   # per rank
    lr: float = 0.01              # before scaling by the world size (SGD; the model's spec picks it)
    momentum: float = 0.5
    compression: str = "none"
    seed: int = 42
    warmup_steps: int = 5         # excluded from the timing figures
    max_steps: int = 0            # per epoch; 0 = the whole shard
    synthetic_size: int = 0       # samples of synthetic data; 0 = a default per model
    threads: int = 1              # torch intra-op threads per rank
    results_dir: str = "results"
    run_id: str = "manual"
    expected_np: int = 0          # what the launcher started; 0 = unknown
    fault: str = ""               # "RANK:STEP[:MODE]" makes that rank fail or hang at that step
    stall_s: float = 0.0          # no advance for this long is a stall (0: lab.common.heartbeat's default)
    attempt: str = ""             # names this launch's failures/ folder (set by bench)
    link: str = ""                # the cluster's link shaping, RATE[/DELAY] (bench --link)
    repeat: int = 0               # which repeat of its combination this run is (bench --repeat)
    launched_at: float = 0.0      # when bench started the launcher (Unix time; 0: unknown)
    strategy: str = "ddp"         # how the work is spread (STRATEGIES)
    micro_batches: int = 0        # pipeline: micro-batches per batch (0: 4; model-parallel: 1)
    schedule: str = "gpipe"       # pipeline: gpipe or 1f1b
    zero_stage: int = 0           # deepspeed: ZeRO stage 0..3
    devices: int = 0              # dataparallel: GPUs of its one process (0: all it sees)
    precision: str = "fp32"       # fp32, tf32, bf16 or fp16 (PRECISIONS)
    checkpoint_every: int = 0     # steps between checkpoints (0: none; lab.worker.checkpoint)
    compile: bool = False         # torch.compile the model (lab.worker.compiled)
    restart: int = 0              # which relaunch of its job this is (0: the first launch; set by bench)

    def check(self) -> None:
        """Raise ConfigError for values no run could use (needs nothing installed)."""
        for name, allowed in (("model", MODELS), ("framework", FRAMEWORKS),
                              ("backend", BACKENDS), ("device", DEVICES),
                              ("data", DATASETS), ("compression", COMPRESSIONS),
                              ("strategy", STRATEGIES), ("schedule", PIPELINE_SCHEDULES),
                              ("precision", PRECISIONS)):
            value = getattr(self, name)
            if value not in allowed:
                raise ConfigError(
                    f"unknown {name} {value!r}: choose one of {', '.join(allowed)}")
        refused = models.get(self.model).refuses.get(self.strategy)
        if refused:
            raise ConfigError(f"the {self.strategy} strategy cannot run --model {self.model}: {refused}")
        for name in ("epochs", "batch_size", "test_batch_size", "threads"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, "
                                  f"not {getattr(self, name)}")
        for name in ("warmup_steps", "max_steps", "synthetic_size", "checkpoint_every"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{name.replace('_', '-')} cannot be negative")
        if self.backend == "nccl" and self.device != "cuda":
            raise ConfigError("the nccl back end runs on GPUs only: add --device cuda, "
                              "or use --backend gloo or mpi on the CPU")
        if self.backend == "ccl":
            problem = ccl.config_problem(self.framework, self.device, self.strategy, self.compression)
            if problem:
                raise ConfigError(problem)
        if self.framework == "none" and self.compression != "none":
            raise ConfigError("gradient compression needs a distributed framework: "
                              "use --framework horovod or ddp, or --compression none")
        if self.fault and self.fault_plan()[2] == "slow-save" and not self.checkpoint_every:
            raise ConfigError(f"--fault {self.fault} slows a checkpoint's save, and this run saves "
                              f"none: add --checkpoint-every N")
        if self.checkpoint_every and self.strategy == "rpc-pipeline":
            raise ConfigError("--checkpoint-every does not cover rpc-pipeline, whose optimizer state "
                              "is held by TorchScript optimizers inside RPC's agent: leave it out, or "
                              "use --strategy pipeline (the same stages over torch.distributed.pipelining, "
                              "checkpointed)")
        if self.checkpoint_every and (self.strategy not in CHECKPOINTED_STRATEGIES
                                      or self.compression.startswith("int8")):
            raise ConfigError("--checkpoint-every covers the ddp, zero1, fsdp, deepspeed, pipeline and "
                              "model-parallel strategies without an 8-bit codec (whose error feedback "
                              "is not saved): leave it out, or use one of them with --compression none "
                              "or fp16")
        self.check_strategy()
        self.check_precision()
        why = NO_COMPILE.get(self.strategy)
        if self.compile and why:
            raise ConfigError(f"the {self.strategy} strategy cannot run --compile ({why}): leave "
                              f"--compile out, or use --strategy ddp")

    def check_precision(self) -> None:
        """What --precision needs: tf32 and fp16 are the GPU's (tf32 is a mode of NVIDIA's
        tensor cores; on the CPU mixed precision is bf16, the dtype CPU autocast defaults
        to), and bf16/fp16 cannot autocast a step that a strategy runs in one piece."""
        if self.precision in ("tf32", "fp16") and self.device != "cuda":
            raise ConfigError(f"--precision {self.precision} is for GPUs: add --device cuda, or use "
                              f"--precision bf16 (or fp32) on the CPU")
        why = NO_AUTOCAST.get(self.strategy)
        if self.precision in ("bf16", "fp16") and why:
            raise ConfigError(f"the {self.strategy} strategy cannot run --precision {self.precision} "
                              f"({why}): use --precision fp32 or tf32, or --strategy ddp")

    def check_strategy(self) -> None:
        """The strategy's own rules: which framework runs it, what it takes."""
        if not 0 <= self.zero_stage <= 3:
            raise ConfigError(f"--zero-stage is DeepSpeed's ZeRO stage, 0 to 3: not {self.zero_stage}")
        if self.micro_batches < 0:
            raise ConfigError("--micro-batches cannot be negative")
        need = framework_of(self.strategy)
        if need == "ddp" and self.framework != "ddp":
            raise ConfigError(f"the {self.strategy} strategy runs on torch.distributed, started by "
                              f"torch.distributed.run: use --framework ddp (or leave it out), or "
                              f"--strategy ddp")
        if self.strategy == "dataparallel" and self.device != "cuda":
            raise ConfigError("the dataparallel strategy (nn.DataParallel) spreads one process "
                              "over GPUs: add --device cuda, or use --strategy ddp on CPUs")
        if need == "none" and self.framework != "none":
            raise ConfigError("the dataparallel strategy is one process over the GPUs: "
                              "use --framework none (or leave it out)")
        if self.strategy != "ddp" and self.compression != "none":
            raise ConfigError(f"gradient compression is for the ddp strategy, not "
                              f"{self.strategy}: use --compression none, or --strategy ddp")
        if self.strategy == "model-parallel" and self.micro_batches not in (0, 1):
            raise ConfigError("model-parallel is the pipeline with one micro-batch: use "
                              "--strategy pipeline for --micro-batches")
        m = self.pipeline_micro_batches()
        if m and self.batch_size % m:
            raise ConfigError(f"--batch-size {self.batch_size} does not split into "
                              f"{m} micro-batches: make it a multiple of --micro-batches")

    def check_world(self, world: int) -> None:
        """The rules that depend on the number of processes: the strategy's, and --fault's
        rank (a rank the run does not have would never fail, and the run end ok)."""
        rank, _, _ = self.fault_plan()
        if rank >= world or rank < -1:
            raise ConfigError(f"--fault {self.fault} names rank {rank}, but {world} process(es) have "
                              f"ranks 0 to {world - 1}: name one of those")
        if self.strategy in ("pipeline", "model-parallel", "rpc-pipeline"):
            most = models.get(self.model).most_stages
            if world > most:
                raise ConfigError(f"{self.model} can be cut into at most {most} pipeline stages "
                                  f"(one per layer with parameters), fewer than {world} "
                                  f"processes: use --np {most} or fewer")
            if self.strategy == "pipeline" and self.schedule == "1f1b" \
                    and self.pipeline_micro_batches() < world:
                raise ConfigError(f"the 1f1b schedule needs at least as many micro-batches as "
                                  f"stages ({world}): raise --micro-batches or use --schedule gpipe")

    def pipeline_micro_batches(self) -> int:
        """Micro-batches per batch of a pipelined strategy; 0 for the others."""
        if self.strategy == "model-parallel":
            return 1
        if self.strategy in ("pipeline", "rpc-pipeline"):
            return self.micro_batches or 4
        return 0

    def data_world(self, world: int) -> int:
        """Among how many ranks the training data is split: all of them for data
        parallelism, one for a pipeline (every stage sees the same batches)."""
        return world if self.strategy in DATA_PARALLEL_STRATEGIES else 1

    def fault_plan(self) -> tuple[int, int, str]:
        """--fault RANK:STEP[:MODE] -> (rank, step, mode); (-1, -1, "") without one."""
        if not self.fault:
            return -1, -1, ""
        parts = self.fault.split(":")
        try:
            if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in FAULT_MODES):
                raise ValueError
            return int(parts[0]), int(parts[1]), (parts[2] if len(parts) == 3 else "raise")
        except ValueError:
            raise ConfigError(f"--fault takes RANK:STEP or RANK:STEP:MODE with MODE "
                              f"{' or '.join(FAULT_MODES)} (for example 1:3, 1:3:kill or 1:3:hang), "
                              f"not {self.fault!r}") from None

    def train_size(self) -> int | None:
        """Training samples of the data set, where known without reading files
        (MNIST's come from its files: lab.common.fetch.mnist_train_size)."""
        if self.data == "digits":
            return DIGITS_SAMPLES - DIGITS_TEST
        if self.data == "synthetic":
            return self.synthetic_size or models.get(self.model).synthetic_train_size(self.batch_size)
        return None

    def steps_per_epoch(self, train_size: int, world: int) -> int:
        """Steps each rank takes per epoch: its shard in whole batches, capped by
        --max-steps. Synthetic data has nothing to learn, so an epoch may cycle over it:
        --max-steps sets its length."""
        shard = train_size // world
        full = shard // self.batch_size
        if full == 0:
            raise ConfigError(f"each rank's shard holds {shard} samples ({train_size} over "
                              f"{world} ranks), fewer than one batch of {self.batch_size}: lower "
                              f"--batch-size or --np, or use more data")
        if self.data == "synthetic":
            return self.max_steps or full
        return min(full, self.max_steps) if self.max_steps else full

    def check_timing(self, train_size: int, world: int) -> None:
        """ConfigError when no step would be timed: all of them within --warmup-steps."""
        steps = self.steps_per_epoch(train_size, self.data_world(world)) * self.epochs
        _, fault_step, _ = self.fault_plan()
        if fault_step >= steps:
            raise ConfigError(f"--fault {self.fault} fails at step {fault_step}, but with {world} "
                              f"rank(s) a run takes {steps} step(s) (0 to {steps - 1}): pick an "
                              f"earlier step, or raise --max-steps or --epochs")
        if steps <= self.warmup_steps:
            raise ConfigError(f"with {world} rank(s) a run takes {steps} step(s) per rank "
                              f"({self.epochs} epoch(s)) and --warmup-steps {self.warmup_steps} "
                              f"leaves none to time: lower --warmup-steps, or raise --max-steps "
                              f"or --epochs")

    def to_args(self) -> list[str]:
        """The worker's command-line arguments for this configuration."""
        args = []
        defaults = RunConfig()
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value == getattr(defaults, f.name) and f.name not in ("run_id", "results_dir"):
                continue
            args += [f"--{f.name.replace('_', '-')}", str(value)]
        return args

    def as_record(self) -> dict:
        """The configuration as stored in a results record."""
        d = dataclasses.asdict(self)
        for private in ("fault", "attempt", "results_dir", "run_id", "expected_np", "data_dir",
                        "launched_at", "stall_s", "restart"):
            d.pop(private)
        return d


def argument_parser() -> argparse.ArgumentParser:
    """A parser with one option per RunConfig field."""
    p = argparse.ArgumentParser(prog="python -m lab.worker.train",
                                description="One rank of a data-parallel training run.")
    defaults = RunConfig()
    for f in dataclasses.fields(RunConfig):
        default = getattr(defaults, f.name)
        kind = _flag_bool if isinstance(default, bool) else type(default)
        p.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, type=kind, default=default)
    return p


def _flag_bool(text: str) -> bool:
    """A bool field's value as to_args writes it (str(True)); bool("False") would be True."""
    if text not in ("True", "False"):
        raise argparse.ArgumentTypeError(f"True or False, not {text!r}")
    return text == "True"


def parse_args(argv: list[str] | None = None) -> RunConfig:
    ns = argument_parser().parse_args(argv)
    return RunConfig(**vars(ns))
