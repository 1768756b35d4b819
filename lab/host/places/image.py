"""Running jobs inside the lab image: one container holding the N ranks of a node.

The pure part (`job_spec`) says what the container gets: the GPUs, shared memory for
NCCL, memlock unlimited, the results directory (read-write) and the data directory
(read-only) mounted, and the checkout's `lab` and `envcheck` on the PYTHONPATH unless
`frozen` (then the image's own copy runs). The edge (`ImageRunner`) starts it through
the Docker SDK, streams its output and removes it when the job ends, fails, times out or
is interrupted. Every container carries the kit's label (lab.common.docker_api) so that
whatever is left behind can be found and removed (`invoke clean`)."""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field

from lab.common import docker_api, kit, proc
from lab.common.docker_api import MANAGED_BY
from lab.common.forwarded_env import forwarded
from lab.host.places import launch, stack_cache
from lab.host.places.base import JobResult, Runner, RunnerError

LABEL_VALUE = "bench"
SHM_SIZE = "2g"              # NCCL's shared-memory transport; Docker's default is 64 MB
RESULTS_IN = "/results"
DATA_IN = "/data"
SOURCE_IN = "/opt/lab-src"
IMAGE_UID = 1000             # the image's user `lab` (docker/Dockerfile)
# A CPU job in a GPU image: its CUDA-aware Open MPI looks for libcuda.so.1, which only a
# container with GPUs is given, and prints a multi-line "CUDA-aware support is disabled"
# notice per rank. Open MPI 4.1 shows it only while opal_warn_on_missing_libcuda is
# true (opal/mca/common/cuda/common_cuda.c, mca_common_cuda_stage_one_init); a value
# the user exported is forwarded and wins.
QUIET_NO_LIBCUDA = ("OMPI_MCA_opal_warn_on_missing_libcuda", "0")


@dataclass
class JobSpec:
    image: str
    command: list[str]
    environment: dict[str, str] = field(default_factory=dict)
    mounts: dict[str, tuple[str, str]] = field(default_factory=dict)   # host -> (inside, mode)
    user: str | None = None
    gpus: bool = False
    gpu_ids: list[str] | None = None        # with gpus: these devices only; None: every GPU
    memlock_unlimited: bool = False
    labels: dict[str, str] = field(default_factory=dict)
    name: str | None = None


def visible_gpus(environ) -> list[str] | None:
    """The host's CUDA_VISIBLE_DEVICES as the device ids a container is given, or None
    when it is unset (every GPU). Inside, the devices are numbered from 0 again, so the
    variable itself is not passed on. What passes through: indices, full GPU- and MIG-
    UUIDs (libnvidia-container compares whole names: CUDA's abbreviated UUID prefixes
    fail there, loudly). Two caveats: the toolkit reads an index in NVML's (PCI bus)
    order, CUDA in CUDA_DEVICE_ORDER's (fastest first by default), so on a host with
    mixed GPU models give UUIDs or set CUDA_DEVICE_ORDER=PCI_BUS_ID; and CUDA stops at
    the first entry that is not a device (a negative index here; an index past the last
    GPU is passed on and the toolkit refuses it as an unknown device)."""
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    ids = [v.strip() for v in value.split(",") if v.strip()]
    # CUDA stops at the first id that is not a device (a negative index hides the rest).
    for i, v in enumerate(ids):
        if v.lstrip("-").isdigit() and int(v) < 0:
            ids = ids[:i]
            break
    if not ids:
        raise RunnerError(f"CUDA_VISIBLE_DEVICES={value!r} hides every GPU from the job: "
                          f"unset it or name the GPUs to use (0,1)")
    return ids


