"""The kit's tasks. Thin: each one turns flags into settings and calls into `lab`.
Defaults come from invoke.yaml; flags win."""

from invoke import task
from invoke.exceptions import Exit

from lab.host.cli import cli_hints
from lab.host.cli.flag_help import BENCH_HELP, K8S_HELP, SBATCH_HELP, SwitchTask, takes
from lab.host.cli.task_defaults import TaskDefaultsError, section, settings_of

cli_hints.install()     # an unknown flag gets the closest one, not only "No idea what ... is!"


def _defaults(c, name: str, allowed) -> dict:
    """invoke.yaml's section `name`, each key one of `allowed`, or Exit in one sentence."""
    try:
        return section(c.config, name, allowed)
    except TaskDefaultsError as e:
        raise Exit(f"error: {e}", code=2)


@task(help=BENCH_HELP, auto_shortflags=False, klass=SwitchTask)   # 38 flags: the automatic short ones ran out (micro-batches got "-")
@takes("bench")     # every flag of lab.common.options' table that bench takes
def bench(c, **flags):
    """Run distributed training (one run, or a sweep over lists), record it and print the table."""
    resume, profile_startup = flags.pop("resume"), flags.pop("profile_startup")
    from lab.host.run.startup import CLOCK
    CLOCK.begin()       # the command's start-up clock (figures.startup_host_s)
    from lab.common.display import Display, width
    from lab.host.errors import BenchError
    from lab.host.request.plan import make_plan
    from lab.host.run.bench import Terminated, terminate_as_interrupt
    from lab.host.run.sweep import run_request
    from lab.report.bench_output import render

    display = Display()
    try:
        plan = make_plan(flags, dict(c.config.get("bench", {})), resume=resume,
                         sections=c.config, echo=display.line)
        CLOCK.mark("plan")
        with terminate_as_interrupt():
            outcome = run_request(plan, echo=display.line)
    except BenchError as e:
        raise Exit(f"error: {e}", code=2)
    except Terminated:
        raise Exit("stopped (SIGTERM): the runs that finished are kept in the results directory",
                   code=143)
    except KeyboardInterrupt:
        raise Exit("interrupted: the runs that finished are kept in the results directory", code=130)
    finally:
        display.close()
    print(render(outcome.records, outcome.run_dir, width()))
    if profile_startup:
        from lab.report.bench_output import startup_table
        print(startup_table(outcome.records))
    if outcome.failed:
        raise Exit(f"{outcome.failed} run(s) failed; the failures are recorded in "
                   f"{outcome.run_dir}", code=1)




@task(help=SBATCH_HELP, auto_shortflags=False, klass=SwitchTask)
@takes("sbatch")
def sbatch(c, nodes=None, timeout_s=None, partition="", gpus_per_node=None, container="", output="",
           **run):
    """Write the batch script of a bench run for a real Slurm cluster (nothing is submitted)."""
    flags = {**run, "nodes": nodes, "timeout_s": timeout_s}
    from lab.host.errors import BenchError
    from lab.host.places.slurm.script import script_for_request
    from lab.host.request.checks import whole
    from lab.host.request.plan import make_plan

    try:
        settings = make_plan(flags, dict(c.config.get("bench", {}))).single("a batch script")
        gpus = whole("gpus_per_node", gpus_per_node) if gpus_per_node is not None else None
        # --time only when asked for (--timeout-s): invoke.yaml's bench default is a
        # per-run limit on this machine, not the cluster's wall time.
        limit = settings.timeout_s if timeout_s is not None else 0
        text, notes = script_for_request(settings, partition=partition, gpus_per_node=gpus,
                                         container=container, time_limit_s=limit)
    except BenchError as e:
        raise Exit(f"error: {e}", code=2)
    import sys
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if output:
        try:
            with open(output, "w") as f:
                f.write(text)
        except OSError as e:
            raise Exit(f"error: --output {output} cannot be written ({e.strerror}): give a "
                       f"file in a folder that exists", code=2)
        print(f"wrote {output}: submit it with `sbatch {output}` on the cluster", file=sys.stderr)
    else:
        print(text, end="")




