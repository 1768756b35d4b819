"""`invoke bench`: check the request, launch each run with its framework's launcher,
stream its output, end it promptly when a rank dies, record failures, and print the
report's table. This module is the edge where processes are started; the commands
come from lab.launch and the figures from the records the workers write."""
from __future__ import annotations

import collections
import dataclasses
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from lab import launch, results, summary
from lab.config import ConfigError, RunConfig


class BenchError(Exception):
    """Bad input or a missing piece: one sentence that says what to do."""


_RUN = RunConfig()  # the run's defaults live in RunConfig alone


@dataclass
class BenchSettings:
    np: list[int] = field(default_factory=lambda: [1])
    framework: str = "auto"          # auto: horovod when it imports, else ddp
    backend: str = _RUN.backend
    model: str = _RUN.model
    data: str = _RUN.data
    data_dir: str = _RUN.data_dir
    device: str = _RUN.device
    epochs: int = _RUN.epochs
    batch_size: int = _RUN.batch_size
    compression: str = _RUN.compression
    warmup_steps: int = _RUN.warmup_steps
    max_steps: int = _RUN.max_steps
    synthetic_size: int = _RUN.synthetic_size
    threads: int = _RUN.threads
    seed: int = _RUN.seed
    results_dir: str = _RUN.results_dir
    run_id: str = ""                 # empty: a new one
    timeout_s: float = 3600          # per run; the job is killed and recorded as failed
    ceiling: bool = False
    fault: str = ""                  # RANK:STEP, for tests of a dying rank
    where: str = "local"             # local | image | auto (the image when one is built)
    image: str = ""                  # a tag; empty: the lab image that fits the device
    frozen: bool = False             # in the image: its own copy of the kit, not the checkout
    nodes: int = 1                   # >1: on the simulated cluster's nodes (compose.yaml)
    link: str = ""                   # with nodes: shape each node's link, RATE[/DELAY]


@dataclass
class Outcome:
    run_dir: str
    records: list[dict]
    failed: int
    notes: list[str]
    ceilings: dict = field(default_factory=dict)   # np -> compute ceiling measured around its run


def parse_np(spec) -> list[int]:
    """"2" or "1,2,4" (or a list of ints) -> [1, 2, 4]; one clear sentence on bad input."""
    if isinstance(spec, int):
        items = [spec]
    elif isinstance(spec, (list, tuple)):
        items = list(spec)
    else:
        parts = [p.strip() for p in str(spec).split(",")]
        items = []
        for p in parts:
            try:
                items.append(int(p))
            except ValueError:
                raise BenchError(f"--np takes whole numbers separated by commas "
                                 f"(for example 1,2,4), not {spec!r}") from None
    if not items:
        raise BenchError("--np needs at least one process count")
    for n in items:
        if n < 1:
            raise BenchError(f"--np must be at least 1, not {n}")
    return list(dict.fromkeys(items))


_STACK_PROBE = r"""
import json, importlib.util
out = {}
try:
    import torch, torch.distributed as dist
    out["torch"] = torch.__version__
    out["cuda_available"] = torch.cuda.is_available()
    out["gpus"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
    out["ddp_backends"] = {"gloo": dist.is_gloo_available(), "mpi": dist.is_mpi_available(),
                           "nccl": dist.is_nccl_available()}
except Exception as e:
    out["torch_error"] = f"{type(e).__name__}: {e}"
if importlib.util.find_spec("horovod") is not None:
    try:
        import horovod.torch as hvd
        out["horovod"] = {"gloo": bool(hvd.gloo_built()), "mpi": bool(hvd.mpi_built()),
                          "nccl": bool(hvd.nccl_built())}
    except Exception as e:
        out["horovod_error"] = f"{type(e).__name__}: {e}"
try:
    import torchvision
    out["torchvision"] = torchvision.__version__
except Exception as e:
    out["torchvision_error"] = f"{type(e).__name__}: {e}".splitlines()[0]
import shutil
out["mpirun"] = shutil.which("mpirun") is not None
print(json.dumps(out))
"""


