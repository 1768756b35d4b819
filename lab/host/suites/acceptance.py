"""`invoke acceptance`: the evidence a GPU machine gives in one command, left in one
archive a user can attach to a bug report or a lab report. The plan (what runs, in which
image, for how long) is lab.host.suites.acceptance_plan's; this module counts the GPUs, checks
the images, runs the steps and writes the archive.

The GPU count is NVML's (nvidia-smi's table when NVML cannot be read), capped by
CUDA_VISIBLE_DEVICES, and is taken before anything runs: doctor failing or timing out
never turns a GPU machine into CPU mode. Each step is the kit's own command line, run
as a process whose lines are echoed as they come and kept in logs/<step>.log; a step
that fails is recorded and the next one runs. `python -m lab.host.suites.acceptance
nccl-tests --counts 1,2,4 --max-size 4G --image TAG` is the nccl-tests step."""
from __future__ import annotations

import json
import os
import sys
import tarfile
import threading
import time

from envcheck.nccl_tests import NCCL_TESTS_ROW, parse_nccl_tests
from lab.common import docker_api, kit, proc, results, versions
from lab.host.errors import RunnerError
from lab.host.images import choice
from lab.host.images.build import BuildSettings, tags
from lab.host.places import choose_runner
from lab.host.suites import acceptance_plan, gpus
from lab.host.suites.acceptance_plan import Plan, Step


class AcceptanceError(Exception):
    """Something missing before anything runs: one sentence that says what to do."""


def check_images() -> tuple[dict[str, str], list[str]]:
    """(ops -> the built GPU image bench would take for it, a sentence per image not
    there, or for the engine that cannot be asked). Asked of the Docker engine as bench asks (lab.host.images: the candidate
    tags by GPU operations, the one with code for these GPUs and a CUDA this driver runs)."""
    images, missing = acceptance_plan.default_images(), []
    try:
        cli = docker_api.client()
    except docker_api.DockerUnavailable as e:
        return images, [f"{e}: {docker_api.START_HINT}; the GPU steps run in the lab images"]
    matrix = versions.read()
    entries = {versions.cuda_entry_for(matrix, c) for c in choice.host_gpu_capabilities()}
    cuda = next((c for c in entries if c and c != matrix["CUDA_DEFAULT"]), "")
    for ops in ("nccl", "mpi"):
        candidates = choice.candidate_images("cuda", "horovod", ops, choice.matrix_cudas())
        try:
            img = choice.gpu_image(cli, candidates)
        except RunnerError as e:
            missing.append(str(e))
            continue
        if img is None:
            images[ops] = tags(BuildSettings(flavor="gpu", gpu_ops=ops.upper(), cuda=cuda), "", matrix)[0]
            missing.append(f"{images[ops]} is not built (`{acceptance_plan.build_command(ops, cuda)}`)")
        else:
            images[ops] = next((t for t in candidates if t in img.tags), img.tags[0])
    return images, missing


def no_engine() -> str:
    """Why no Docker engine can be asked here ("": one can)."""
    try:
        docker_api.client()
    except docker_api.DockerUnavailable as e:
        return str(e)
    return ""


def host_has(tool: str) -> bool:
    """Whether this host's stack has Horovod (the ranks' Python is this one) or an
    executable on the PATH (all_reduce_perf)."""
    import importlib.util
    import shutil
    if tool == "horovod":
        return importlib.util.find_spec("horovod") is not None
    return shutil.which(tool) is not None


def make_plan(out: str, full: bool = False, environ=None,
              local: bool = False) -> tuple[Plan, list[str], gpus.GpuCount]:
    """(the plan for this machine, the images it needs and has not got, the GPU count).
    Without a Docker engine (or with `local`) the plan is the same steps as local
    processes on this host's own stack, which needs no image."""
    count = gpus.count_gpus(environ)
    mode, missing = count.mode(), []
    if not local:
        why = no_engine()
        if why:
            local, mode = True, f"{mode}; no Docker engine here ({why})"
    if count.visible and not local:
        images, missing = check_images()
    else:
        images = None
    return (acceptance_plan.plan(count.visible, out, full=full, images=images, local=local,
                                 cpus=os.cpu_count() or 1, mode=mode, has=host_has), missing, count)