@task(help=K8S_HELP, auto_shortflags=False, klass=SwitchTask)
@takes("k8s")
def k8s(c, nodes=None, timeout_s=None, api=None, registry=None, image=None, gpus_per_node=None,
        pvc=None, namespace=None, **run):
    """Write a bench run as a Kubeflow MPIJob, TrainJob or PyTorchJob (nothing is submitted)."""
    flags = {**run, "nodes": nodes, "timeout_s": timeout_s}
    from lab.host.errors import BenchError
    from lab.host.places.k8s import manifest as kube
    from lab.host.request.checks import whole
    from lab.host.request.plan import make_plan

    given = {k: v for k, v in dict(api=api, registry=registry, image=image, pvc=pvc,
                                   namespace=namespace).items() if v is not None}
    try:
        settings = make_plan(flags, dict(c.config.get("bench", {}))).single("a Kubernetes job")
        opts = kube.options({**dict(c.config.get("k8s", {})), **given})
        if gpus_per_node is not None:
            opts.gpus_per_node = whole("gpus_per_node", gpus_per_node)
        manifest = kube.manifest_for_request(settings, opts)
        path = kube.write(manifest, settings.results_dir)
    except BenchError as e:
        raise Exit(f"error: {e}", code=2)
    import sys
    for note in manifest.notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"wrote {path} ({manifest.kind} {manifest.name})")
    print(f"kubectl apply -f {path}")


@task(help={"results-dir": "where the benchmark's records go"})
def benchmark(c, results_dir="results"):
    """Measure MNIST and ResNet-50 throughput at np 1 and 2 beside the compute ceiling."""
    from lab.common.display import width
    from lab.host.errors import BenchError
    from lab.host.run.bench import probe_stack, run
    from lab.host.run.sweep import benchmark_plans
    from lab.report.bench_output import render

    try:
        stack = probe_stack()
        plans, notes = benchmark_plans(stack, results_dir)
        for note in notes:
            print(note)
        for s in plans:
            print(f"\n## {s.model}, {s.framework} over {s.backend}, np {s.np}")
            outcome = run(s, echo=lambda line: None, stack=stack)
            print(render(outcome.records, outcome.run_dir, width()))
    except BenchError as e:
        raise Exit(f"error: {e}", code=2)


BUILD_HELP = {
    "flavor": "gpu (CUDA, CUDA-aware Open MPI, NCCL, nccl-tests) or cpu",
    "gpu-ops": "GPU operations Horovod is built with: NCCL (default) or MPI (GPU flavor)",
    "cuda": "the matrix's CUDA entry for the GPU flavor: 13.0 (default) or 12.6 (Volta)",
    "base-image": "base image instead of the matrix's (e.g. one made by docker/make-base-image.sh)",
    "extra-ca": "a CA bundle to trust in the image and use for pip and downloads (a proxy's CA)",
    "wheelhouse": "a folder of wheels pip looks at first (offline clusters)",
    "torch-index": "index URL for torch instead of the matrix's; 'default' is pip's own index",
    "torchvision": "install torchvision too (--no-torchvision where no build pairs with torch)",
    "nccl-tests": "build nccl-tests in the GPU flavor (--no-nccl-tests where GitHub is unreachable)",
    "cuda-archs": "compile the image's CUDA code only for these compute capabilities (e.g. 80,90)",
}


@task(help=BUILD_HELP)
def build(c, flavor=None, gpu_ops=None, cuda=None, base_image=None, extra_ca=None,
          wheelhouse=None, torch_index=None, torchvision=True, nccl_tests=True, cuda_archs=None):
    """Build the lab image (pinned CUDA, Open MPI, NCCL, torch, Horovod) and smoke-test it."""
    from lab.host.images.build import BuildError, BuildSettings
    from lab.host.images.build import build as build_image

    given = dict(flavor=flavor, gpu_ops=gpu_ops, cuda=cuda, base_image=base_image,
                 extra_ca=extra_ca, wheelhouse=wheelhouse, torch_index=torch_index,
                 cuda_archs=cuda_archs)
    import dataclasses
    values = _defaults(c, "build", {f.name for f in dataclasses.fields(BuildSettings)})
    values.update({k: v for k, v in given.items() if v is not None})
    settings = BuildSettings(**values, with_torchvision=torchvision, nccl_tests=nccl_tests)
    try:
        build_image(settings)
    except BuildError as e:
        raise Exit(f"error: {e}", code=1)