def probe_stack(python: str = sys.executable, timeout: float = 120, runner=None) -> dict:
    """What the worker's Python can run: torch, its distributed back ends, GPUs, Horovod
    (in the image when a runner is given)."""
    if runner is not None:
        from lab.container import ContainerError
        try:
            rc, out = runner.output(["python", "-c", _STACK_PROBE], timeout_s=timeout)
        except ContainerError as e:
            raise BenchError(f"{e}; run with --local to use local processes") from None
        try:
            return json.loads(out.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            raise BenchError(f"could not inspect the Python in the image {runner.tag}: "
                             f"{(out.strip().splitlines() or ['no output'])[-1]}") from None
    try:
        cp = subprocess.run([python, "-c", _STACK_PROBE], capture_output=True, text=True,
                            timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise BenchError(f"importing torch in {python} took over {timeout:g} s: check the "
                         f"installation with `invoke doctor`") from None
    try:
        return json.loads(cp.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise BenchError(f"could not inspect the Python at {python}: "
                         f"{(cp.stderr.strip().splitlines() or ['no output'])[-1]}") from None


def resolve_framework(requested: str, stack: dict) -> tuple[str, str | None]:
    """auto -> horovod when it imports, else ddp (with a note saying so)."""
    if requested != "auto":
        return requested, None
    if "horovod" in stack:
        return "horovod", None
    return "ddp", ("Horovod is not installed, so the framework is DDP (torch.distributed.run); "
                   "build Horovod with docker/install-horovod.sh to use it")


def check_request(s: BenchSettings, stack: dict) -> tuple[str, list[str]]:
    """Everything that can be known before launching; returns the framework and notes."""
    if "torch_error" in stack or "torch" not in stack:
        raise BenchError(f"torch does not import ({stack.get('torch_error', 'not installed')}): "
                         f"install the training extra, pip install -e '.[train]'")
    framework, note = resolve_framework(s.framework, stack)
    notes = [note] if note else []
    cfg = base_config(s, framework)
    try:
        cfg.check()
    except ConfigError as e:
        raise BenchError(str(e)) from None
    if framework == "none" and any(n != 1 for n in s.np):
        raise BenchError("--framework none runs one process: use --np 1, "
                         "or --framework horovod or ddp")
    if s.device == "cuda":
        if not stack.get("cuda_available"):
            raise BenchError("--device cuda but torch sees no GPU: run `invoke doctor`, "
                             "or use --device cpu")
        if max(s.np) > stack.get("gpus", 0):
            raise BenchError(f"--np {max(s.np)} needs {max(s.np)} GPUs on this host and torch "
                             f"sees {stack.get('gpus', 0)}: lower --np")
    if framework == "horovod":
        if "horovod_error" in stack:
            raise BenchError(f"Horovod is installed but does not import ({stack['horovod_error']}): "
                             f"rebuild it against this torch with docker/install-horovod.sh")
        if "horovod" not in stack:
            raise BenchError("Horovod is not installed: build it with docker/install-horovod.sh, "
                             "or use --framework ddp")
        if not stack["horovod"].get(s.backend):
            raise BenchError(f"this Horovod was built without {s.backend}: rebuild it with "
                             f"docker/install-horovod.sh, or pick another --backend")
        if s.backend == "mpi" and not stack.get("mpirun", shutil.which("mpirun") is not None):
            raise BenchError("--backend mpi needs mpirun on the PATH: install an MPI "
                             "(Debian: openmpi-bin)")
    if framework == "ddp" and not stack.get("ddp_backends", {}).get(s.backend):
        hint = ("pip's torch builds have no MPI back end; use --framework horovod --backend mpi"
                if s.backend == "mpi" else "use --backend gloo")
        raise BenchError(f"this torch has no {s.backend} back end for DDP: {hint}")
    if s.model == "resnet50" and "torchvision" not in stack:
        raise BenchError(f"--model resnet50 needs torchvision, which does not import here "
                         f"({stack.get('torchvision_error', 'not installed')}): install the "
                         f"torchvision built for torch {stack['torch']}")
    return framework, notes


def base_config(s: BenchSettings, framework: str) -> RunConfig:
    return RunConfig(model=s.model, framework=framework, backend=s.backend, device=s.device,
                     data=s.data, data_dir=s.data_dir, epochs=s.epochs, batch_size=s.batch_size,
                     compression=s.compression, warmup_steps=s.warmup_steps,
                     max_steps=s.max_steps, synthetic_size=s.synthetic_size, threads=s.threads,
                     seed=s.seed, results_dir=s.results_dir, fault=s.fault)


def _horovodrun() -> str:
    here = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    return here if os.path.exists(here) else (shutil.which("horovodrun") or "horovodrun")


def _kill_group(proc: subprocess.Popen, grace: float = 5.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def run_job(cmd: list[str], env: dict, timeout_s: float, echo) -> tuple[int | None, list[str], str]:
    """Run a launcher in its own process group, echoing its output. Returns the exit
    code (None when it was killed for the timeout), the last lines, and why it ended."""
    tail: collections.deque[str] = collections.deque(maxlen=40)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True, stdin=subprocess.DEVNULL,
                            errors="replace")

    def pump():
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            echo(line.rstrip("\n"))

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=timeout_s if timeout_s > 0 else None)
        why = "exited"
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        rc, why = None, f"did not finish within {timeout_s:g} s and was stopped"
    except KeyboardInterrupt:
        _kill_group(proc)
        raise
    finally:
        if proc.poll() is None:
            _kill_group(proc)
    # The launcher is gone; stragglers it left in the group are ended too.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    reader.join(timeout=5)
    return rc, list(tail), why


def first_failure(failure_dir: str) -> dict | None:
    """The earliest failure any rank wrote for one launch."""
    found = []
    for path in glob.glob(os.path.join(failure_dir, "rank-*.json")):
        try:
            with open(path) as f:
                found.append(json.load(f))
        except (OSError, json.JSONDecodeError):
            continue
    if not found:
        return None
    # The first to fail is the cause: a rank writes its file before it exits, and its
    # peers fail only once it is gone.
    found.sort(key=lambda x: (x.get("t", float("inf")), x.get("rank", 0)))
    return found[0]


def _failure_reason_from_tail(tail: list[str]) -> str:
    for line in reversed(tail):
        if "failed:" in line or "Error" in line:
            return line.strip()[:300]
    return (tail[-1].strip()[:300] if tail else "no output")


WHERE = ("local", "image", "auto")


def choose_runner(s: BenchSettings):
    """Where the ranks run: (an ImageRunner or None for local processes, a note or None).
    `auto` takes the lab image when an engine and an image are there, and says in one
    line why not otherwise; `image` insists on it; `local` never looks."""
    if s.where not in WHERE:
        raise BenchError(f"where the job runs must be one of {', '.join(WHERE)}, not {s.where!r}")
    if s.link and s.nodes < 2:
        raise BenchError("--link shapes the links between the cluster's nodes: add --nodes 2 or more")
    if s.nodes > 1:
        from lab import cluster
        try:
            if s.link:
                cluster.parse_link(s.link)
            runner = cluster.ClusterRunner(s.nodes, frozen=s.frozen)
        except cluster.ClusterError as e:
            raise BenchError(str(e)) from None
        return runner, (f"running on the cluster's {s.nodes} nodes ({runner.tag}); results in "
                        f"{runner.results_root}")
    if s.where == "local":
        return None, None
    from lab import container
    tags = [s.image] if s.image else container.candidate_images(
        s.device, "horovod" if s.framework == "auto" else s.framework, s.backend)
    try:
        client = container.connect()
    except container.ContainerError as e:
        if s.where == "image" or s.image:
            raise BenchError(f"{e}: start the engine, or run with --local") from None
        return None, f"running as local processes: {e} (--local says so and skips the check)"
    image = container.find_image(client, tags)
    if image is None:
        if s.where == "image" or s.image:
            raise BenchError(f"no image {' or '.join(tags)} is built: run `invoke build`, "
                             f"or run with --local")
        return None, (f"running as local processes: no lab image ({', '.join(tags)}) is built "
                      f"(`invoke build` makes one; --local skips the check)")
    runner = container.ImageRunner(client, image, frozen=s.frozen, gpus=s.device == "cuda",
                                   results_dir=s.results_dir, data_dir=s.data_dir)
    code = "the image's own copy of the kit" if s.frozen else "the checkout's lab code"
    return runner, f"running in the image {runner.tag} ({image.short_id}) with {code}"


def run(s: BenchSettings, echo=print, stack: dict | None = None) -> Outcome:
    """Check the request, then run one job per process count into one results directory."""
    nps = parse_np(s.np)
    s = dataclasses.replace(s, np=nps)
    runner, where_note = choose_runner(s)
    if where_note:
        echo(where_note)
    on_cluster = s.nodes > 1
    if on_cluster:
        # The nodes see the cluster's own results and data folders.
        s = dataclasses.replace(s, results_dir=runner.results_root,
                                data_dir=runner.data_root or s.data_dir)
    stack = stack if stack is not None else probe_stack(runner=runner)
    framework, notes = check_request(s, stack)
    for n in notes:
        echo(n)
    if where_note and runner is not None:
        notes.insert(0, where_note)
    if s.data == "mnist":
        # Once, here, rather than by every rank at the same time.
        from lab.fetch import DataUnavailable, ensure_mnist
        try:
            ensure_mnist(s.data_dir)
        except DataUnavailable as e:
            raise BenchError(str(e)) from None
    run_id = s.run_id or results.new_run_id()
    rdir = results.run_dir(s.results_dir, run_id)
    rfile = rdir / results.RESULTS_FILE
    os.makedirs(rdir, exist_ok=True)
    if runner is not None:
        runner.hand_over(str(rdir))
    if on_cluster and s.link:
        from lab import cluster
        try:
            cluster.shape(runner.found, s.link, echo)
        except cluster.ClusterError as e:
            raise BenchError(str(e)) from None
    try:
        return _run_all(s, nps, runner, framework, notes, run_id, rdir, rfile, echo, on_cluster)
    finally:
        if on_cluster and s.link:
            from lab import cluster
            cluster.unshape(runner.found)


def _run_all(s, nps, runner, framework, notes, run_id, rdir, rfile, echo, on_cluster) -> Outcome:
    if runner is not None:
        from lab.container import DATA_IN, RESULTS_IN

    failed = 0
    ceilings: dict[int, dict] = {}
    for i, np in enumerate(nps):
        cfg = dataclasses.replace(base_config(s, framework), run_id=run_id, expected_np=np,
                                  attempt=f"{i:03d}-{framework}-{s.backend}-{s.compression}"
                                          f"-n{s.nodes}-np{np}", link=s.link)
        extra = {"OMP_NUM_THREADS": str(s.threads), "PYTHONUNBUFFERED": "1"}
        if s.device == "cpu":
            # Open MPI busy-polls while it waits; with Horovod's background thread beside
            # each rank's compute thread that steals the cores the ranks compute on
            # (measured here: 2 ranks of the MNIST CNN, 3,000-3,400 images/s polling,
            # 4,400-4,700 yielding). A value set by the user wins.
            extra["OMPI_MCA_mpi_yield_when_idle"] = os.environ.get(
                "OMPI_MCA_mpi_yield_when_idle", "1")
        if runner is None:
            cmd = launch.command(framework, s.backend, np, cfg.to_args())
            if framework == "horovod":
                cmd[0] = _horovodrun()
            env = dict(os.environ, **extra)
        elif on_cluster:
            inside = dataclasses.replace(cfg, results_dir=RESULTS_IN, data_dir=DATA_IN)
            from lab.cluster import ClusterError
            try:
                per_node = runner.commands(framework, s.backend, np, inside.to_args())
            except ClusterError as e:
                raise BenchError(str(e)) from None
            cmd = per_node["node1"]
        else:
            inside = dataclasses.replace(cfg, results_dir=RESULTS_IN, data_dir=DATA_IN)
            cmd = launch.command(framework, s.backend, np, inside.to_args(), python="python")
        echo(f"== {framework} over {s.backend}, {np} process(es): {' '.join(cmd)}")
        before = len(results.read_records(rfile)[0])
        ceiling_before = measure_ceiling(s, np, runner) if s.ceiling else None
        started = results.now_iso()
        t0 = time.monotonic()
        try:
            if runner is None:
                rc, tail, why = run_job(cmd, env, s.timeout_s, echo)
            elif on_cluster:
                rc, tail, why = runner.run(per_node, extra, s.timeout_s, echo)
            else:
                rc, tail, why = runner.run(cmd, extra, s.timeout_s, echo,
                                           name=f"lab-bench-{run_id}-{cfg.attempt}")
        except KeyboardInterrupt:
            _record_failure(rfile, cfg, np, started, {"rank": None, "host": None,
                            "reason": "interrupted by the user", "log_tail": ""})
            raise
        except Exception as e:
            from lab.container import ContainerError
            if not isinstance(e, ContainerError):
                raise
            rc, tail, why = 1, [str(e)], str(e)
        wrote = len(results.read_records(rfile)[0]) > before
        if rc == 0 and wrote:
            if s.ceiling:
                ceilings[np] = ceiling_around(s, np, before_s=ceiling_before, runner=runner)
            continue
        failed += 1
        info = first_failure(os.path.join(rdir, "failures", cfg.attempt))
        dead = runner.dead() if on_cluster else {}
        if dead:
            host, state = next(iter(dead.items()))
            reason = f"node {host} stopped during the run ({state})"
            info = {"rank": None, "host": host}
        elif rc == 0:
            reason = "the job exited normally but wrote no record"
        elif rc is None:
            reason = f"the job {why}"
        elif info:
            reason = f"rank {info['rank']} on {info['host']} failed: {info['reason']}"
        else:
            reason = f"the launcher exited with {rc}: {_failure_reason_from_tail(tail)}"
        echo(f"!! run failed after {time.monotonic() - t0:.1f} s: {reason}")
        _record_failure(rfile, cfg, np, started, {
            "rank": info["rank"] if info else None, "host": info["host"] if info else None,
            "reason": reason, "log_tail": "\n".join(tail[-20:])})

    records = [r for r in results.read_records(rfile)[0] if r.get("run_id") == run_id]
    return Outcome(str(rdir), records, failed, notes, ceilings)


def _record_failure(rfile, cfg: RunConfig, np: int, started: str, error: dict) -> None:
    results.append_record(rfile, {
        "run_id": cfg.run_id, "record_id": results.new_record_id(), "status": "failed",
        "started_at": started, "finished_at": results.now_iso(), "config": cfg.as_record(),
        "np": np, "error": error})


def measure_ceiling(s: BenchSettings, processes: int, runner=None) -> dict:
    """The model's steps with no framework (lab.ceiling) in `processes` independent
    processes at once: what the machine gives that many ranks that never communicate.
    In the image when the job runs there."""
    from lab.ceiling import measure_concurrent  # standard library only at import
    steps = dict(steps=3, warmup=1) if s.model == "resnet50" else {}
    if runner is not None:
        cmd = ["python", "-m", "lab.ceiling", "--processes", str(processes), "--model", s.model,
               "--batch-size", str(s.batch_size), "--threads", str(s.threads),
               "--device", s.device]
        for k, v in steps.items():
            cmd += [f"--{k}", str(v)]
        from lab.container import ContainerError
        try:
            rc, out = runner.output(cmd)
        except ContainerError as e:
            raise BenchError(str(e)) from None
        try:
            if rc != 0:
                raise ValueError
            return json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise BenchError(f"measuring the compute ceiling in the image failed: "
                             f"{(out.strip().splitlines() or ['no output'])[-1]}") from None
    try:
        return measure_concurrent(processes, s.model, s.batch_size, s.threads,
                                  device=s.device, **steps)
    except RuntimeError as e:
        raise BenchError(f"measuring the compute ceiling failed: {e}") from None


def ceiling_around(s: BenchSettings, processes: int, before_s: dict, runner=None) -> dict:
    """The ceiling measured just before and just after a run, averaged: a shared
    machine's speed drifts, and the run lies between the two."""
    after = measure_ceiling(s, processes, runner)
    b, a = before_s["images_per_s"], after["images_per_s"]
    return {"processes": processes, "images_per_s": (a + b) / 2, "before": b, "after": a}


def render(outcome: Outcome) -> str:
    table = summary.render(summary.rows(outcome.records))
    lines = [table]
    for r in outcome.records:
        c = outcome.ceilings.get(r.get("world", {}).get("np"))
        if c and r.get("status") == "ok":
            n, t = r["world"]["np"], r["figures"]["throughput_img_s"]
            lines.append(f"np={n}: {t:,.4g} images/s = {t / c['images_per_s']:.0%} of the compute "
                         f"ceiling, {c['images_per_s']:,.4g} images/s (the model's steps with no "
                         f"framework in {n} independent process(es); {c['before']:,.4g} before "
                         f"the run, {c['after']:,.4g} after)")
    lines.append(f"records: {os.path.join(outcome.run_dir, results.RESULTS_FILE)}")
    return "\n".join(lines)


def benchmark_plans(stack: dict, results_dir: str = "results") -> tuple[list[BenchSettings], list[str]]:
    """What `invoke benchmark` runs: MNIST and ResNet-50 at np 1 and 2 over each framework
    and back end this machine has, each beside its compute ceiling."""
    mnist = dict(np=[1, 2], model="mnist", data="synthetic", batch_size=64, max_steps=300,
                 warmup_steps=20, ceiling=True, results_dir=results_dir)
    # ResNet-50 at 224x224 takes seconds a step on one CPU thread: a few steps suffice.
    resnet = dict(np=[1, 2], model="resnet50", data="synthetic", batch_size=8, max_steps=4,
                  warmup_steps=1, ceiling=True, results_dir=results_dir)
    combos = [("ddp", "gloo")]
    notes = []
    hvd = stack.get("horovod") or {}
    for backend in ("gloo", "mpi"):
        if hvd.get(backend) and (backend != "mpi" or shutil.which("mpirun")):
            combos.append(("horovod", backend))
        else:
            notes.append(f"skipped Horovod over {backend}: not available here")
    plans = [BenchSettings(framework=f, backend=b, **mnist) for f, b in combos]
    plans.append(BenchSettings(framework="ddp", backend="gloo", **resnet))
    return plans, notes


# ---------------------------------------------------------------- sweeps

SWEEP_FIELDS = ("framework", "backend", "compression", "nodes")


def parse_list(name: str, spec, allowed=None) -> list:
    """'a,b' (or a list) -> ['a', 'b']; checked against the allowed values."""
    items = spec if isinstance(spec, (list, tuple)) else [x.strip() for x in str(spec).split(",")]
    items = [x for x in items if x != ""]
    if not items:
        raise BenchError(f"--{name} needs at least one value")
    if name == "nodes":
        try:
            items = [int(x) for x in items]
        except ValueError:
            raise BenchError(f"--nodes takes whole numbers separated by commas (1,2), not {spec!r}") from None
        if min(items) < 1:
            raise BenchError("--nodes must be at least 1")
    elif allowed is not None:
        bad = [x for x in items if x not in allowed]
        if bad:
            raise BenchError(f"unknown --{name} {bad[0]!r}: choose from {', '.join(allowed)}")
    return list(dict.fromkeys(items))


def sweep_plan(base: BenchSettings, lists: dict) -> list[BenchSettings]:
    """The cross product of the lists (framework, backend, compression, nodes), each
    with all of base.np."""
    import itertools
    keys = [k for k in SWEEP_FIELDS if k in lists]
    plans = []
    for values in itertools.product(*(lists[k] for k in keys)):
        plans.append(dataclasses.replace(base, **dict(zip(keys, values))))
    return plans


def done_key(framework, backend, compression, nodes, np, link="") -> tuple:
    return (framework, backend, compression, int(nodes), int(np), link or "")


def finished(rfile) -> set:
    """Combinations that already have an ok record in a results file (for --resume)."""
    out = set()
    for r in results.read_records(rfile)[0]:
        if r.get("status") == "ok":
            c = r["config"]
            out.add(done_key(c["framework"], c["backend"], c["compression"], r["world"]["nodes"],
                             r["world"]["np"], c.get("link", "")))
    return out


def run_sweep(base: BenchSettings, lists: dict, resume: bool = False, echo=print) -> list[Outcome]:
    """Every combination into one results directory. A combination that cannot run here
    is skipped with the reason printed and recorded; with resume, combinations that
    already have an ok record in that directory are not run again."""
    if resume and not base.run_id:
        raise BenchError("--resume continues a sweep: give its --run-id (the results folder's name)")
    run_id = base.run_id or results.new_run_id()
    base = dataclasses.replace(base, run_id=run_id)
    rfile = results.run_dir(base.results_dir, run_id) / results.RESULTS_FILE
    outcomes = []
    stacks: dict = {}
    for s in sweep_plan(base, lists):
        label = f"{s.framework} over {s.backend}, compression {s.compression}, {s.nodes} node(s)"
        nps = parse_np(s.np)
        if resume:
            have = finished(rfile)
            nps = [n for n in nps if done_key(s.framework, s.backend, s.compression, s.nodes, n,
                                              s.link) not in have]
            if not nps:
                echo(f"-- {label}: already recorded, not run again (--resume)")
                continue
        s = dataclasses.replace(s, np=nps)
        reason = None
        try:
            stack = None
            if s.nodes == 1 and s.where == "local":
                if "local" not in stacks:
                    stacks["local"] = probe_stack()
                stack = stacks["local"]
            outcomes.append(run(s, echo=echo, stack=stack))
            continue
        except BenchError as e:
            reason = str(e)
        echo(f"-- skipped {label}: {reason}")
        os.makedirs(rfile.parent, exist_ok=True)
        for n in nps:
            cfg = dataclasses.replace(base_config(s, s.framework if s.framework != "auto" else "ddp"),
                                      run_id=run_id, expected_np=n, link=s.link)
            results.append_record(rfile, {
                "run_id": run_id, "record_id": results.new_record_id(), "status": "skipped",
                "started_at": results.now_iso(), "finished_at": results.now_iso(),
                "config": cfg.as_record(), "np": n, "nodes": s.nodes,
                "error": {"rank": None, "host": None, "reason": reason, "log_tail": ""}})
    return outcomes