def run_step(step: Step, out: str, echo) -> None:
    """Run one step, its lines echoed as they come and written to logs/<name>.log."""
    lock = threading.Lock()
    with open(os.path.join(out, "logs", f"{step.name}.log"), "w") as log:
        log.write("$ " + " ".join(step.argv) + "\n")

        def line(text: str) -> None:
            with lock:
                log.write(text + "\n")
                log.flush()
            echo(f"  {step.name}| {text}")
        echo(f"acceptance: {step.what} ...")
        t0 = time.monotonic()
        try:
            # Unbuffered: a Python child writing to a pipe would hold its lines until exit.
            res = proc.run(step.argv, timeout=step.timeout_s, merge=False, echo=line,
                           cwd=str(kit.REPO_ROOT), env={**os.environ, "PYTHONUNBUFFERED": "1"})
        except proc.NotFound as e:
            step.outcome = f"could not start: {e}"
            return
        step.seconds = time.monotonic() - t0
    if step.stdout_to:
        with open(os.path.join(out, step.stdout_to), "w") as f:
            f.write(res.stdout)
    step.outcome = ("timed out" if res.timed_out else "ok" if res.returncode == 0
                    else f"exit {res.returncode}")
    echo(f"acceptance: {step.name}: {step.outcome} in {step.seconds:.0f} s")


def nccl_figures(text: str) -> list[dict]:
    """Each all_reduce_perf run of the nccl-tests step's output (after its `$ ...` line):
    its -g count, rows (size, count, type, redop, root, time, algbw, busbw, #wrong, out-of-
    place and in-place; nccl-tests doc/PERFORMANCE.md), # Avg bus bandwidth, and the
    busbw at the largest size and the #wrong total that SUMMARY.md gives."""
    runs = []
    for part in text.split("$ all_reduce_perf")[1:]:
        argv = part.splitlines()[0].split()
        try:
            parsed = parse_nccl_tests(part)
        except ValueError:
            continue
        roots = [int(m.group(5)) for m in map(NCCL_TESTS_ROW.match, part.splitlines()) if m]
        for row, root in zip(parsed["rows"], roots):
            row["root"] = root
        big = max(parsed["rows"], key=lambda r: r["size_bytes"])
        runs.append({"gpus": int(argv[argv.index("-g") + 1]) if "-g" in argv else None,
                     "argv": ["all_reduce_perf", *argv], **parsed,
                     "largest": {"size_bytes": big["size_bytes"], "busbw_gbs": big["busbw_gbs"],
                                 "inplace_busbw_gbs": big["inplace_busbw_gbs"]},
                     "wrong_total": sum((r["wrong"] or 0) + (r["inplace_wrong"] or 0)
                                        for r in parsed["rows"])})
    return runs


def nccl_lines(runs: list[dict]) -> list[str]:
    return [f"all_reduce_perf -g {r['gpus']}: busbw {r['largest']['busbw_gbs']:g} GB/s out-of-place, "
            f"{r['largest']['inplace_busbw_gbs']:g} in-place at {r['largest']['size_bytes']} B; "
            f"#wrong {r['wrong_total']} in all; # Avg bus bandwidth {r['avg_busbw_gbs']}"
            for r in runs]


def summary(mode: str, machine: str, steps: list[Step], missing: list[str], seconds: float,
            estimate_s: float = 0.0) -> str:
    """SUMMARY.md: what was measured and what was not, first; then each step."""
    lines = [f"# dl-lab-kit acceptance: {mode}", "", f"Machine: {machine}", "",
             "## Measured", ""]
    for s in steps:
        if s.outcome == "ok":
            where = f", in {s.image}" if s.image else ""
            lines += [f"- {s.what}: ok ({s.seconds:.0f} s{where}; logs/{s.name}.log)"]
            lines += [f"  - {n}" for n in s.notes]
    lines += ["", "## Not measured", ""]
    lines += [f"- {s.what}: {s.outcome}" + (f" (logs/{s.name}.log)" if s.seconds else "")
              for s in steps if s.outcome != "ok"]
    lines += [f"- {m}" for m in missing]
    took = f"{len(steps)} steps in {seconds / 60:.1f} min"
    lines += ["", took + (f" (estimated {estimate_s / 60:.1f} min)" if estimate_s else "") +
              ". The records are in results/, the lab report in results/report.md, doctor's "
              "checks in doctor.json.", ""]
    return "\n".join(lines)


