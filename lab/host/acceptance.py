"""`invoke acceptance`: the evidence a GPU machine gives in one command, left in one
archive a user can attach to a bug report or a lab report. In order: doctor (JSON),
nccl-tests' all_reduce_perf over 1..N GPUs, bench for MNIST and ResNet-50 over Horovod
(NCCL and MPI GPU operations) and DDP at np 1..N with --repeat 3, the data-parallel
strategies, then `invoke report`. Each step is the kit's own command line, run as a
process with its output in logs/ (so what is archived is what a user would have
typed); a step that fails is recorded and the next one runs. On a machine without a
GPU the CPU equivalent runs, and SUMMARY.md says so before anything else.

The plan is pure (`plan`), the running is `run`; `python -m lab.host.acceptance
nccl-tests N` is the nccl-tests step (all_reduce_perf where the ranks run: the GPU
image, or this machine when it has the binary)."""
from __future__ import annotations

import json
import os
import sys
import tarfile
import time
from dataclasses import dataclass, field

from lab.common import kit, proc

REPEAT = 3


@dataclass
class Step:
    name: str                   # its log is logs/<name>.log
    what: str                   # one line for SUMMARY.md
    argv: list[str]
    timeout_s: float = 3600
    stdout_to: str = ""         # also keep its standard output in this file (doctor's JSON)
    outcome: str = ""           # filled by run(): ok, failed (exit N), timed out, skipped
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def _invoke(*args: str, python: str = sys.executable) -> list[str]:
    return [python, "-m", "invoke", *args]


def plan(gpus: int, out: str, cpus: int = 2, python: str = sys.executable) -> tuple[list[Step], list[str]]:
    """(the steps after doctor, what is not measured). gpus: how many the host has (0:
    the CPU equivalent, np 1..min(2, cpus))."""
    results = os.path.join(out, "results")
    steps, missing = [], []

    def bench(name, what, *flags, timeout_s=3600):
        steps.append(Step(name, what, _invoke("bench", "--results-dir", results, "--run-id", name,
                                              "--repeat", str(REPEAT), *flags, python=python),
                          timeout_s=timeout_s))
    if gpus:
        nps = ",".join(str(n) for n in range(1, gpus + 1))
        # The README benchmark's MNIST sizes; ResNet-50 at a GPU's batch.
        sizes = {"mnist": ("--epochs", "1", "--max-steps", "300", "--warmup-steps", "20"),
                 "resnet50": ("--epochs", "1", "--batch-size", "64", "--max-steps", "100",
                              "--warmup-steps", "10")}
        steps.append(Step("nccl-tests", f"nccl-tests all_reduce_perf over 1..{gpus} GPU(s)",
                          [python, "-m", "lab.host.acceptance", "nccl-tests", str(gpus)]))
        for model in ("mnist", "resnet50"):
            for fw, be, what in (("horovod", "nccl", "Horovod, NCCL GPU operations"),
                                 ("horovod", "mpi", "Horovod, MPI GPU operations (CUDA-aware MPI)"),
                                 ("ddp", "nccl", "DDP over NCCL")):
                bench(f"{model}-{fw}-{be}", f"{model}: {what}, np {nps}", "--model", model,
                      "--device", "cuda", "--framework", fw, "--backend", be, "--np", nps,
                      "--data", "synthetic", *sizes[model])
        bench("strategies", f"resnet50: ddp, zero1, fsdp, deepspeed on {gpus} GPU(s)",
              "--model", "resnet50", "--device", "cuda", "--framework", "ddp", "--backend", "nccl",
              "--np", str(gpus), "--strategy", "ddp,zero1,fsdp,deepspeed", "--data", "synthetic",
              *sizes["resnet50"])
        bench("dataparallel", f"resnet50: DataParallel, one process over {gpus} GPU(s)",
              "--model", "resnet50", "--device", "cuda", "--np", "1", "--strategy", "dataparallel",
              "--data", "synthetic", *sizes["resnet50"])
        missing.append("runs across servers (one machine; --hosts or the cluster give those rows)")
    else:
        n = max(1, min(2, cpus))
        nps = ",".join(str(i) for i in range(1, n + 1))
        missing += ["anything on a GPU: there is none here, so the CPU equivalent ran",
                    "nccl-tests (needs GPUs)", "NCCL, and Horovod's NCCL and MPI GPU operations",
                    "DataParallel and GPU memory per device"]
        # Small enough that the whole CPU plan fits in minutes on 2 cores.
        short = ("--data", "synthetic", "--epochs", "1", "--max-steps", "60", "--warmup-steps", "10",
                 "--threads", "1")
        for fw, be in (("horovod", "gloo"), ("horovod", "mpi"), ("ddp", "gloo")):
            bench(f"mnist-{fw}-{be}", f"mnist: {fw} over {be} on CPUs, np {nps}", "--model", "mnist",
                  "--device", "cpu", "--framework", fw, "--backend", be, "--np", nps, *short)
        tiny = ("--data", "synthetic", "--epochs", "1", "--max-steps", "2", "--warmup-steps", "1",
                "--batch-size", "8", "--threads", "1")
        for fw, be in (("ddp", "gloo"), ("horovod", "mpi")):
            bench(f"resnet50-{fw}-{be}", f"resnet50: {fw} over {be} on CPUs, np {nps}",
                  "--model", "resnet50", "--device", "cpu", "--framework", fw, "--backend", be,
                  "--np", nps, *tiny)
        bench("strategies", f"mnist: ddp, zero1, fsdp on CPUs, np {n}", "--model", "mnist",
              "--device", "cpu", "--framework", "ddp", "--backend", "gloo", "--np", str(n),
              "--strategy", "ddp,zero1,fsdp", *short)
    steps.append(Step("report", "invoke report over every run above",
                      _invoke("report", results, python=python), timeout_s=600))
    return steps, missing


