"""The plan of `invoke acceptance`, pure: which of the kit's own command lines run, in
which image, for how long each is expected to take, and how many GPUs the plan is for.
Nothing here starts a process or asks an engine (lab.host.suites.acceptance does that).

The default plan is sized to fit 45 estimated minutes on 1, 4 and 8 GPUs: process
counts 1, 2, 4, ... N (and N), two repeats, short ResNet-50 runs. `full` is the larger
plan: every count 1..N, three repeats, longer runs. `local`: the same steps as local
processes on this host's own stack (what docker/setup-venv.sh installs) instead of the
lab images, for a host without a Docker engine (or with --local)."""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

from lab.host.images.build import BuildSettings, tags
from lab.host.suites.estimate import (
    ACCEPTANCE_REPORT_S,
    DOCTOR_S,
    GPU,
    HOROVOD_BUILD_S,
    MPI_GPU_FACTOR,
    nccl_tests_s,
    run_s,
)

BUDGET_MIN = 45          # what the default plan must fit on 1, 4 and 8 GPUs

# Run lengths: (--max-steps, --warmup-steps, --batch-size or None) per model.
SIZES = {False: {"mnist": (200, 20, None), "resnet50": (50, 10, 64)},
         True: {"mnist": (600, 50, None), "resnet50": (200, 20, 64)}}
REPEAT = {False: 2, True: 3}
CPU_REPEAT = 3           # the CPU equivalent's 39 runs, as timed in docs/pages/doctor.md
NCCL_MAX = {True: ("4G", 4 * 2**30), False: ("256M", 256 * 2**20)}   # N >= 4: 4G


@dataclass
class Step:
    name: str                   # its log is logs/<name>.log
    what: str                   # one line for the plan and SUMMARY.md
    argv: list[str]
    image: str = ""             # the lab image it runs in ("": where the command chooses)
    estimate_s: float = 0.0     # the cost model's slow end
    fast_s: float = 0.0         # ... and its fast end (measured on an H100)
    timeout_s: float = 3600
    stdout_to: str = ""         # also keep its standard output in this file (doctor's JSON)
    outcome: str = ""           # filled when run: ok, exit N, timed out, could not start
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


@dataclass
class Plan:
    mode: str
    steps: list[Step]
    missing: list[str]          # what the plan does not measure, and why
    local: bool = False         # local processes on this host's stack, not the lab images

    @property
    def estimate_s(self) -> float:
        return sum(s.estimate_s for s in self.steps)

    @property
    def fast_s(self) -> float:
        return sum(s.fast_s or s.estimate_s for s in self.steps)


def process_counts(n: int, full: bool = False) -> list[int]:
    """1..n every count (full), else the powers of two up to n, and n itself."""
    if full:
        return list(range(1, n + 1))
    counts, k = [], 1
    while k <= n:
        counts.append(k)
        k *= 2
    return counts + ([n] if counts[-1] != n else [])


def bench_estimate(model: str, runs: int, steps: int, mpi: bool = False, end: str = "slow") -> float:
    """Seconds for `runs` bench runs of `steps` steps on one GPU machine, at the model's
    slow or fast end (lab.host.suites.estimate)."""
    return runs * run_s(GPU[end], model, 1, steps, step_factor=MPI_GPU_FACTOR if mpi else 1.0)


def _invoke(python: str, *args: str) -> list[str]:
    return [python, "-m", "invoke", *args]


