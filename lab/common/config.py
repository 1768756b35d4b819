"""What a run is: the one list of models, frameworks, back ends, devices and data
sets, and the configuration that the launcher hands to every worker.

Nothing here imports torch, Horovod or the Docker SDK, so host and worker share it.
"""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

MODELS = ("mnist", "resnet50")
FRAMEWORKS = ("none", "horovod", "ddp")
BACKENDS = ("gloo", "mpi", "nccl")
DEVICES = ("cpu", "cuda")
DATASETS = ("mnist", "synthetic", "digits")
COMPRESSIONS = ("none", "fp16", "int8", "int8-naive")   # lab.worker.compression has the 8-bit ones
FAULT_MODES = ("raise", "kill")   # --fault RANK:STEP[:MODE]: an exception, or SIGKILL to itself
# scikit-learn's bundled digits: 1,797 images, 300 of them held out for testing.
DIGITS_SAMPLES, DIGITS_TEST = 1797, 300
MNIST_TRAIN = 60000               # synthetic data for the MNIST network has MNIST's size


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
    lr: float = 0.01              # before scaling by the world size
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
    fault: str = ""               # "RANK:STEP" makes that rank raise at that step (tests)
    attempt: str = ""             # names this launch's failures/ folder (set by bench)
    link: str = ""                # the cluster's link shaping, RATE[/DELAY] (bench --link)
    repeat: int = 0               # which repeat of its combination this run is (bench --repeat)
    launched_at: float = 0.0      # when bench started the launcher (Unix time; 0: unknown)

    def check(self) -> None:
        """Raise ConfigError for values no run could use (needs nothing installed)."""
        for name, allowed in (("model", MODELS), ("framework", FRAMEWORKS),
                              ("backend", BACKENDS), ("device", DEVICES),
                              ("data", DATASETS), ("compression", COMPRESSIONS)):
            value = getattr(self, name)
            if value not in allowed:
                raise ConfigError(
                    f"unknown {name} {value!r}: choose one of {', '.join(allowed)}")
        for name in ("epochs", "batch_size", "test_batch_size", "threads"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, "
                                  f"not {getattr(self, name)}")
        for name in ("warmup_steps", "max_steps", "synthetic_size"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{name.replace('_', '-')} cannot be negative")
        if self.backend == "nccl" and self.device != "cuda":
            raise ConfigError("the nccl back end runs on GPUs only: add --device cuda, "
                              "or use --backend gloo or mpi on the CPU")
        if self.framework == "none" and self.compression != "none":
            raise ConfigError("gradient compression needs a distributed framework: "
                              "use --framework horovod or ddp, or --compression none")
        if self.fault:
            self.fault_plan()

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
                              f"{' or '.join(FAULT_MODES)} (for example 1:3 or 1:3:kill), "
                              f"not {self.fault!r}") from None

    def train_size(self) -> int | None:
        """Training samples of the data set, where known without reading files
        (MNIST's come from its files: lab.common.fetch.mnist_train_size)."""
        if self.data == "digits":
            return DIGITS_SAMPLES - DIGITS_TEST
        if self.data == "synthetic":
            return self.synthetic_size or (MNIST_TRAIN if self.model == "mnist"
                                           else 8 * self.batch_size)
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
        steps = self.steps_per_epoch(train_size, world) * self.epochs
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
                        "launched_at"):
            d.pop(private)
        return d


def argument_parser() -> argparse.ArgumentParser:
    """A parser with one option per RunConfig field."""
    p = argparse.ArgumentParser(prog="python -m lab.worker.train",
                                description="One rank of a data-parallel training run.")
    defaults = RunConfig()
    for f in dataclasses.fields(RunConfig):
        default = getattr(defaults, f.name)
        p.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name,
                       type=type(default), default=default)
    return p


def parse_args(argv: list[str] | None = None) -> RunConfig:
    ns = argument_parser().parse_args(argv)
    return RunConfig(**vars(ns))
