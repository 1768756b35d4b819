"""Running jobs inside the lab image: one container holding the N ranks of a node.

The pure part (`job_spec`) says what the container gets: the GPUs, shared memory for
NCCL, memlock unlimited, the results directory (read-write) and the data directory
(read-only) mounted, and the checkout's `lab` and `envcheck` on the PYTHONPATH unless
`frozen` (then the image's own copy runs). The edge (`ImageRunner`) starts it through
the Docker SDK, streams its output and removes it when the job ends, fails, times out or
is interrupted. Every container carries the label LABEL_KEY so that whatever is left
behind can be found (`leftovers`)."""
from __future__ import annotations

import collections
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
LABEL_KEY = "org.dl-lab-kit.managed-by"
LABEL_VALUE = "bench"
IMAGE_REPO = "dl-lab-kit"
SHM_SIZE = "2g"              # NCCL's shared-memory transport; Docker's default is 64 MB
RESULTS_IN = "/results"
DATA_IN = "/data"
SOURCE_IN = "/opt/lab-src"
IMAGE_UID = 1000             # the image's user `lab` (docker/Dockerfile)


class ContainerError(Exception):
    """No engine, no image, or a container that could not start: one sentence."""


@dataclass
class JobSpec:
    image: str
    command: list[str]
    environment: dict[str, str] = field(default_factory=dict)
    mounts: dict[str, tuple[str, str]] = field(default_factory=dict)   # host -> (inside, mode)
    user: str | None = None
    gpus: bool = False
    memlock_unlimited: bool = False
    labels: dict[str, str] = field(default_factory=dict)
    name: str | None = None


def candidate_images(device: str, framework: str, backend: str) -> list[str]:
    """The tags `bench` looks for, best first: the CPU image for CPU runs (a GPU image
    runs on a CPU too), for GPU runs the image whose GPU operations fit."""
    gpu = [f"{IMAGE_REPO}:gpu-nccl", f"{IMAGE_REPO}:gpu-mpi"]
    if framework == "horovod" and backend == "mpi":
        gpu.reverse()
    return [f"{IMAGE_REPO}:cpu", *gpu] if device == "cpu" else gpu


def job_spec(image: str, command: list[str], *, results_dir: str, data_dir: str | None,
             frozen: bool, gpus: bool, host_uid: int, host_gid: int,
             image_id: str = "", image_labels: dict | None = None,
             environment: dict | None = None, name: str | None = None) -> JobSpec:
    """What the container of one job gets. Host paths are made absolute."""
    env = {"PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1",
           "LAB_IMAGE_ID": image_id, "LAB_IMAGE_LABELS": json.dumps(image_labels or {})}
    env.update(environment or {})
    mounts = {os.path.abspath(results_dir): (RESULTS_IN, "rw")}
    if data_dir and os.path.isdir(data_dir):
        mounts[os.path.abspath(data_dir)] = (DATA_IN, "ro")
    if not frozen:
        for pkg in ("lab", "envcheck"):
            mounts[str(REPO_ROOT / pkg)] = (f"{SOURCE_IN}/{pkg}", "ro")
        env["PYTHONPATH"] = SOURCE_IN
    # Files the ranks write belong to the user who runs bench; root on the host runs
    # the job as the image's unprivileged user instead (bench hands it the run folder).
    user = None if host_uid == 0 else f"{host_uid}:{host_gid}"
    if user:
        env.setdefault("HOME", "/tmp")
    labels = {LABEL_KEY: LABEL_VALUE}
    # NCCL pins host memory: memlock unlimited with GPUs. Not asked for otherwise, since
    # an engine whose own limit is lower refuses it (seen here: 8 MiB, no CAP_SYS_RESOURCE).
    return JobSpec(image=image, command=list(command), environment=env, mounts=mounts,
                   user=user, gpus=gpus, memlock_unlimited=gpus, labels=labels, name=name)


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
        kw["device_requests"] = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    return kw


def connect():
    """A Docker client, or ContainerError saying why there is none."""
    try:
        import docker
    except ImportError:
        raise ContainerError("the Docker SDK is not installed") from None
    try:
        docker.from_env(timeout=10).ping()
        # No read timeout on the client that follows a job's output: a rank may print
        # nothing for minutes (ResNet-50 steps on a CPU); bench keeps the job's own limit.
        return docker.from_env(timeout=None)
    except Exception as e:
        raise ContainerError(f"no Docker engine is reachable ({type(e).__name__})") from None


def find_image(client, tags: list[str]):
    """The first of `tags` the engine has, or None."""
    import docker
    for tag in tags:
        try:
            return client.images.get(tag)
        except docker.errors.ImageNotFound:
            continue
    return None


def leftovers(client) -> list:
    """Containers `bench` started that still exist."""
    return client.containers.list(all=True, filters={"label": f"{LABEL_KEY}={LABEL_VALUE}"})


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


class ImageRunner:
    """Runs commands in containers of one image; each container is removed at the end."""

    def __init__(self, client, image, *, frozen: bool, gpus: bool, results_dir: str,
                 data_dir: str | None):
        self.client, self.image = client, image
        self.frozen, self.gpus = frozen, gpus
        self.results_dir, self.data_dir = results_dir, data_dir
        self.tag = (image.tags or [image.short_id])[0]

    def spec(self, command: list[str], environment: dict | None = None, name=None) -> JobSpec:
        return job_spec(self.tag, command, results_dir=self.results_dir, data_dir=self.data_dir,
                        frozen=self.frozen, gpus=self.gpus, host_uid=os.getuid(),
                        host_gid=os.getgid(), image_id=self.image.id,
                        image_labels=self.image.labels, environment=environment, name=name)

    def hand_over(self, path: str) -> None:
        hand_over(path, self.results_dir)

    def run(self, command: list[str], environment: dict | None, timeout_s: float, echo,
            name=None) -> tuple[int | None, list[str], str]:
        """Like bench.run_job: (exit code or None on timeout, last lines, why it ended)."""
        import requests
        tail: collections.deque[str] = collections.deque(maxlen=40)
        container = None
        try:
            try:
                container = self.client.containers.create(
                    **run_kwargs(self.spec(command, environment, name)))
                container.start()
            except Exception as e:
                msg = getattr(e, "explanation", None) or str(e)
                raise ContainerError(f"the container for {self.tag} did not start: {msg}") from None

            def pump():
                buf = b""
                for chunk in container.logs(stream=True, follow=True):
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        text = line.decode(errors="replace")
                        tail.append(text)
                        echo(text)
                if buf:
                    tail.append(buf.decode(errors="replace"))
                    echo(tail[-1])

            reader = threading.Thread(target=pump, daemon=True)
            reader.start()
            try:
                status = container.wait(timeout=timeout_s if timeout_s > 0 else None)
                rc, why = status.get("StatusCode"), "exited"
            except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
                container.kill()
                rc, why = None, f"did not finish within {timeout_s:g} s and was stopped"
            reader.join(timeout=5)
            return rc, list(tail), why
        finally:
            # Also on Ctrl-C and on any error: the container and every rank in it go.
            if container is not None:
                try:
                    container.remove(force=True)
                except Exception:
                    pass

    def output(self, command: list[str], timeout_s: float = 300) -> tuple[int | None, str]:
        """Run a short command (a probe) and return its exit code and its output."""
        lines: list[str] = []
        rc, _, _ = self.run(command, None, timeout_s, lines.append)
        return rc, "\n".join(lines)