def gpu_plan(gpus: int, out: str, full: bool, images: dict[str, str] | None,
             python: str) -> tuple[list[Step], list[str]]:
    """The GPU steps after doctor: nccl-tests, bench per model and path, the strategies,
    DataParallel over all N GPUs. images: "nccl" and "mpi" -> the tag to run in; None:
    local processes on this host's stack."""
    results, repeat, counts = f"{out}/results", REPEAT[full], process_counts(gpus, full)
    nps = ",".join(map(str, counts))
    size_name, size_bytes = NCCL_MAX[gpus >= 4]

    def where(ops):
        return ["--image", images[ops]] if images else ["--local"]
    steps = [Step("nccl-tests", f"nccl-tests all_reduce_perf -g {nps}, 8 B to {size_name}",
                  [python, "-m", "lab.host.suites.acceptance", "nccl-tests", "--counts", nps,
                   "--max-size", size_name, *(["--image", images["nccl"]] if images else [])],
                  image=images["nccl"] if images else "", estimate_s=nccl_tests_s(counts, size_bytes))]

    def bench(name, what, model, ops, np_list, *flags, runs):
        max_steps, warmup, batch = SIZES[full][model]
        size = ["--max-steps", str(max_steps), "--warmup-steps", str(warmup)]
        size += ["--batch-size", str(batch)] if batch else []
        steps.append(Step(name, what, _invoke(
            python, "bench", "--results-dir", results, "--run-id", name, "--repeat", str(repeat),
            "--model", model, "--device", "cuda", "--np", np_list, "--data", "synthetic",
            "--epochs", "1", *size, *where(ops), *flags),
            image=images[ops] if images else "",
            estimate_s=bench_estimate(model, runs * repeat, max_steps, ops == "mpi"),
            fast_s=bench_estimate(model, runs * repeat, max_steps, ops == "mpi", "fast")))
    for model in ("mnist", "resnet50"):
        for fw, be, what in (("horovod", "nccl", "Horovod, NCCL GPU operations"),
                             ("horovod", "mpi", "Horovod, MPI GPU operations (CUDA-aware MPI)"),
                             ("ddp", "nccl", "DDP over NCCL")):
            bench(f"{model}-{fw}-{be}", f"{model}: {what}, np {nps}", model,
                  "mpi" if be == "mpi" else "nccl", nps, "--framework", fw, "--backend", be,
                  runs=len(counts))
    strategies = ("ddp", "zero1", "fsdp", "deepspeed")
    bench("strategies", f"resnet50: {', '.join(strategies)} on {gpus} GPU(s)", "resnet50", "nccl",
          str(gpus), "--framework", "ddp", "--backend", "nccl", "--strategy", ",".join(strategies),
          runs=len(strategies))
    # bench gives DataParallel's one process --np GPUs (lab.host.run.bench: devices=np), and
    # the container every GPU CUDA_VISIBLE_DEVICES leaves (lab.host.places.image).
    bench("dataparallel", f"resnet50: DataParallel, one process over {gpus} GPU(s)", "resnet50",
          "nccl", str(gpus), "--strategy", "dataparallel", runs=1)
    return steps, ["runs across servers (one machine; --hosts or the cluster give those rows)"]


def cpu_plan(out: str, cpus: int, python: str, local: bool = False) -> tuple[list[Step], list[str]]:
    """Without a GPU: the CPU equivalent, np 1..min(2, cpus), short runs, where bench
    chooses (the CPU image when built, else local processes; `local`: local processes)."""
    results, n = f"{out}/results", max(1, min(2, cpus))
    nps = ",".join(str(i) for i in range(1, n + 1))
    steps = []

    def bench(name, what, *flags, estimate_s):
        steps.append(Step(name, what, _invoke(python, "bench", "--results-dir", results, "--run-id",
                                              name, "--repeat", str(CPU_REPEAT), *flags,
                                              *(["--local"] if local else [])),
                          estimate_s=estimate_s))
    short = ("--data", "synthetic", "--epochs", "1", "--max-steps", "60", "--warmup-steps", "10",
             "--threads", "1")
    for fw, be in (("horovod", "gloo"), ("horovod", "mpi"), ("ddp", "gloo")):
        bench(f"mnist-{fw}-{be}", f"mnist: {fw} over {be} on CPUs, np {nps}", "--model", "mnist",
              "--device", "cpu", "--framework", fw, "--backend", be, "--np", nps, *short,
              estimate_s=n * CPU_REPEAT * GPU["slow"].run_start_s["mnist"])
    tiny = ("--data", "synthetic", "--epochs", "1", "--max-steps", "2", "--warmup-steps", "1",
            "--batch-size", "8", "--threads", "1")
    for fw, be in (("ddp", "gloo"), ("horovod", "mpi")):
        bench(f"resnet50-{fw}-{be}", f"resnet50: {fw} over {be} on CPUs, np {nps}", "--model",
              "resnet50", "--device", "cpu", "--framework", fw, "--backend", be, "--np", nps, *tiny,
              estimate_s=n * CPU_REPEAT * GPU["slow"].run_start_s["mnist"])
    bench("strategies", f"mnist: ddp, zero1, fsdp on CPUs, np {n}", "--model", "mnist", "--device",
          "cpu", "--framework", "ddp", "--backend", "gloo", "--np", str(n), "--strategy",
          "ddp,zero1,fsdp", *short, estimate_s=3 * CPU_REPEAT * GPU["slow"].run_start_s["mnist"])
    return steps, ["anything on a GPU: there is none here, so the CPU equivalent ran",
                   "nccl-tests (needs GPUs)", "NCCL, and Horovod's NCCL and MPI GPU operations",
                   "DataParallel and GPU memory per device"]


