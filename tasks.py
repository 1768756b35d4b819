"""The kit's tasks. Thin: each one turns flags into settings and calls into `lab`.
Defaults come from invoke.yaml; flags win."""
import os

from invoke import task
from invoke.exceptions import Exit

BENCH_HELP = {
    "np": "process counts, one or a comma list: 2 or 1,2,4 (a sweep)",
    "framework": "auto (Horovod if installed, else DDP), horovod, ddp or none; a comma list sweeps",
    "backend": "gloo, mpi or nccl; a comma list sweeps (what cannot run here is skipped and recorded)",
    "model": "mnist (Horovod's MNIST CNN) or resnet50",
    "data": "synthetic, mnist (downloaded once into --data-dir) or digits (offline)",
    "data-dir": "where MNIST is cached",
    "device": "cpu or cuda (one GPU per rank)",
    "epochs": "epochs per run",
    "batch-size": "images per rank per step",
    "compression": "gradient compression: none, fp16, int8 (scaled, error feedback) or int8-naive (a plain cast, the baseline that fails)",
    "warmup-steps": "steps left out of the timing",
    "max-steps": "cap on steps per epoch (0: the whole shard)",
    "threads": "CPU threads per rank",
    "results-dir": "where results/<run-id>/results.jsonl goes",
    "run-id": "append to this run instead of starting a new one",
    "timeout-s": "seconds a run may take before it is stopped and recorded as failed",
    "ceiling": "also measure the compute ceiling (model steps, no framework) and compare",
    "local": "run the ranks as local processes even when a lab image is built",
    "image": "the lab image to run in (default: the built one that fits --device)",
    "frozen": "in the image, run its own copy of the kit instead of the checkout's",
    "fault": "RANK:STEP: that rank fails at that step (to see how a failed job is handled)",
    "nodes": "run on this many nodes of the simulated cluster (invoke up), --np spread evenly; "
             "1,2 sweeps",
    "resume": "with --run-id: run only the sweep's combinations that have no ok record yet",
    "link": "with --nodes: limit each node's link, RATE[/DELAY] such as 1gbit or 100mbit/1ms",
}


def _setting(c, name, value):
    return value if value is not None else c.config.get("bench", {}).get(name)


@task(help=BENCH_HELP)
def bench(c, np=None, framework=None, backend=None, model=None, data=None, data_dir=None,
          device=None, epochs=None, batch_size=None, compression=None, warmup_steps=None,
          max_steps=None, threads=None, results_dir=None, run_id=None, timeout_s=None,
          ceiling=False, local=False, image=None, frozen=False, fault=None, nodes=None,
          link=None, resume=False):
    """Run data-parallel training (one run, or a sweep over lists), record it and print the table."""
    from lab import results as res
    from lab.bench import (BenchError, BenchSettings, Outcome, parse_list, parse_np, render, run,
                           run_sweep)
    from lab.config import BACKENDS, COMPRESSIONS, FRAMEWORKS

    try:
        given = dict(np=np, framework=framework, backend=backend, model=model, data=data,
                     data_dir=data_dir, device=device, epochs=epochs, batch_size=batch_size,
                     compression=compression, warmup_steps=warmup_steps, max_steps=max_steps,
                     threads=threads, results_dir=results_dir, timeout_s=timeout_s)
        values = {k: _setting(c, k, v) for k, v in given.items()}
        values = {k: v for k, v in values.items() if v is not None}
        values["np"] = parse_np(values.get("np", "1"))
        for k in ("epochs", "batch_size", "warmup_steps", "max_steps", "threads"):
            if k in values:
                values[k] = _int(k, values[k])
        if "timeout_s" in values:
            values["timeout_s"] = float(values["timeout_s"])
        lists = {
            "framework": parse_list("framework", values.pop("framework", "auto"), ("auto", *FRAMEWORKS)),
            "backend": parse_list("backend", values.pop("backend", "gloo"), BACKENDS),
            "compression": parse_list("compression", values.pop("compression", "none"), COMPRESSIONS),
            "nodes": parse_list("nodes", nodes or 1),
        }
        where = "local" if local else ("image" if image else _setting(c, "where", None) or "auto")
        settings = BenchSettings(**values, run_id=run_id or "", ceiling=ceiling, where=where,
                                 image=image or "", frozen=frozen, fault=fault or "",
                                 link=link or "", **{k: v[0] for k, v in lists.items()})
        if all(len(v) == 1 for v in lists.values()) and not resume:
            outcome = run(settings)
        else:
            if not settings.run_id and not resume:   # known here, so the table can be read back
                settings.run_id = res.new_run_id()
            outcomes = run_sweep(settings, lists, resume=resume)
            rdir = res.run_dir(settings.results_dir, settings.run_id)
            if not os.path.exists(os.path.join(rdir, res.RESULTS_FILE)):
                raise BenchError("the sweep recorded nothing; see the reasons above")
            recs = res.read_records(os.path.join(rdir, res.RESULTS_FILE))[0]
            outcome = Outcome(str(rdir), recs, sum(o.failed for o in outcomes), [],
                              {k: v for o in outcomes for k, v in o.ceilings.items()})
    except BenchError as e:
        raise Exit(f"error: {e}", code=2)
    except KeyboardInterrupt:
        raise Exit("interrupted: the runs that finished are kept in the results directory", code=130)
    print(render(outcome))
    if outcome.failed:
        raise Exit(f"{outcome.failed} run(s) failed; the failures are recorded in "
                   f"{outcome.run_dir}", code=1)