def job_spec(image: str, command: list[str], *, results_dir: str, data_dir: str | None,
             frozen: bool, gpus: bool, host_uid: int, host_gid: int,
             image_id: str = "", image_labels: dict | None = None,
             environment: dict | None = None, name: str | None = None) -> JobSpec:
    """What the container of one job gets. Host paths are made absolute."""
    env = {"PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1",
           "LAB_IMAGE_ID": image_id, "LAB_IMAGE_LABELS": json.dumps(image_labels or {})}
    env.update(forwarded(os.environ, own_network=True))      # NCCL_*, UCX_*, ... (one list)
    if not gpus:
        env.setdefault(*QUIET_NO_LIBCUDA)
    env.update(environment or {})
    mounts = {os.path.abspath(results_dir): (RESULTS_IN, "rw")}
    if data_dir and os.path.isdir(data_dir):
        mounts[os.path.abspath(data_dir)] = (DATA_IN, "ro")
    if not frozen:
        for pkg in kit.PACKAGES:
            mounts[str(kit.REPO_ROOT / pkg)] = (f"{SOURCE_IN}/{pkg}", "ro")
        env["PYTHONPATH"] = SOURCE_IN
    # Files the ranks write belong to the user who runs bench; root on the host runs
    # the job as the image's unprivileged user instead (bench hands it the run folder).
    user = None if host_uid == 0 else f"{host_uid}:{host_gid}"
    if user:
        env.setdefault("HOME", "/tmp")
    labels = {MANAGED_BY: LABEL_VALUE}
    # NCCL pins host memory: memlock unlimited with GPUs. Not asked for otherwise, since
    # an engine whose own limit is lower refuses it (seen here: 8 MiB, no CAP_SYS_RESOURCE).
    gpu_ids = visible_gpus(os.environ) if gpus else None
    return JobSpec(image=image, command=list(command), environment=env, mounts=mounts,
                   user=user, gpus=gpus, gpu_ids=gpu_ids, memlock_unlimited=gpus,
                   labels=labels, name=name)


def run_kwargs(spec: JobSpec) -> dict:
    """The Docker SDK's containers.create arguments for a spec."""
    from docker.types import DeviceRequest, Ulimit
    kw = dict(image=spec.image, command=spec.command, environment=spec.environment,
              volumes={h: {"bind": b, "mode": m} for h, (b, m) in spec.mounts.items()},
              labels=spec.labels, shm_size=SHM_SIZE, init=True, working_dir="/tmp")
    if spec.memlock_unlimited:
        kw["ulimits"] = [Ulimit(name="memlock", soft=-1, hard=-1)]
    if spec.user:
        kw["user"] = spec.user
    if spec.name:
        kw["name"] = spec.name
    if spec.gpus:
        # docker run --gpus all / --gpus '"device=0,2"' (moby's DeviceRequest: Count -1
        # for all, DeviceIDs for some).
        if spec.gpu_ids:
            kw["device_requests"] = [DeviceRequest(device_ids=list(spec.gpu_ids),
                                                   capabilities=[["gpu"]])]
        else:
            kw["device_requests"] = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    return kw


def hand_over(path: str, results_root: str, everyone: bool = False) -> None:
    """Let the image's user (uid IMAGE_UID) write the run's folder `path`. As root on
    the host: give it the folder and let it pass through the results folder above (x,
    not r/w). Otherwise, when the ranks cannot run as the host's user (everyone=True,
    the cluster's ssh sessions), open the run's folder to all."""
    if os.getuid() == 0:
        top = os.path.abspath(results_root)
        os.chmod(top, os.stat(top).st_mode | 0o001)
    elif not everyone:
        return
    for root, _dirs, files in os.walk(path):
        if os.getuid() == 0:
            os.chown(root, IMAGE_UID, IMAGE_UID)
            for f in files:
                os.chown(os.path.join(root, f), IMAGE_UID, IMAGE_UID)
        else:
            os.chmod(root, 0o777)


def hand_back(path: str) -> None:
    """Give what the image's user made in `path` (and `path` itself) back to the user who
    runs bench. Only root on the host needs it (the ranks then ran as the image's user,
    hand_over); any other user's ranks run as that user (job_spec)."""
    if os.getuid() != 0:
        return
    uid, gid = os.getuid(), os.getgid()
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, f) for f in files + dirs)]:
            st = os.lstat(name)
            if (st.st_uid, st.st_gid) != (uid, gid):
                os.lchown(name, uid, gid)