def gpu_count(doctor_json: str) -> tuple[int, str]:
    """(GPUs on the host, driver) from doctor's JSON; (0, "") when it has none or the
    JSON is missing."""
    lines = [ln for ln in doctor_json.splitlines() if ln.startswith("{") and '"checks"' in ln]
    try:
        doc = json.loads(lines[-1])           # the JSON line, whatever else was printed
    except (IndexError, ValueError):
        return 0, ""
    for c in doc.get("checks", []):
        if c.get("where") == "host" and c.get("name") == "gpus" and c.get("status") == "PASS":
            v = c.get("value") or {}
            return int(v.get("count") or 0), str(v.get("driver") or "")
    return 0, ""


def _run_step(step: Step, out: str, echo) -> None:
    log = os.path.join(out, "logs", f"{step.name}.log")
    echo(f"acceptance: {step.what} ...")
    t0 = time.monotonic()
    try:
        res = proc.run(step.argv, timeout=step.timeout_s, merge=False, cwd=str(kit.REPO_ROOT))
    except proc.NotFound as e:
        step.outcome, step.seconds = f"could not start: {e}", 0.0
        return
    step.seconds = time.monotonic() - t0
    with open(log, "w") as f:
        f.write("$ " + " ".join(step.argv) + "\n" + res.stdout + ("\n" + res.stderr if res.stderr else ""))
    if step.stdout_to:
        with open(os.path.join(out, step.stdout_to), "w") as f:
            f.write(res.stdout)
    step.outcome = ("timed out" if res.timed_out else "ok" if res.returncode == 0
                    else f"exit {res.returncode}")
    echo(f"acceptance: {step.name}: {step.outcome} in {step.seconds:.0f} s")