def _int(name, value):
    from lab.bench import BenchError
    try:
        return int(value)
    except (TypeError, ValueError):
        raise BenchError(f"--{name.replace('_', '-')} takes a whole number, not {value!r}") from None


@task(help={"results-dir": "where the benchmark's records go"})
def benchmark(c, results_dir="results"):
    """Measure MNIST and ResNet-50 throughput at np 1 and 2 beside the compute ceiling."""
    from lab.bench import BenchError, benchmark_plans, probe_stack, render, run

    try:
        stack = probe_stack()
        plans, notes = benchmark_plans(stack, results_dir)
        for note in notes:
            print(note)
        for s in plans:
            print(f"\n## {s.model}, {s.framework} over {s.backend}, np {s.np}")
            print(render(run(s, echo=lambda line: None, stack=stack)))
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
}


@task(help=BUILD_HELP)
def build(c, flavor=None, gpu_ops=None, cuda=None, base_image=None, extra_ca=None,
          wheelhouse=None, torch_index=None, torchvision=True, nccl_tests=True):
    """Build the lab image (pinned CUDA, Open MPI, NCCL, torch, Horovod) and smoke-test it."""
    from lab.images import BuildError, BuildSettings
    from lab.images import build as build_image

    cfg = c.config.get("build", {})
    settings = BuildSettings(
        flavor=flavor or cfg.get("flavor", "gpu"), gpu_ops=gpu_ops or cfg.get("gpu_ops", ""),
        cuda=cuda or cfg.get("cuda", ""), base_image=base_image or cfg.get("base_image", ""),
        extra_ca=extra_ca or "", wheelhouse=wheelhouse or "",
        torch_index=torch_index or cfg.get("torch_index", ""), with_torchvision=torchvision,
        nccl_tests=nccl_tests)
    try:
        build_image(settings)
    except BuildError as e:
        raise Exit(f"error: {e}", code=1)


DOCTOR_HELP = {
    "np": "ranks of the MPI hello and the all-reduce measurements",
    "json": "print JSON (for scripts and CI) instead of the table",
    "local": "check the stack as local processes even when a lab image is built",
    "image": "the lab image to check (default: the one bench would use)",
    "frozen": "in the image, check its own copy of the kit instead of the checkout's",
}


@task(help=DOCTOR_HELP)
def doctor(c, np=2, json=False, local=False, image=None, frozen=False):
    """Diagnose the host and the lab image: what is wrong and how to fix it."""
    from envcheck import doctor as doc
    from envcheck import report
    from lab.container import ContainerError

    if int(np) < 1:
        raise Exit("error: --np must be at least 1", code=2)
    where = "local" if local else ("image" if image else "auto")
    try:
        checks, seconds, notes = doc.run(int(np), where=where, image=image or "", frozen=frozen,
                                         echo=(lambda line: None) if json else print)
    except ContainerError as e:
        raise Exit(f"error: {e}; run with --local to check local processes", code=2)
    if json:
        print(report.as_json(checks, seconds, notes))
    else:
        print(report.table(checks))
        print(report.summary(checks, seconds))
    if any(ch["status"] == "FAIL" for ch in checks):
        raise Exit(code=1)


@task(help={"nodes": "how many nodes (node1..nodeN)", "image": "the lab image the nodes run "
            "(default dl-lab-kit:cpu, with --gpu dl-lab-kit:gpu-nccl)",
            "gpu": "give each node its own GPU (compose.gpu.yaml; untested here)"})
def up(c, nodes=2, image=None, gpu=False):
    """Bring up the simulated cluster (compose.yaml) and wait until its nodes answer on SSH."""
    from lab import cluster
    try:
        cluster.up(int(nodes), image=image, gpu=gpu)
    except cluster.ClusterError as e:
        raise Exit(f"error: {e}", code=2)
    print(f"next: invoke bench --nodes {nodes} --np {nodes} --framework horovod --backend gloo")


@task
def down(c):
    """Remove the simulated cluster: every container, network and volume it made."""
    from lab import cluster
    try:
        removed = cluster.down()
    except cluster.ClusterError as e:
        raise Exit(f"error: {e}", code=2)
    left = cluster.leftovers(cluster._client())
    if any(left.values()):
        raise Exit(f"error: still there after down: {left}", code=1)
    print("cluster removed" + (f" (also removed: {', '.join(removed)})" if removed else ""))


@task(positional=["path"], help={"path": "a run's folder (results/<run-id>) or a folder of runs (results)"})
def report(c, path):
    """Write report.md and its curves (PNG) from the records in a results folder."""
    from lab.report import ReportError, write
    try:
        out = write(path)
    except ReportError as e:
        raise Exit(f"error: {e}", code=2)
    print(f"wrote {out} and its curves beside it")
