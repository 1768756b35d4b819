"""The plan of `invoke lab`, pure: the classic distributed-training lab as the kit's own
`invoke bench` runs, sized to what this machine has, with an estimate for each. Nothing
here starts a process or asks an engine (lab.host.suites.course runs the plan).

The lab's parts, in the order its report presents them: time per step, throughput and
speedup within one server for every back end that can run here; the same across two
servers (the simulated cluster, each node's link shaped to 1 Gbit/s), for the CNN, and
ResNet-50 beside VGG-16 (the model comparison: computation against communication); a recurrent model
(the LSTM); gradient compression (accuracy and speed of fp16 and 8-bit codecs); the
parallel strategies on ResNet-50. Each part is one bench run id under the lab's results
folder, so `--resume` continues exactly where a stopped lab ended."""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from lab.common import display
from lab.host.suites.estimate import CLUSTER_UP_S, CPU, LAB_REPORT_S, run_s

# What the default and the --quick plan must fit here (2 vCPUs). VGG-16's one run across two
# servers costs most of a minute on its own (537 MB of gradients over the 1 Gbit/s link,
# see estimate.CPU); --quick keeps within 5 minutes by 2 epochs a run and Horovod's
# launcher in the image without horovodrun's build checks (lab.host.places.launch.lean_horovodrun).
BUDGET_MIN = {False: 30, True: 5}
DIGITS = 1797                   # scikit-learn's digits: the lab's data (offline)
TRAIN_SHARE = 0.8               # ASSUMED split; only the step count depends on it
COMPRESSION_EPOCHS = 10         # the compression part, every plan (see the part)
# `invoke doctor --local --np 2 --save DIR` (the host's and the stack's probes, the sweeps
# of Gloo and of Horovod over MPI and over oneCCL): 42 s alone and 36 s as the quick lab's
# first part on the development machine (2 vCPU, nothing else running, 2026-11-29)
DOCTOR_SWEEPS_S = 40.0
NOT_DDP = ("mpi", "ccl")   # back ends DDP skips: pip's torch has no MPI; oneCCL: lab.common.ccl.DDP_REFUSAL


@dataclass
class Part:
    """One part of the lab: a bench request (its flags as `invoke bench` takes them)."""
    name: str                   # its run id: lab-<name>
    title: str                  # the report section it fills
    flags: dict
    place: str = "local"        # "local" or "cluster"
    estimate_s: float = 0.0
    skipped: str = ""           # why the part does not run here ("" : it runs)
    devices: str = "CPU processes"  # what its runs measure, as the plan says it
    kind: str = "bench"         # "bench", or "doctor": doctor's collective sweeps saved for the cost model
    why: str = ""               # what the part is for, where its title (its report section) does not say

    @property
    def heading(self) -> str:
        """Its title, and what it is for where the title does not say."""
        return f"{self.title} ({self.why})" if self.why else self.title

    @property
    def gpu(self) -> bool:
        return self.flags.get("device") == "cuda"

    @property
    def run_id(self) -> str:
        return self.flags["run_id"]

    def command(self) -> str:
        """The part as the `invoke bench` (or `invoke doctor`) command a user would type."""
        if self.kind == "doctor":
            return shlex.join(["invoke", "doctor", "--local", "--np", str(self.flags["np"]),
                               "--save", self.flags["results_dir"]])
        words = ["invoke", "bench"]
        for k, v in self.flags.items():
            flag = "--" + k.replace("_", "-")
            if v is True:
                words.append(flag)
            elif v not in (None, False, ""):
                words += [flag, str(v)]
        return shlex.join(words)