class ImageRunner(Runner):
    """Runs commands in containers of one image; each container is removed at the end."""

    kind = "image"
    title = "the lab image"
    honours = frozenset({"where", "image", "frozen", "results_dir", "data_dir", "checkpoint_every",
                         "max_restarts"})
    in_container = True
    falls_back_to_local = True

    def __init__(self, client, image, *, frozen: bool, gpus: bool, results_dir: str,
                 data_dir: str | None):
        super().__init__(results_dir, data_dir)
        self.results_in, self.data_in = RESULTS_IN, DATA_IN
        self.client, self.image = client, image
        self.frozen, self.gpus = frozen, gpus
        self.tag = (image.tags or [image.short_id])[0]
        self._container = None
        self.stack: dict | None = None      # what probe_stack found

    def describe(self) -> str:
        code = "the image's own copy of the kit" if self.frozen else "the checkout's lab code"
        return f"running in the image {self.tag} ({self.image.short_id}) with {code}"

    def where_text(self) -> str:
        return f"in the image {self.tag}"

    def spec(self, command: list[str], environment: dict | None = None, name=None) -> JobSpec:
        return job_spec(self.tag, command, results_dir=self.results_dir, data_dir=self.data_dir,
                        frozen=self.frozen, gpus=self.gpus, host_uid=os.getuid(),
                        host_gid=os.getgid(), image_id=self.image.id,
                        image_labels=self.image.labels, environment=environment, name=name)

    def prepare(self, run_dir: str) -> None:
        hand_over(run_dir, self.results_dir)

    def hand_back(self, run_dir: str) -> None:
        hand_back(run_dir)

    def commands(self, job):
        cmd = launch.command(job.framework, job.backend, job.np, list(job.worker_args), python="python")
        # an image's own copy of the kit (--frozen) may predate the launcher: horovodrun itself
        return {self.tag: launch.lean_horovodrun(cmd, None if self.frozen else self.stack, "python")}

    def run(self, commands, env, timeout_s, echo, name=""):
        """One container for the job: (exit code or None at the time limit, last lines,
        why it ended). A lost connection to the engine is said as such."""
        import requests
        (command,) = commands.values()
        tail: list[str] = []
        try:
            try:
                self._container = self.client.containers.create(
                    **run_kwargs(self.spec(command, env, name or None)))
                # What the engine was given to run, as it says (the container's command).
                self.started = {self.tag: list(self._container.attrs["Config"]["Cmd"] or [])}
                self._container.start()
            except Exception as e:
                msg = docker_api.start_error_text(getattr(e, "explanation", None) or str(e))
                raise RunnerError(f"the container for {self.tag} did not start: {msg}") from None
            container = self._container

            def pump():
                for text in proc.iter_lines(container.logs(stream=True, follow=True)):
                    tail.append(text)
                    del tail[:-proc.TAIL_LINES]
                    echo(text)

            reader = threading.Thread(target=pump, daemon=True)
            reader.start()
            started = time.monotonic()
            try:
                status = container.wait(timeout=timeout_s if timeout_s > 0 else None)
                rc, why = status.get("StatusCode"), "exited"
            except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError) as e:
                # docker-py reports a wait that outlived its timeout as a ReadTimeout, or as
                # a ConnectionError once the engine has sent the response's headers
                # (docker/docker-py#1966): the time limit, when it has passed.
                if timeout_s > 0 and time.monotonic() - started >= timeout_s * 0.99:
                    container.kill()
                    rc, why = None, f"did not finish within {timeout_s:g} s and was stopped"
                else:
                    rc, why = 1, f"the connection to the Docker engine was lost ({type(e).__name__})"
            reader.join(timeout=5)
            return JobResult(rc, list(tail), why)
        finally:
            # Also on Ctrl-C and on any error: the container and every rank in it go.
            self.stop()

    def stop(self) -> None:
        if self._container is not None:
            left = docker_api.remove_container(self._container)
            if left:
                print(left, file=sys.stderr)
            self._container = None

    def probe_stack(self, timeout_s: float = 120) -> dict:
        """The probe's answer for this image, from the cache (lab.host.places.stack_cache): an
        image's content never changes, so its id (with the kit's copy it runs and the
        GPUs it is given) keys it."""
        self.stack = stack_cache.cached(stack_cache.image_key(self.image.id, self.frozen, self.gpus),
                                        lambda: super(ImageRunner, self).probe_stack(timeout_s),
                                        depends=False)
        return self.stack

    def output(self, argv: list[str], timeout_s: float = 300) -> tuple[int | None, str]:
        """Run a short command (a probe) and return its exit code and its output."""
        lines: list[str] = []
        res = self.run({self.tag: argv}, {}, timeout_s, lines.append)
        return res.returncode, "\n".join(lines)