def run(out_root: str = "results", full: bool = False, dry_run: bool = False, echo=print,
        environ=None, local: bool = False) -> str | None:
    """Print the plan; unless dry_run, run it into out_root/acceptance-<time>/ and return
    the archive's path. AcceptanceError before anything runs when an image is missing, or
    when out_root is not a folder that can be made."""
    out_root = out_root or "results"
    try:
        results.check_folder(out_root, make=False)
    except results.FolderError as e:
        raise AcceptanceError(str(e)) from None
    out = os.path.abspath(os.path.join(out_root, f"acceptance-{time.strftime('%Y%m%d-%H%M%S')}"))
    plan, missing_images, count = make_plan(out, full, environ, local)
    echo(acceptance_plan.render(plan, missing_images))
    if dry_run:
        return None
    if missing_images:
        raise AcceptanceError("acceptance needs what this machine has not got, and ran nothing: "
                              + "; ".join(missing_images))
    try:
        os.makedirs(os.path.join(out, "logs"))
    except OSError as e:
        raise AcceptanceError(f"--results-dir {out_root}: cannot make {out} ({e.strerror})") from None
    t0 = time.monotonic()
    for step in plan.steps:
        run_step(step, out, echo)
        if step.name == "doctor" and step.outcome == "exit 1":
            step.outcome = "ok"             # it ran; its FAILs are in doctor.json
            step.what += " (some checks FAIL: see doctor.json)"
        if step.name == "nccl-tests" and step.seconds:
            with open(os.path.join(out, "logs", "nccl-tests.log")) as f:
                runs = nccl_figures(f.read())
            with open(os.path.join(out, "nccl-tests.json"), "w") as f:
                json.dump(runs, f, indent=1)
            step.notes += nccl_lines(runs) or ["no all_reduce_perf table in its output"]
    import platform
    machine = f"{platform.node()}, {os.cpu_count()} CPU(s), {platform.platform()}"
    text = summary(plan.mode, machine, plan.steps, plan.missing, time.monotonic() - t0,
                   plan.estimate_s)
    with open(os.path.join(out, "SUMMARY.md"), "w") as f:
        f.write(text)
    archive = out + ".tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(out, arcname=os.path.basename(out))
    echo(text)
    return archive


def nccl_tests(counts: list[int], max_size: str, image: str, echo=print) -> int:
    """all_reduce_perf -b 8 -e MAX -f 2 -g G for each count, in the GPU image (nccl-tests
    README: -g GPUs per process, -b/-e/-f the sizes), or on this host ("" image); its rows
    as printed."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="lab-acceptance-") as scratch:
        try:
            runner, note = choose_runner(device="cuda", framework="ddp", backend="nccl", image=image,
                                         where="image" if image else "local",
                                         results_dir=scratch, data_dir=None, echo=echo)
        except RunnerError as e:
            echo(f"nccl-tests: {e}")
            return 2
        if note:
            echo(note)
        worst = 0
        for g in counts:
            argv = ["all_reduce_perf", "-b", "8", "-e", max_size, "-f", "2", "-g", str(g)]
            echo("$ " + " ".join(argv))
            try:
                rc, text = runner.output(argv, timeout_s=900)   # within the step's own limit
            except (RunnerError, proc.NotFound) as e:
                echo(f"nccl-tests: {e}")
                return 2
            echo(text)
            worst = worst or (1 if rc != 0 else 0)
        return worst


def main(argv: list[str]) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m lab.host.suites.acceptance")
    sub = p.add_subparsers(dest="what", required=True)
    n = sub.add_parser("nccl-tests", help="all_reduce_perf at each -g count, in the GPU image")
    n.add_argument("--counts", required=True, help="the -g counts, a comma list: 1,2,4")
    n.add_argument("--max-size", default="256M", help="all_reduce_perf's -e: 256M or 4G")
    n.add_argument("--image", default="", help="the lab image to run it in (none: on this host)")
    a = p.parse_args(argv)
    return nccl_tests([int(c) for c in a.counts.split(",")], a.max_size, a.image)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
