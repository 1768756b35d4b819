"""The run options, each declared once: its name, default, help, the tasks that take it
as a flag, and what it is to the kit (a list a sweep crosses, part of what tells one run
from another in a run folder, part of the setup the report never compares across).

Everything else is derived from this table: bench's settings (lab.host.settings.BenchSettings),
the signatures and help of `invoke bench`, `invoke sbatch` and `invoke k8s`
(lab.host.cli.flag_help), invoke.yaml's `bench:` keys, the resume key (lab.host.request.plan) and the
report's setup (lab.report.records). A run's default is RunConfig's (what the ranks see),
unless the row gives its own. Nothing here imports torch, so host and ranks share it."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from lab import models
from lab.common.config import (
    BACKENDS,
    COMPRESSIONS,
    DATASETS,
    DEVICES,
    FRAMEWORKS,
    PRECISIONS,
    SLOW_SAVE_S,
    STRATEGIES,
    RunConfig,
)
from lab.common.stats import fewest_to_separate

RUN = object()                  # default: RunConfig's field of the same name
BENCH = ("bench",)
ONE_JOB = ("bench", "sbatch", "k8s")    # a script for another cluster carries it (one value)
REACHES = ("ranks", "bench", "place")    # Option.reach
GROUPS = ("the experiment", "where it runs", "measurement and records", "parallel strategies",
          "advanced")               # invoke bench --help's groups, in this order


@dataclass(frozen=True)
class Option:
    name: str                   # the setting; its flag is the name with '-' for '_'
    help: str
    group: str                  # one of GROUPS
    default: object = RUN
    kind: type = str            # str, int, float, bool; list: np
    tasks: tuple = BENCH        # the tasks that take it as a flag (): a setting no flag sets
    choices: tuple = ()         # with sweeps: what a comma list may hold
    sweeps: bool = False        # a comma list sweeps (one combination per value)
    key: bool = False           # tells one run from another in a run folder (--resume): the
                                # record's configuration must hold it (RunConfig.as_record)
    setup: bool = False         # runs that differ are never compared by the report
    setting: bool = True        # a field of bench's settings (False: what the task does with them)
    strategies: tuple = ()      # the strategies that read it (): all of them
    # How every place honours it (tests/test_places.py walks every row x every place):
    # "ranks" (the default: a row that only changes what the ranks do needs nothing more):
    #   what the ranks get, their arguments (a field of RunConfig: RunConfig.to_args) or
    #   their environment (lab.host.places.launch.job_env), which every place passes through;
    # "bench": what bench does on this machine, the same whatever the place;
    # "place": it chooses or shapes where the ranks run: each place honours it (its
    #   Runner.honours) or refuses it in one sentence (lab.host.places.refusal).
    reach: str = "ranks"
    feature: str = ""           # a feature of lab.host.places.base.FEATURES that the place
                                # offers, or says in one line why not
    # The combination test (tests/test_combinations.py) crosses, pairwise, every option
    # that changes what the ranks do: the values of its choices, or, for a number, these
    # few representative ones (the default first).
    crossed: tuple = ()

    def __post_init__(self):
        assert self.reach in REACHES, f"{self.name}: reach is one of {REACHES}"

    @property
    def flag(self) -> str:
        return self.name.replace("_", "-")

    @property
    def value(self):
        """The default: the row's, or RunConfig's."""
        return getattr(RunConfig, self.name) if self.default is RUN else self.default

    @property
    def crosses(self) -> tuple:
        """The values the combination test crosses: `crossed`, or the choices but `auto`
        (which resolves to one of the others where the ranks' stack is known)."""
        return self.crossed or tuple(c for c in self.choices if c != "auto")


# --repeat auto (lab.host.run.repeat_auto runs it): the first repeats of every combination
# (an interval needs at least 2), and the most, unless auto:N says otherwise.
AUTO_FIRST = 3
AUTO_MAX = 10
REPEAT_AUTO_HELP = (f"auto: {AUTO_FIRST} repeats, then one more a round of the configurations a t test "
                    f"does not yet tell apart, up to {AUTO_MAX} (auto:N: up to N, at least {fewest_to_separate()})")

_E, _W, _M, _S, _A = GROUPS
OPTIONS = (
    # the experiment
    Option("np", "process counts, one or a comma list: 2 or 1,2,4 (a sweep)", _E,
           default=dataclasses.MISSING, kind=list, tasks=ONE_JOB, reach="bench"),
    Option("framework", "auto (Horovod if installed, else DDP), horovod, ddp or none; a comma list sweeps",
           _E, default="auto", tasks=ONE_JOB, choices=("auto", *FRAMEWORKS), sweeps=True, key=True),
    Option("backend", "gloo, mpi, nccl or ccl (oneCCL, Horovod on CPUs); a comma list sweeps (what cannot run here is skipped and "
           "recorded)", _E, tasks=ONE_JOB, choices=BACKENDS, sweeps=True, key=True),
    Option("compression", "gradient compression: none, fp16, int8 (scaled, error feedback) or "
           "int8-naive (a plain cast, the baseline that fails); a comma list sweeps", _E,
           tasks=ONE_JOB, choices=COMPRESSIONS, sweeps=True, key=True),
    Option("model", "; ".join(f"{n}: {models.get(n).about}" for n in models.names()), _E,
           tasks=ONE_JOB, key=True, setup=True, choices=models.names()),
    Option("data", "synthetic, mnist (downloaded into the data folder when it is not there) or digits (offline)", _E,
           tasks=ONE_JOB, key=True, setup=True, choices=DATASETS),
    Option("device", "cpu or cuda (one GPU per rank)", _E, tasks=ONE_JOB, key=True, setup=True,
           choices=DEVICES),
    Option("precision", "the ranks' arithmetic: fp32; tf32 (fp32 with TF32 matrix products, GPUs); "
           "bf16 or fp16 (autocast mixed precision, fp16 with a gradient scaler; GPUs, bf16 on "
           "CPUs too; DeepSpeed: its own bf16/fp16 mode); the ceiling is measured at it; a comma "
           "list sweeps", _E, tasks=ONE_JOB, choices=PRECISIONS, sweeps=True, key=True, setup=True),
    Option("compile", "torch.compile the model (TorchDynamo and Inductor; DDP: its bucket-split graphs): "
           "the compiler's seconds are recorded apart (figures.compile_s) and a step in which it "
           "ran is never timed; the ddp, zero1 and fsdp strategies", _E, kind=bool, tasks=ONE_JOB,
           key=True, setup=True),
    Option("batch_size", "images per rank per step", _E, kind=int, tasks=ONE_JOB, key=True, setup=True,
           crossed=(64, 16)),
    Option("epochs", "epochs per run", _E, kind=int, tasks=ONE_JOB, key=True, setup=True),
    Option("max_steps", "cap on steps per epoch (0: the whole shard)", _E, kind=int, tasks=ONE_JOB,
           key=True, setup=True),
    Option("seed", "the random seed of the model's weights and the data's order", _E, kind=int,
           tasks=ONE_JOB, key=True),
    # where it runs
    Option("local", "run the ranks as local processes even when a lab image is built", _W,
           default=False, kind=bool, setting=False, reach="place"),
    Option("where", "local | image | auto (invoke.yaml: auto): set by --local and --image", _W,
           default="local", tasks=(), reach="place"),
    Option("image", "the lab image to run in (default: the built one that fits --device)", _W,
           default="", reach="place"),
    Option("frozen", "in the image, run its own copy of the kit instead of the checkout's", _W,
           default=False, kind=bool, reach="place"),
    Option("nodes", "run on this many nodes of the simulated cluster (invoke up), --np spread "
           "evenly; 1,2 sweeps", _W, default=1, kind=int, sweeps=True, reach="place"),
    Option("link", "with --nodes: limit each node's link, RATE[/DELAY] such as 1gbit or 100mbit/1ms",
           _W, key=True, reach="place"),
    Option("launcher", "on the cluster: direct (the kit starts the launchers) or slurm (an sbatch "
           "job; invoke up --scheduler slurm); k8s: a Kubeflow job on the kubeconfig's cluster "
           "(invoke.yaml's k8s: options)", _W, default="direct", reach="place"),
    Option("partition", "with --launcher slurm: the partition to submit to (default: the cluster's "
           "default)", _W, default="", reach="place"),
    Option("hosts", "your servers over SSH, HOST:SLOTS,...: h1:4,h2:4 (run from the first; same "
           "kit, Python path and results folder on each)", _W, default="", reach="place"),
    Option("hostfile", "or a file of `host slots=N` lines (mpirun's and horovodrun's format)", _W,
           default="", reach="place"),
    Option("threads", "CPU threads per rank", _W, kind=int, tasks=ONE_JOB, key=True, setup=True),
    # measurement and records
    Option("repeat", "runs of each combination, interleaved (all once, then all again); tables give "
           f"medians and spread; {REPEAT_AUTO_HELP}", _M, default=1, kind=int, key=True, reach="bench"),
    Option("repeat_max", "--repeat auto[:N]: at most N (0: exactly --repeat)", _M, default=0,
           kind=int, tasks=(), reach="bench"),
    Option("warmup_steps", "steps left out of the timing", _M, kind=int, tasks=ONE_JOB, key=True),
    Option("results_dir", "where results/<run-id>/results.jsonl goes", _M, tasks=ONE_JOB, reach="place"),
    Option("run_id", "append to this run instead of starting a new one", _M, default="",
           tasks=ONE_JOB),
    Option("resume", "with --run-id: run only the sweep's combinations that have no ok record yet",
           _M, default=False, kind=bool, setting=False, reach="bench", feature="resume"),
    Option("ceiling", "also measure the compute ceiling (model steps, no framework) and compare", _M,
           default=False, kind=bool, reach="bench", feature="ceiling placement"),
    Option("no_wait", "when another run holds this machine (its cores, or the simulated cluster's "
           "nodes on it), refuse at once instead of waiting for it to end", _M, default=False,
           kind=bool, reach="bench"),
    Option("timeout_s", "seconds a run may take before it is stopped and recorded as failed "
           "(0: no limit)", _M,
           default=0.0, kind=float, reach="bench"),
    Option("stall_s", "seconds of silence outside steps before the run is stopped and recorded as "
           "stalled (a step may take 10 x the slowest step, never less than this; auto: 60 s for "
           "steps, 180 s in the rendezvous, 300 s elsewhere; off: no watch)", _M, default=0.0,
           kind=float, reach="bench", feature="stall watch"),
    Option("profile_startup", "after the table, where each run's start-up went: the host's phases "
           "(plan, runner, stack probe, checks), the launcher, the ranks' imports, rendezvous, data, "
           "setup and warm-up (every record holds them)", _M, default=False, kind=bool,
           setting=False, reach="bench"),
    # parallel strategies
    Option("strategy", "how the work is spread: ddp (data parallel, the default), zero1, fsdp, "
           "pipeline, model-parallel, deepspeed, rpc-pipeline or dataparallel (GPUs); a comma list "
           "sweeps", _S, tasks=ONE_JOB, choices=STRATEGIES, sweeps=True, key=True),
    Option("micro_batches", "pipeline, rpc-pipeline: micro-batches per batch (default: 4)", _S,
           kind=int, tasks=ONE_JOB, key=True, strategies=("pipeline", "rpc-pipeline", "model-parallel")),
    Option("schedule", "pipeline: gpipe (the default) or 1f1b", _S, tasks=ONE_JOB, key=True,
           strategies=("pipeline",)),
    Option("zero_stage", "deepspeed: ZeRO stage 0, 1, 2 or 3 (default: 0)", _S, kind=int, tasks=ONE_JOB,
           key=True, strategies=("deepspeed",)),
    # advanced
    Option("data_dir", "where MNIST is cached", _A, tasks=("bench", "sbatch"), reach="place"),
    Option("synthetic_size", "samples of --data synthetic (0: a default per model)", _A, kind=int,
           key=True),
    Option("fault", "RANK:STEP[:MODE]: that rank raises (MODE kill: SIGKILLs itself; hang: stops "
           "calling collectives; hang-data: sleeps in its data loading; slow: each step from then "
           f"on takes 50 ms longer; slow-save: the first checkpoint saved from then on sleeps {SLOW_SAVE_S:g} s, "
           "as on slow storage, with --checkpoint-every) at that step, to see a failed, stalled or "
           "waited-for job", _A),
    Option("checkpoint_every", "save a checkpoint every N steps into the run's folder (model, "
           "optimizer, data position, random states; the ddp, zero1, fsdp, deepspeed, pipeline and "
           "model-parallel strategies; local processes, the image, the simulated cluster (also with "
           "--launcher slurm), invoke sbatch, or invoke k8s with --pvc), the newest two kept; 0: "
           "none", _A, kind=int, key=True, reach="place", tasks=ONE_JOB, crossed=(0, 4)),
    Option("max_restarts", "relaunch a job that fails up to K times, each from its last "
           "checkpoint (without --checkpoint-every: from step 0); --fault fires on the first "
           "launch only; local processes, the image or the simulated cluster (with --launcher "
           "slurm: a new batch job each time); invoke sbatch: the script retries its job step; "
           "Kubernetes: the operator retries the job's pods (backoffLimit K; MPIJob or "
           "PyTorchJob, not TrainJob)", _A, default=0, kind=int, reach="place", tasks=ONE_JOB,
           crossed=(0, 1)),
    Option("debug", "the frameworks' debug output: TORCH_DISTRIBUTED_DEBUG=DETAIL for DDP", _A,
           default=False, kind=bool),
)

# RunConfig's fields that no option sets: the launcher's (expected_np, attempt,
# launched_at, restart) or the model spec's and the strategy's (test_batch_size, lr, momentum,
# devices). Every other field of RunConfig is a row above (tests/test_plan.py checks).
RANK_ONLY = ("test_batch_size", "lr", "momentum", "expected_np", "attempt", "launched_at", "devices",
             "restart")

BY_NAME = {o.name: o for o in OPTIONS}
SETTINGS = tuple(o for o in OPTIONS if o.setting)            # bench's settings, in this order
# The options a comma list sweeps, in the order a sweep crosses them (the first varies
# slowest): the order the runs happen in and the report's rows first appear.
SWEEP_FIELDS = ("strategy", "framework", "backend", "compression", "precision", "nodes")
assert set(SWEEP_FIELDS) == {o.name for o in OPTIONS if o.sweeps}, "a sweeping option without its place"
# A run in a run folder: these of its configuration, its nodes and ranks, its repeat index.
KEY_FIELDS = tuple(o.name for o in OPTIONS if o.key and o.name != "repeat")
# What the combination test crosses: option -> its values (Option.crosses), the table's order.
CROSSED = {o.name: o.crosses for o in OPTIONS if o.crosses}
assert all(o.crosses[0] == o.value for o in OPTIONS if o.crossed), "crossed values start with the default"
SETUP_FIELDS = tuple(o.name for o in OPTIONS if o.setup)


def of_task(task: str) -> tuple[Option, ...]:
    """The options a task takes as flags, in the table's order."""
    return tuple(o for o in OPTIONS if task in o.tasks)


def run_key(values: dict, nodes: int, np: int, repeat: int) -> tuple:
    """What tells one run from another in a run folder (--resume, --repeat auto): the key
    options' values (a record's configuration or bench's settings; a missing or empty one
    is its default, as in records written before the option existed), the nodes, the
    process count and, last, the repeat index."""
    def value(name):
        v = values.get(name)
        return BY_NAME[name].value if v in (None, "") else v
    return (*(value(k) for k in KEY_FIELDS), int(nodes), int(np), int(repeat))
