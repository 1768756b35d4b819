"""Where a job's ranks run, behind one interface: local processes (`LocalRunner`), a
container of the lab image (`lab.host.container.ImageRunner`) or the nodes of the
simulated cluster (`lab.host.cluster_runner.ClusterRunner`). Each runner prepares a run
folder, turns a launch into one command per host, runs those commands streaming their
output, stops what it started, probes the stack the ranks will see, and says which
nodes died. `lab.host.where.choose_runner` picks one the same way for bench and doctor
(the concrete runners import this module; it imports none of them)."""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

from lab.common import kit, proc
from lab.common.config import RunConfig
from lab.host import launch

WHERE = ("local", "image", "auto")


class RunnerError(Exception):
    """No engine, no image, no cluster, or a job that could not start: one sentence."""


@dataclass(frozen=True)
class Launch:
    """One launch of a job, built once by bench from the run's configuration: what every
    runner's commands() turns into one command per host (and, where a runner must carry
    them inside the command, its environment and time limit)."""
    framework: str
    backend: str
    np: int
    worker_args: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    timeout_s: float = 0
    run_id: str = ""
    attempt: str = ""
    device: str = "cpu"
    config: RunConfig | None = None      # the ranks' configuration (worker_args are its argv)

    @property
    def key(self) -> str:
        """"<run id>/<attempt>": names this launch (rendezvous, process patterns)."""
        return f"{self.run_id}/{self.attempt}"

    @property
    def environment(self) -> dict[str, str]:
        return dict(self.env)


@dataclass
class JobResult:
    returncode: int | None      # None: stopped at its time limit
    tail: list[str]             # the last lines it printed
    why: str                    # "exited", or how it was ended
    scheduler: dict | None = None   # a scheduler's word on the job (Slurm: id, final state)


class Runner:
    """The interface. `results_in`/`data_in` are the folders as the ranks see them."""

    kind = "runner"
    python = "python"
    tag = ""
    nodes = 1
    started: dict[str, list[str]] | None = None   # what run() last started, host -> argv

    def __init__(self, results_dir: str, data_dir: str | None):
        self.results_dir, self.data_dir = results_dir, data_dir
        self.results_in, self.data_in = results_dir, data_dir

    def describe(self) -> str:
        raise NotImplementedError

    def prepare(self, run_dir: str) -> None:
        """Make the run's folder writable for the ranks."""

    def commands(self, job: Launch) -> dict[str, list[str]]:
        """Host -> the command that starts its part of the job: exactly what run() starts."""
        raise NotImplementedError

    def run(self, commands: dict[str, list[str]], env: dict, timeout_s: float, echo,
            name: str = "") -> JobResult:
        raise NotImplementedError

    def placement(self, np: int) -> dict[str, int]:
        """Where `np` ranks run: host -> how many ("" is this machine, or the image on it)."""
        return {"": np}

    def machines(self, np: int, stack: dict) -> list[tuple[str, int, int]]:
        """(machine, ranks on it, its cores) for `np` ranks: what oversubscription is judged
        by. One machine here; the compose cluster's nodes share this one's cores."""
        return [("this machine" if self.kind in ("local", "image", "cluster") else "", np,
                 int(stack.get("cores") or 1))]

    def output_on(self, host: str, argv: list[str], timeout_s: float = 300) -> tuple[int | None, str]:
        """`output` on one host of placement() (runners of one place have only "")."""
        return self.output(argv, timeout_s)

    def output(self, argv: list[str], timeout_s: float = 300) -> tuple[int | None, str]:
        """A short command (a probe) where the ranks run: (exit code, output)."""
        raise NotImplementedError

    def stop(self) -> None:
        """End whatever this runner started and may still be running."""

    def dead(self) -> dict[str, str]:
        """Hosts that stopped during the last job, with their state."""
        return {}

    def probe_stack(self, timeout_s: float = 120) -> dict:
        """What the ranks' Python can run (lab.worker.capabilities), or RunnerError."""
        try:
            rc, out = self.output([self.python, "-m", "lab.worker.capabilities"], timeout_s)
        except RunnerError as e:
            raise RunnerError(f"{e}; run with --local to use local processes") from None
        except proc.NotFound:
            raise RunnerError(f"{self.python} cannot be run: install the kit with "
                              f"docker/setup-venv.sh") from None
        if rc is None:
            raise RunnerError(f"importing torch {self.where_text()} took over {timeout_s:g} s: "
                              f"check the installation with `invoke doctor`")
        for line in reversed(out.strip().splitlines()):
            if line.startswith("{"):
                try:
                    return json.loads(line)
                except json.JSONDecodeError:
                    break
        last = (out.strip().splitlines() or ["no output"])[-1]
        raise RunnerError(f"could not inspect the Python {self.where_text()}: {last}")

    def where_text(self) -> str:
        return f"at {self.python}"