def plan(gpus: int, out: str, *, full: bool = False, images: dict[str, str] | None = None,
         cpus: int = 2, mode: str = "", python: str = sys.executable, local: bool = False,
         has=lambda tool: True) -> Plan:
    """Every step in order: doctor, the GPU (or CPU) steps, the report. gpus: how many
    CUDA will show (visible_count); images: the tags to run in (default_images());
    local: local processes on this host's stack instead, where `has(tool)` says whether
    it has Horovod ("horovod") and nccl-tests ("all_reduce_perf"): a step that needs
    what the host lacks is left out, with what installs it."""
    doctor = Step("doctor", "invoke doctor (host, stack where the ranks run, findings)",
                  _invoke(python, "doctor", "--json"), estimate_s=DOCTOR_S, timeout_s=1200,
                  stdout_to="doctor.json")
    if gpus:
        steps, missing = gpu_plan(gpus, out, full, None if local else images or default_images(), python)
    else:
        steps, missing = cpu_plan(out, cpus, python, local)
    if local:
        steps, missing = local_steps(steps, has), local_missing(steps, has) + missing
    report = Step("report", "invoke report over every run above",
                  _invoke(python, "report", f"{out}/results"), estimate_s=ACCEPTANCE_REPORT_S, timeout_s=600)
    every = [doctor, *steps, report]
    for s in every:
        s.timeout_s = max(s.timeout_s, 600 + 4 * s.estimate_s)
    mode = mode or (f"GPU mode, {gpus} GPU(s)" if gpus else "CPU mode")
    if local:
        mode += f"; {LOCAL}"
    return Plan(mode, every, missing, local)


LOCAL = "local processes on this host's own stack (what docker/setup-venv.sh installs), not the lab images"
# What a local step needs of the host beyond the kit's venv, and what installs it.
LOCAL_NEEDS = {"horovod": ("Horovod", f"docker/install-horovod.sh builds it (about "
                                      f"{HOROVOD_BUILD_S / 60:.1f} min on 16 cores)"),
               "all_reduce_perf": ("nccl-tests' all_reduce_perf", "docker/install-nccl-tests.sh builds it")}


def needs(step: Step) -> str | None:
    """What a step needs of the host beyond the kit's venv (a LOCAL_NEEDS key), or None."""
    if step.name == "nccl-tests":
        return "all_reduce_perf"
    a = step.argv
    return "horovod" if "--framework" in a and a[a.index("--framework") + 1] == "horovod" else None


def local_steps(steps: list[Step], has) -> list[Step]:
    return [s for s in steps if needs(s) is None or has(needs(s))]


def local_missing(steps: list[Step], has) -> list[str]:
    out = []
    for tool in dict.fromkeys(needs(s) for s in steps if needs(s) and not has(needs(s))):
        what, fix = LOCAL_NEEDS[tool]
        left = ", ".join(s.name for s in steps if needs(s) == tool)
        out.append(f"{left}: {what} is not installed on this host's stack; {fix}, and a rerun "
                   f"measures them")
    return out


def default_images() -> dict[str, str]:
    """The GPU images of the version matrix's default CUDA: HOROVOD_GPU_OPERATIONS NCCL
    and MPI (lab.host.images.build.tags): dl-lab-kit:gpu-nccl, dl-lab-kit:gpu-mpi."""
    return {ops.lower(): tags(BuildSettings(flavor="gpu", gpu_ops=ops), "")[0]
            for ops in ("NCCL", "MPI")}


def build_command(ops: str, cuda: str = "") -> str:
    """The `invoke build` that makes the GPU image of these GPU operations (NCCL or MPI)."""
    return f"invoke build --flavor gpu --gpu-ops {ops.upper()}" + (f" --cuda {cuda}" if cuda else "")


def render(p: Plan, missing_images: list[str] = ()) -> str:
    """The plan as --dry-run prints it: each step's command, image and estimate; the total."""
    lines = [f"acceptance plan: {p.mode}", ""]
    for i, s in enumerate(p.steps, 1):
        where = s.image or {"report": "this machine", "doctor": "each lab image bench would use "
                            "(doctor's choice)"}.get(s.name, "local processes" if p.local
                                                     else "where bench chooses")
        lines += [f"{i:2}. {s.name}: {s.what}", f"    image: {where}; about {s.estimate_s / 60:.1f} min",
                  "    $ " + " ".join(s.argv)]
    lines += ["", f"estimated total: {p.estimate_s / 60:.1f} min ({len(p.steps)} steps; the cost "
              f"model is lab/host/suites/estimate.py's; {p.fast_s / 60:.1f} min at an H100's "
              f"measured speed)"]
    if missing_images:
        lines += ["", "missing, so it would not start:", *(f"  - {m}" for m in missing_images)]
    lines += ["", "not measured:", *(f"  - {m}" for m in p.missing)]
    return "\n".join(lines)