DOCTOR_HELP = {
    "np": "ranks of the MPI hello and the all-reduce measurements",
    "json": "print JSON (for scripts and CI) instead of the table",
    "wide": "print every value and fix in full on its row (default: the terminal's width, else "
            "$COLUMNS, else 120 columns; long ones as notes)",
    "local": "check the stack as local processes even when a lab image is built",
    "image": "the lab image to check (default: the one bench would use)",
    "frozen": "in the image (and with --nodes on the cluster's nodes), check its own copy of the kit instead of the checkout's",
    "all": "show every check on its row (default: the checks skipped for want of a GPU in one line)",
    "nodes": "also time the collectives with one rank on each of the cluster's N nodes (invoke up first)",
    "link": "with --nodes: shape the links as bench --link does while they run, RATE[/DELAY]",
    "save": "append the collectives' size sweeps to FOLDER/doctor-collectives.jsonl, where invoke report "
            "and python -m lab.report.model_check find them for the cost model (give the results folder)",
}


@task(help=DOCTOR_HELP)
def doctor(c, np=None, json=False, local=False, image=None, frozen=False, wide=False, all=False,
           nodes=None, link=None, save=None):
    """Diagnose the host and the lab image: what is wrong and how to fix it."""
    from envcheck import report
    from envcheck.stack import DEFAULT_NP
    from lab.common import display
    from lab.host.errors import BenchError
    from lab.host.places.base import RunnerError
    from lab.host.request.checks import whole
    from lab.host.suites import doctor as doc

    where = "local" if local else ("image" if image else "auto")
    try:
        ranks = whole("np", np) if np is not None else DEFAULT_NP
        if ranks < 1:
            raise BenchError("--np must be at least 1")
        across = whole("nodes", nodes) if nodes is not None else 1
        if nodes is not None and across < 2:
            raise BenchError("--nodes times the collectives across the cluster: give 2 or more")
        if link and across < 2:
            raise BenchError("--link shapes the links between the cluster's nodes: add --nodes 2 or more")
        # before the probes: one sentence, at once; the collectives across run on it
        cluster = doc.check_across(across, link or "", frozen) if across > 1 else None
        width = None if wide else display.width()
        checks, seconds, notes = doc.run(ranks, where=where, image=image or "", frozen=frozen,
                                         echo=(lambda line: None) if json else
                                         (lambda line: print(report.line(line, width))),
                                         cluster=cluster, link=link or "")
    except (BenchError, RunnerError) as e:
        raise Exit(f"error: {e}", code=2)
    if save:
        from lab.report import model_inputs
        saved = model_inputs.save_sweeps(model_inputs.sweep_entries(checks, link or ""), save)
        if not json:
            print(f"the collectives' sweeps saved to {saved}" if saved else
                  "no collectives' sweep passed: nothing saved for the cost model")
    if json:
        print(report.as_json(checks, seconds, notes))
    else:
        shown, folded = (checks, []) if all else report.fold_skips(checks)
        print(report.table(shown, width=width))
        for line in folded:
            print(report.line(line, width))
        print(report.summary(checks, seconds, width))
    if any(ch["status"] == "FAIL" for ch in checks):
        raise Exit(code=1)


@task(help={"nodes": "how many nodes (node1..nodeN)", "image": "the lab image the nodes run "
            "(default dl-lab-kit:cpu, with --gpu dl-lab-kit:gpu-nccl)",
            "gpu": "give each node its own GPU (compose.gpu.yaml; untested: no GPU was available to the kit's developers)",
            "scheduler": "none (bench starts ranks over SSH) or slurm (slurmctld on node1, "
                         "slurmd on every node)",
            "results_dir": "the folder the nodes mount at /results (default: LAB_RESULTS, else "
                           "the checkout's results/); give bench the same --results-dir"})
def up(c, nodes=None, image=None, gpu=False, scheduler=None, results_dir=None):
    """Bring up the simulated cluster (compose.yaml) and wait until its nodes answer on SSH."""
    from lab.host.errors import BenchError
    from lab.host.places.compose import cluster
    from lab.host.request.checks import whole
    defaults = _defaults(c, "up", settings_of(up))
    try:
        n = whole("nodes", nodes if nodes is not None else defaults.get("nodes"))
        cluster.up(n, image=image, gpu=gpu, scheduler=scheduler or defaults.get("scheduler", "none"),
                   results_dir=results_dir or defaults.get("results_dir"))
    except (cluster.ClusterError, BenchError) as e:
        raise Exit(f"error: {e}", code=2)
    print(f"next: invoke bench --nodes {n} --np {n} --framework horovod --backend gloo")