class LocalRunner(Runner):
    """The ranks as processes of this machine, started by the framework's launcher."""

    kind = "local"

    def __init__(self, results_dir: str = "results", data_dir: str | None = "data",
                 python: str = sys.executable):
        super().__init__(results_dir, data_dir)
        self.python = python
        self._running: proc.Process | None = None
        self._stack: dict | None = None      # what probe_stack found

    def describe(self) -> str:
        return "running as local processes"

    def commands(self, job: Launch):
        if job.framework == "ddp":      # one machine: no torchrun (it imports torch first)
            return {"localhost": launch.local_ddp_command(job.np, list(job.worker_args), self.python)}
        cmd = launch.command(job.framework, job.backend, job.np, list(job.worker_args),
                             python=self.python, horovodrun=kit.horovodrun(self.python))
        hvd = (self._stack or {}).get("horovod")
        if job.framework == "horovod" and hvd:
            # horovodrun, its build checks answered from the probe (lab.host.horovod_launcher)
            built = ",".join(c for c in ("gloo", "mpi") if hvd.get(c))
            cmd = [self.python, "-m", "lab.host.horovod_launcher", f"--built={built}", *cmd[1:]]
        return {"localhost": cmd}

    def run(self, commands, env, timeout_s, echo, name=""):
        (cmd,) = commands.values()
        self._running = proc.start(cmd, env=dict(os.environ, **env), echo=echo, keep_output=False)
        self.started = {next(iter(commands)): list(self._running.argv)}
        try:
            res = self._running.wait(timeout_s)
        finally:
            self._running = None
        if res.timed_out:
            return JobResult(None, res.tail, f"did not finish within {timeout_s:g} s and was stopped")
        return JobResult(res.returncode, res.tail, "exited")

    def output(self, argv, timeout_s=300):
        res = proc.run(argv, timeout=timeout_s)
        return res.returncode, res.stdout

    def probe_stack(self, timeout_s: float = 120) -> dict:
        """The probe's answer, from the cache of this Python's last one while nothing it
        depends on changed (lab.host.stack_cache): seconds of imports saved per run."""
        from lab.host import stack_cache
        self._stack = stack_cache.cached(stack_cache.local_key(self.python),
                                         lambda: super(LocalRunner, self).probe_stack(timeout_s))
        return self._stack

    def stop(self):
        if self._running is not None:
            self._running.stop()


def candidate_images(device: str, framework: str, backend: str,
                     cudas: list[str] | None = None) -> list[str]:
    """The tags bench looks for, best first: the CPU image for CPU runs (a GPU image
    runs on a CPU too); for GPU runs with Horovod only the images whose GPU operations
    carry the back end (nccl: gpu-nccl, mpi: gpu-mpi; gloo fits neither and is refused
    by the request check, lab.common.kit.horovod_gpu_path_problem); DDP brings its own
    NCCL and Gloo, so any GPU image serves it. `cudas`: the matrix's CUDA entries, the
    default first (its images are gpu-nccl, the others gpu-nccl-cu126 and so on)."""
    from lab.common.docker_api import IMAGE_REPO
    cudas = cudas or [""]

    def gpu(ops):
        return [f"{IMAGE_REPO}:gpu-{ops}" + (f"-cu{c.replace('.', '')}" if i else "")
                for i, c in enumerate(cudas)]
    if device == "cpu":
        return [f"{IMAGE_REPO}:cpu", *gpu("nccl"), *gpu("mpi")]
    if framework == "horovod":
        return gpu("mpi") if backend == "mpi" else gpu("nccl")
    return [*gpu("nccl"), *gpu("mpi")]