@dataclass
class Plan:
    results_dir: str
    quick: bool
    parts: list[Part]
    notes: list[str] = field(default_factory=list)
    sweeps: Part | None = None  # doctor's sweeps for the report's cost model, before the parts

    @property
    def estimate_s(self) -> float:
        ran = [p for p in self.parts if not p.skipped]
        return (sum(p.estimate_s for p in ran) + LAB_REPORT_S + (self.sweeps.estimate_s if self.sweeps else 0.0)
                + (CLUSTER_UP_S if any(p.place == "cluster" for p in ran) else 0.0))

    @property
    def report_dir(self) -> str:
        return f"{self.results_dir.rstrip('/')}/lab-report"

    def render(self) -> str:
        lines = [f"the lab ({'--quick, ' if self.quick else ''}estimated "
                 f"{display.duration(self.estimate_s, rough=True)} on this machine), {len(self.parts)} parts:"]
        if self.sweeps:
            lines.append(f"  first: {self.sweeps.title}: about {display.duration(self.sweeps.estimate_s, rough=True)}")
            lines.append(f"     {self.sweeps.command()}")
        for i, p in enumerate(self.parts, 1):
            if p.skipped:
                lines.append(f"  {i}. {p.heading}: skipped: {p.skipped}")
                continue
            lines.append(f"  {i}. {p.heading}, on {p.devices}: about {display.duration(p.estimate_s, rough=True)}")
            lines.append(f"     {p.command()}")
        lines.append(f"  then: invoke report (Markdown and HTML) into {self.report_dir}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def steps_per_epoch(batch: int, np: int) -> int:
    return max(1, int(DIGITS * TRAIN_SHARE) // (batch * np))


def estimate(model: str, nps: list[int], runs_each: int, steps_at, place: str = "local") -> float:
    """Seconds for `runs_each` runs at each of `nps`, `steps_at(np)` steps each (the one
    cost model, lab.host.suites.estimate, at this machine's kind: CPU)."""
    return sum(runs_each * run_s(CPU, model, np, steps_at(np), place) for np in nps)


def plan(results_dir: str = "results", *, quick: bool = False, gpus: int = 0,
         backends: tuple[str, ...] = ("gloo", "mpi"), cluster: str = "", horovod: str = "") -> Plan:
    """The lab for this machine. `gpus`: GPUs the ranks may use (0: a CPU lab);
    `backends`: the back ends that can run here (nccl only with GPUs); `cluster`: why the
    simulated cluster cannot run ("" : it can); `horovod`: why Horovod cannot run on this
    machine ("": it can; the cluster's image has its own). Combinations bench cannot run
    here (DDP over MPI with pip's torch, which has no MPI back end; Horovod's without
    Horovod) are skipped by bench with the reason and cost nothing; the estimate assumes
    pip's torch. Without Horovod the quick lab's gradient compression, Horovod's alone
    otherwise, runs over DDP (its communication hook has the same codecs).

    No GPU part asks for more ranks than there are GPUs (each rank needs one of its own):
    a part whose process counts do not all fit runs at the counts that fit on the GPUs
    (np 1 on one GPU; ResNet-50's strategies at np 1 with ddp alone) and at all of them
    as CPU processes beside it (a part of its own, `<name>-cpu`, in the same report
    section; the report tells the rows apart by their device). The simulated cluster is
    the CPU image: the cross-server parts are CPU processes on any machine."""
    nps = [1, 2] if gpus < 2 else sorted({1, 2, gpus} | ({4} if gpus >= 4 else set()))
    cpu_backends = tuple(b for b in backends if b != "nccl")
    common = {"results_dir": results_dir, "data": "digits", "batch_size": 32}
    epochs = 2 if quick else 8

    def combos(bes, here: bool = True) -> int:  # Horovod over each, DDP over each but MPI and oneCCL
        return (len(bes) if not (here and horovod) else 0) + len([b for b in bes if b not in NOT_DDP])

    def epochs_of(n):
        return lambda np: n * steps_per_epoch(32, np)

    parts: list[Part] = []

    def local(name, title, flags, cost, why="", cpu=False, **extra):
        """The part on this machine's GPUs where its counts fit (all of them: one part),
        else at the counts that fit and, beside it, all of them on CPU processes (`cpu`:
        on CPU processes alone). cost(flags, counts) -> its estimate; `why`: Part.why;
        `extra`: flags over the common ones."""
        counts = [int(n) for n in str(flags["np"]).split(",")]
        run_id = flags.pop("run_id")
        flags = {**flags, "local": True, **common, **extra}
        if not gpus or cpu:
            flags["run_id"] = run_id
            parts.append(Part(name, title, flags, estimate_s=cost(flags, counts), why=why))
            return
        fit = [n for n in counts if n <= gpus]
        on_gpus = "the GPU" if gpus == 1 else "the GPUs, one per rank"
        if fit or "strategy" in flags:
            g = {**flags, "np": ",".join(map(str, fit or [1])), "device": "cuda", "run_id": run_id}
            if not fit:         # ResNet-50 on the GPU: one process, ddp alone
                g["strategy"] = "ddp"
            parts.append(Part(name, title, g, estimate_s=cost(g, fit or [1]), devices=on_gpus, why=why))
        if fit != counts:
            c = {**flags, "run_id": f"{run_id}-cpu"}
            if "backend" in c:
                c["backend"] = ",".join(b for b in c["backend"].split(",") if b != "nccl")
            parts.append(Part(f"{name}-cpu", title, c, estimate_s=cost(c, counts), why=why,
                              devices=f"CPU processes beside {on_gpus} (more ranks than GPUs)"))

    # Within one server: every back end that runs here, Horovod and DDP, 1 and 2 workers
    # (1..N GPUs): the CNN on the digits (offline; MNIST itself is a download away).
    repeat = 1 if quick else 3
    local("within", "results within one server",
          {"np": ",".join(map(str, nps)), "framework": "horovod,ddp", "backend": ",".join(backends),
           "epochs": epochs, "repeat": repeat, "run_id": "lab-within"},
          lambda f, c: estimate("mnist", c, combos(f["backend"].split(",")) * repeat, epochs_of(epochs)))

    # Across servers: the simulated cluster (the CPU image), each link shaped to 1 Gbit/s
    # between its two nodes; one node (unshaped: no link to shape) runs 1 and 2 ranks, the
    # baseline of the speedups and the same two ranks within one server; np 1 over 2 nodes
    # is refused (uneven) and costs nothing.
    # The quick plan: Horovod over Gloo and over oneCCL where it runs here (the CPU image
    # has it); DDP's runs across servers are the model comparison's (below).
    if quick:
        bes, fws = ["gloo", *(["ccl"] if "ccl" in cpu_backends else [])], "horovod"
        configs = len(bes)
    else:
        bes, fws = list(cpu_backends), "horovod,ddp"
        configs = combos(bes, False)
    repeat = 1 if quick else 2
    per_place = (estimate("mnist", [1, 2], configs * repeat, epochs_of(epochs), "cluster")
                 + estimate("mnist", [2], configs * repeat, epochs_of(epochs), "cluster"))
    cluster_cpus = "CPU processes in the simulated cluster's CPU image"
    parts.append(Part(
        "across", "results across servers",
        {"nodes": "1,2", "np": "1,2", "framework": fws, "backend": ",".join(bes),
         "link": "1gbit", **common, "epochs": epochs, "repeat": repeat, "run_id": "lab-across"},
        place="cluster", skipped=cluster, estimate_s=per_place, devices=cluster_cpus))

    # The model comparison across the same shaped link: ResNet-50 (25.6M parameters, about
    # 94 MB of gradients a step on the digits' 10 classes) beside VGG-16 (134M, 537 MB),
    # the same batch and back end, short runs (a step takes seconds on a CPU); the report
    # sets the share of each one's step spent communicating side by side
    # (lab.report.model_comparison). The full plan at 1 and 2 workers, within one server
    # and across two, in both frameworks; --quick at 2 workers across two servers, DDP only.
    for model, title, m_steps in (("resnet50", "ResNet-50", 8), ("vgg16", "VGG-16", 4)):
        if quick:
            where, m_steps, warmup, fws = {"nodes": "2", "np": "2"}, 2, 1, "ddp"
        else:
            where, warmup, fws = {"nodes": "1,2", "np": "1,2"}, min(2, m_steps // 2), "horovod,ddp"
        runs = len(fws.split(","))
        at_two = estimate(model, [2], runs, lambda np, n=m_steps: n, "cluster")
        parts.append(Part(
            f"across-{model}", f"results across servers ({title})",
            {**where, "framework": fws, "backend": "gloo", "link": "1gbit", "model": model, **common,
             "batch_size": 16, "epochs": 1, "max_steps": m_steps, "warmup_steps": warmup, "repeat": 1,
             "run_id": f"lab-across-{model}"},
            place="cluster", skipped=cluster, devices=cluster_cpus,
            estimate_s=at_two if quick else (
                at_two + estimate(model, [1, 2], runs, lambda np, n=m_steps: n, "cluster"))))

    # The recurrent model: the LSTM reading each image row by row.
    repeat, lstm_epochs = (1, 1) if quick else (2, 4)
    local("lstm", "a recurrent model (LSTM)",
          {"np": "1,2", "framework": "ddp", "backend": backends[0], "model": "lstm",
           "epochs": lstm_epochs, "repeat": repeat, "run_id": "lab-lstm"},
          lambda f, c: estimate("lstm", c, repeat, lambda np: lstm_epochs * steps_per_epoch(64, np)),
          batch_size=64)

    # Gradient compression: long enough for accuracy to tell the codecs apart (a plain
    # 8-bit cast does not learn; fp16 and the scaled 8-bit codec do), in every plan: 2 epochs
    # left every codec near chance (21%); 6 epochs at batch 32 on the digits reached 83.0%
    # (none), 83.0% (fp16), 83.3% (int8) and 9.7% (int8-naive) here (2 ranks, DDP over
    # Gloo), so COMPRESSION_EPOCHS gives them more. Two ranks at least: one has nothing to exchange.
    comp_epochs = COMPRESSION_EPOCHS
    frameworks = ("horovod" if not horovod else "ddp") if quick else "horovod,ddp"
    comp_runs = 4 * len([f for f in frameworks.split(",") if f == "ddp" or not horovod])
    local("compression", "gradient compression",
          {"np": "2", "framework": frameworks, "backend": backends[0],
           "compression": "none,fp16,int8,int8-naive",
           "epochs": comp_epochs, "repeat": 1, "run_id": "lab-compression"},
          lambda f, c: estimate("mnist", c, comp_runs, epochs_of(comp_epochs)))

    # Parallel strategies on ResNet-50, short runs: the table compares throughput and
    # the memory each strategy holds per rank (accuracy needs far longer runs on CPUs).
    strategies = "ddp,zero1" if quick else "ddp,zero1,fsdp,pipeline,model-parallel,deepspeed,rpc-pipeline"
    steps, warmup, repeat = (3, 1, 1) if quick else (8, 2, 2)
    strategy_runs = {"framework": "ddp", "model": "resnet50", "epochs": 1, "max_steps": steps,
                     "warmup_steps": warmup, "repeat": repeat}
    local("strategies", "parallel strategies (ResNet-50)",
          {"np": "2", "strategy": strategies, **strategy_runs, "run_id": "lab-strategies"},
          lambda f, c: estimate("resnet50", c, len(f["strategy"].split(",")) * repeat, lambda np: steps),
          batch_size=16)
    # Plain DDP's 1-worker run of the same configuration: what the report's cost model
    # predicts its 2-worker row from (the other strategies are not predicted, each with its
    # reason: lab.report.prediction). Not in --quick (its minutes). With one GPU the part
    # above runs DDP at 1 worker on it and its 2-worker rows as CPU processes beside it:
    # their 1-worker run is a CPU process too (the device is part of a configuration).
    if not quick:
        local("strategies-one", "parallel strategies (ResNet-50)",
              {"np": "1", "strategy": "ddp", **strategy_runs, "run_id": "lab-strategies-one"},
              lambda f, c: estimate("resnet50", c, repeat, lambda np: steps),
              why="plain DDP at 1 worker, what its 2-worker row is predicted from", cpu=gpus == 1,
              batch_size=16)

    notes = []
    if horovod:
        notes.append(f"{horovod}: its runs on this machine are skipped, each with the reason"
                     + (", and the gradient compression part runs over DDP" if quick else ""))
    if not gpus:
        notes.append("no GPU here: the within-server table is of CPU processes; NCCL needs GPUs")
    elif gpus == 1:
        notes.append("one GPU here: every model, framework and back end runs at np 1 on it, and "
                     "the runs of 2 ranks as CPU processes beside it (each rank needs a GPU of its "
                     "own); each table of the report says which devices its rows measured")
    # Before the parts, doctor's collective sweeps of this machine's back ends (Gloo, Horovod's
    # over MPI) saved into the results folder: what the report's cost model fits the
    # collective on, so every data-parallel row with its 1-worker run is predicted
    # (lab.report.model_inputs).
    sweeps = Part("sweeps", "the collectives' cost (doctor's sweeps, for the cost model)",
                  {"np": 2, "results_dir": results_dir, "run_id": "lab-sweeps"},
                  estimate_s=DOCTOR_SWEEPS_S, kind="doctor")
    return Plan(results_dir, quick, parts, notes, sweeps)