@task(help={"force": "remove it even while a run is using it (that run fails)"})
def down(c, force=False):
    """Remove the simulated cluster: every container, network and volume it made."""
    from lab.host.places import hold
    from lab.host.places.compose import cluster
    holder = hold.holder_now(hold.MACHINE)
    if holder and holder.place == hold.CLUSTER_PLACE and not force:
        raise Exit(f"error: {holder.describe()} is running on the cluster: wait for it to end, "
                   f"or `invoke down --force` (that run then fails)", code=2)
    try:
        removed, left = cluster.down()
    except cluster.ClusterError as e:
        raise Exit(f"error: {e}", code=2)
    if any(left.values()):
        raise Exit(f"error: still there after down: {left}", code=1)
    print("cluster removed" + (f" (also removed: {', '.join(removed)})" if removed else ""))


@task(help={"jobs-only": "remove only the containers of bench and doctor jobs, not the compose "
                           "cluster (invoke up) nor its network and volumes"})
def clean(c, jobs_only=False):
    """Remove every container, network and volume the kit labelled (what a killed run left)."""
    from lab.common import docker_api
    keys = (docker_api.MANAGED_BY,) if jobs_only else docker_api.KIT_LABELS
    try:
        removed = docker_api.remove_labelled(docker_api.client(), keys)
    except docker_api.DockerUnavailable as e:
        raise Exit(f"error: {e}: {docker_api.START_HINT}", code=2)
    print(f"removed {len(removed)}: {', '.join(removed)}" if removed else "nothing to remove")


@task(positional=["path"], help={
    "path": "a run's folder (results/<run-id>) or a folder of runs (results)",
    "format": "md (report.md) or html (report.md and report.html, one page with the curves embedded)"})
def report(c, path, format="md"):
    """Write report.md (and report.html) and its curves (PNG) from the records in a results folder."""
    if path in ("-h", "--help"):        # invoke reads it as the folder: its help instead
        import subprocess
        import sys
        subprocess.run([sys.executable, "-m", "invoke", "--help", "report"])
        return
    from lab.report.lab_report import ReportError, write_files
    try:
        written = write_files(path, format)
    except ReportError as e:
        raise Exit(f"error: {e}", code=2)
    print(f"wrote {', '.join(map(str, written))}")


@task(help={"comparison": "all, horovod-512 (Horovod's 512-GPU benchmark) or t4-mnist (a 4 x T4 "
                          "server's MNIST report)",
            "link-gbits": "Horovod's cluster on another network rate, Gbit/s (a what-if; default: the "
                          "published 25)"})
def published(c, comparison=None, link_gbits=None):
    """Predict published scaling results with the cost model: the inputs' sources, every assumption, predicted vs published."""
    from lab.models.published_gradients import DataFileError
    from lab.report.published import PublishedError, render
    defaults = _defaults(c, "published", settings_of(published))
    try:
        rate = float(link_gbits) if link_gbits is not None else None
        print(render(comparison or defaults.get("comparison", "all"), rate))
    except ValueError as e:     # PublishedError, DataFileError and a rate that is not a number
        if not isinstance(e, (PublishedError, DataFileError)):
            e = f"--link-gbits {link_gbits}: give a number of Gbit/s"
        raise Exit(f"error: {e}", code=2)