def summary(mode: str, machine: str, steps: list[Step], missing: list[str], seconds: float) -> str:
    """SUMMARY.md: what was measured and what was not, first; then each step."""
    lines = [f"# dl-lab-kit acceptance: {mode}", "", f"Machine: {machine}", "",
             "## Measured", ""]
    lines += [f"- {s.what}: {s.outcome} ({s.seconds:.0f} s; logs/{s.name}.log)"
              for s in steps if s.outcome == "ok"]
    lines += ["", "## Not measured", ""]
    lines += [f"- {s.what}: {s.outcome}" + (f" (logs/{s.name}.log)" if s.seconds else "")
              for s in steps if s.outcome != "ok"]
    lines += [f"- {m}" for m in missing]
    lines += ["", f"{len(steps)} steps in {seconds / 60:.1f} min. The records are in results/, "
              f"the lab report in results/report.md, doctor's checks in doctor.json.", ""]
    return "\n".join(lines)


def run(out_root: str = "results", echo=print) -> str:
    """Run the whole plan into out_root/acceptance-<time>/ and return the archive's path."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = os.path.abspath(os.path.join(out_root, f"acceptance-{stamp}"))
    os.makedirs(os.path.join(out, "logs"))
    t0 = time.monotonic()
    doctor = Step("doctor", "invoke doctor (host, stack where the ranks run, findings)",
                  _invoke("doctor", "--json"), timeout_s=1200, stdout_to="doctor.json")
    _run_step(doctor, out, echo)
    if doctor.outcome == "exit 1":
        doctor.outcome = "ok"           # it ran; its FAILs are in doctor.json
        doctor.what += " (some checks FAIL: see doctor.json)"
    try:
        with open(os.path.join(out, "doctor.json")) as f:
            gpus, driver = gpu_count(f.read())
    except OSError:
        gpus, driver = 0, ""
    steps, missing = plan(gpus, out, cpus=os.cpu_count() or 1)
    mode = (f"GPU mode, {gpus} GPU(s), driver {driver}" if gpus else
            "CPU mode (no GPU on this machine: the CPU equivalent ran)")
    echo(f"acceptance: {mode}; {len(steps) + 1} steps into {out}")
    for step in steps:
        _run_step(step, out, echo)
    import platform
    machine = f"{platform.node()}, {os.cpu_count()} CPU(s), {platform.platform()}"
    text = summary(mode, machine, [doctor, *steps], missing, time.monotonic() - t0)
    with open(os.path.join(out, "SUMMARY.md"), "w") as f:
        f.write(text)
    archive = out + ".tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(out, arcname=os.path.basename(out))
    echo(text)
    return archive


def nccl_tests(gpus: int, echo=print) -> int:
    """all_reduce_perf -g 1..N where bench's GPU ranks would run (nccl-tests
    README: -g GPUs per process, -b/-e/-f the sizes); its rows as printed."""
    import tempfile

    from lab.host.runners import RunnerError
    from lab.host.where import choose_runner
    with tempfile.TemporaryDirectory(prefix="lab-acceptance-") as scratch:
        try:
            runner, note = choose_runner(device="cuda", framework="ddp", backend="nccl",
                                         results_dir=scratch, data_dir=None, echo=echo)
        except RunnerError as e:
            echo(f"nccl-tests: {e}")
            return 2
        if note:
            echo(note)
        worst = 0
        for g in range(1, gpus + 1):
            argv = ["all_reduce_perf", "-b", "8", "-e", "256M", "-f", "2", "-g", str(g)]
            echo("$ " + " ".join(argv))
            try:
                rc, text = runner.output(argv, timeout_s=600)
            except (RunnerError, proc.NotFound) as e:
                echo(f"nccl-tests: {e}")
                return 2
            echo(text)
            worst = worst or (1 if rc != 0 else 0)
        return worst


if __name__ == "__main__":
    if sys.argv[1:2] == ["nccl-tests"] and len(sys.argv) == 3 and sys.argv[2].isdigit():
        sys.exit(nccl_tests(int(sys.argv[2])))
    sys.exit("usage: python -m lab.host.acceptance nccl-tests N")