def matrix_cudas() -> list[str]:
    """The matrix's CUDA entries, its default first."""
    from lab.common import versions
    from lab.host.images import cuda_entries
    m = versions.read()
    rest = [c for c in cuda_entries(m) if c != m["CUDA_DEFAULT"]]
    return [m["CUDA_DEFAULT"], *rest]


def host_gpu_capabilities() -> list[str]:
    """The compute capability of each GPU of this host (NVML), [] when none is seen or
    NVML is missing. Never raises (envcheck's probe)."""
    from envcheck.host import probe_gpus
    r = probe_gpus()
    return [d["compute_capability"] for d in (r.value or {}).get("devices", [])
            if d.get("compute_capability")] if r.status == "PASS" else []


def host_gpu_driver() -> str | None:
    """The NVIDIA driver version of this host (NVML or nvidia-smi), None when none is
    seen. Never raises (envcheck's probe)."""
    from envcheck.host import probe_gpus
    r = probe_gpus()
    return (r.value or {}).get("driver") if r.status == "PASS" else None


def by_driver(images: list, driver: str | None) -> tuple[list, list[str]]:
    """(the images this driver runs, best first; a sentence per image it cannot run).
    The verdict is envcheck.probes.driver_supports' (the version matrix's GA and
    minor-version-compatibility drivers): PASS before WARN, FAIL left out. The GPU images
    set NVIDIA_DISABLE_REQUIRE, so the container toolkit no longer refuses a too-old
    driver and the image would start with no usable GPU: the choice has to be made here."""
    from envcheck.probes import FAIL, PASS, driver_supports
    from lab.host.images import LABEL_PREFIX
    if not driver:
        return list(images), []
    ranked, refused = [], []
    for i, img in enumerate(images):
        cuda = (img.labels or {}).get(LABEL_PREFIX + "cuda_version")
        status, line = driver_supports(driver, cuda) if cuda else (PASS, "")
        if status == FAIL:
            refused.append(f"{img.tags[0] if img.tags else img.short_id}: {line}")
        else:
            ranked.append((status != PASS, i, img))
    return [img for *_, img in sorted(ranked, key=lambda t: t[:2])], refused


def unfit_for(labels: dict, capabilities: list[str]) -> list[str]:
    """The capabilities among `capabilities` that an image (its labels) has no code for."""
    from lab.common.versions import archs_cover
    from lab.host.images import LABEL_PREFIX
    archs = (labels or {}).get(LABEL_PREFIX + "cuda_archs")
    if not archs:
        return []
    ptx = (labels or {}).get(LABEL_PREFIX + "cuda_ptx") == "1"
    return sorted({c for c in capabilities if not archs_cover(archs, c, ptx)})


def no_code_sentence(tag: str, labels: dict, missing: list[str]) -> str:
    from lab.common import versions
    from lab.host.images import LABEL_PREFIX
    entry = versions.cuda_entry_for(versions.read(), missing[0])
    fix = (f"build one that has: invoke build --cuda {entry}" if entry else
           "no CUDA entry of the matrix (docker/versions.env) covers it")
    return (f"{tag} has no GPU code for compute capability {', '.join(missing)} (the GPUs here; "
            f"it is built for {(labels or {}).get(LABEL_PREFIX + 'cuda_archs')}): {fix}")


def gpu_image(cli, tags: list[str], check: bool = True):
    """The first of `tags` built that has code for every GPU here (a V100, 7.0, needs the
    CUDA 12.6 image: the CUDA 13 builds start at 7.5) and that this driver runs (an R535
    or R560 driver cannot run CUDA 13); None when none is built. With check, RunnerError
    in one sentence when none fits; without (doctor reports it), the best there is."""
    from lab.common import docker_api
    built = [i for i in (docker_api.find_image(cli, [t]) for t in tags) if i is not None]
    if not built:
        return None
    caps = host_gpu_capabilities()
    fits = [i for i in built if not unfit_for(i.labels, caps)]
    if not fits and check:
        first = built[0]
        raise RunnerError(no_code_sentence(first.tags[0] if first.tags else tags[0], first.labels,
                                           unfit_for(first.labels, caps)))
    runs, refused = by_driver(fits, host_gpu_driver())
    if fits and not runs and check:
        raise RunnerError("the NVIDIA driver here runs none of the GPU images built ("
                          + "; ".join(refused) + ")")
    return (runs or fits or built)[0]