@task(help={
    "results": "a results folder holding a 1-worker run (and doctor's sweeps: invoke doctor --save FOLDER); "
               "or leave it out and state a device with --throughput, --batch and --gradient-mb",
    "np": "workers to predict",
    "per-server": "workers a server (0: all on one server)",
    "link": "the link between servers, a rate as tc writes it (10gbit, 100mbit)",
    "latency-us": "the link's one-way latency in microseconds, added to every latency step",
    "algorithm": "the all-reduce's algorithm: auto (the back end's own choice), ring, tree, "
                 "recursive-doubling or rabenseifner",
    "cores": "cores of a server (0: as many as the 1-worker run's server had)",
    "framework": "which 1-worker run of the folder: its framework (ddp, horovod)",
    "backend": "which 1-worker run: its back end (gloo, mpi, nccl); with a stated device, its back end",
    "model": "which 1-worker run: its model (mnist, resnet50, lstm, vgg16)",
    "place": "which 1-worker run: where it ran (local, image, cluster)",
    "throughput": "a stated device instead of a folder: its images per second at one worker",
    "batch": "a stated device: its batch per worker",
    "gradient-mb": "a stated device: the model's float32 gradients in MB",
    "sweeps-from": "a folder with doctor's sweeps (doctor-collectives.jsonl) to add to the results folder's"})
def predict(c, results=None, np=None, per_server=None, link=None, latency_us=None, algorithm=None, cores=None,
            framework=None, backend=None, model=None, place=None, throughput=None, batch=None, gradient_mb=None,
            sweeps_from=None):
    """Predict the step, throughput, speedup and scaling efficiency of a configuration not run, from a 1-worker run."""
    flags = {k: v for k, v in locals().items() if k != "c" and v is not None}
    from lab.report.records import ReportError
    from lab.report.what_if import from_flags
    try:
        print("\n".join(from_flags({**_defaults(c, "predict", settings_of(predict)), **flags})))
    except ReportError as e:
        raise Exit(f"error: {e}", code=2)


@task(help={"results-dir": "where the acceptance folder and its archive go",
            "dry-run": "print the plan (each command, its image, the estimated minutes) and the "
                       "images not built yet, and run nothing",
            "full": "the larger plan: every process count 1..N, three repeats, longer runs",
            "local": "the same plan as local processes on this host's own stack (what "
                     "docker/setup-venv.sh installs), not the lab images; without a Docker "
                     "engine it is the plan anyway"})
def acceptance(c, results_dir=None, dry_run=False, full=False, local=False):
    """Collect this machine's evidence in one archive: doctor, nccl-tests, bench and the report."""
    from lab.host.suites.acceptance import AcceptanceError, run
    defaults = _defaults(c, "acceptance", settings_of(acceptance))
    try:
        archive = run(results_dir or defaults.get("results_dir"), full=full or defaults.get("full", False),
                      dry_run=dry_run, local=local or defaults.get("local", False))
    except AcceptanceError as e:
        raise Exit(f"error: {e}", code=2)
    if archive:
        print(f"wrote {archive}")


@task(help={"quick": "the short version (about 4 minutes on 2 cores): one repeat, fewer steps, ResNet-50 and VGG-16 across servers at 2 workers only, two strategies",
            "resume": "continue a lab that stopped: run only what has no record yet",
            "results-dir": "where the lab's run folders (lab-within, lab-across, ...) and lab-report go",
            "device": "auto (GPUs when NVML sees some), cpu or cuda",
            "dry-run": "print the plan (each part's bench command and its estimate) and run nothing"})
def lab(c, quick=False, resume=False, results_dir=None, device=None, dry_run=False):
    """Run the whole lab on this machine (within and across servers, LSTM, compression, strategies), then its report."""
    from lab.host.suites import course
    defaults = _defaults(c, "lab", settings_of(lab))
    try:
        plan = course.make(results_dir or defaults.get("results_dir", "results"),
                           quick or defaults.get("quick", False),
                           course.look(device or defaults.get("device", "auto")))
        print(plan.render())
        if dry_run:
            return
        bench_defaults = {k: v for k, v in dict(c.config.get("bench", {})).items()
                          if k in ("timeout_s", "stall_s")}
        outcome = course.run(plan, resume=resume, defaults=bench_defaults,
                             build=lambda: build(c, flavor="cpu"))
    except course.CourseError as e:
        raise Exit(f"error: {e}", code=2)
    except KeyboardInterrupt:
        raise Exit("interrupted: `invoke lab --resume` continues where it stopped", code=130)
    bad = {k: v for k, v in outcome.items() if k != "report" and v != "ok" and not v.startswith("skipped")}
    if bad:
        raise Exit("the lab finished with parts that did not all run: "
                   + "; ".join(f"{k}: {v}" for k, v in bad.items())
                   + " (their records say why; `invoke lab --resume` runs what is missing)", code=1)
