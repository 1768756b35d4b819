"""Where a job's ranks run: the factory over the runners. It imports the concrete runners
(lab.host.places.image, lab.host.places.compose.runner), which import the interface
(lab.host.places.base) — never the other way, so there is no circle."""
from __future__ import annotations

from lab.host import images
from lab.host.errors import RunnerError
from lab.host.places.base import WHERE, Runner
from lab.host.places.local import LocalRunner


def choose_runner(*, where: str = "auto", nodes: int = 1, image: str = "", frozen: bool = False,
                  device: str = "cpu", framework: str = "auto", backend: str = "gloo",
                  results_dir: str = "results", data_dir: str | None = "data",
                  check_gpu_code: bool = True, launcher: str = "direct", partition: str = "",
                  k8s=None, echo=print) -> tuple[Runner, str | None]:
    """(runner, a line saying where the ranks run or why not where asked). `nodes` > 1:
    the cluster's nodes. `auto`: the lab image when an engine and an image are there,
    else local processes with one line saying why; `image` (or a named image) insists on
    the image; `local` never looks. For GPU runs the image must have code for the
    host's GPUs (refused in one sentence, unless check_gpu_code is False: doctor
    reports it as a finding instead). launcher "slurm": a batch job of the cluster's
    Slurm, on `nodes` of its nodes; "k8s": a Kubeflow job on the kubeconfig's cluster
    (`k8s`: its options, lab.host.places.k8s.runner.Settings)."""
    if where not in WHERE:
        raise RunnerError(f"where the job runs must be one of {', '.join(WHERE)}, not {where!r}")
    if launcher == "k8s":
        from lab.host.places.k8s.runner import K8sRunner
        runner = K8sRunner(nodes, device, image, results_dir, data_dir, settings=k8s, backend=backend)
        return runner, runner.describe()
    if launcher == "slurm":
        from lab.host.places.slurm.runner import SlurmClusterRunner
        runner = SlurmClusterRunner(nodes, frozen=frozen, partition=partition, echo=echo)
        return runner, runner.describe()
    if nodes > 1:
        from lab.host.places.compose.runner import ClusterRunner
        runner = ClusterRunner(nodes, frozen=frozen, echo=echo)
        return runner, runner.describe()
    if where == "local":
        return LocalRunner(results_dir, data_dir), None
    from lab.common import docker_api
    from lab.host.places.image import ImageRunner
    tags = [image] if image else images.candidate_images(
        device, "horovod" if framework == "auto" else framework, backend, images.matrix_cudas())
    insist = where == "image" or bool(image)
    try:
        cli = docker_api.client()
    except docker_api.DockerUnavailable as e:
        if insist:
            raise RunnerError(f"{e}: {docker_api.START_HINT}, or run with --local") from None
        return LocalRunner(results_dir, data_dir), (
            f"running as local processes: {e} (--local says so and skips the check)")
    img = docker_api.find_image(cli, tags)
    if device == "cuda" and img is not None:
        img = images.gpu_image(cli, tags, check=check_gpu_code) or img
    if img is None:
        if insist:
            raise RunnerError(f"no image {' or '.join(tags)} is built: run `invoke build`, "
                              f"or run with --local")
        return LocalRunner(results_dir, data_dir), (
            f"running as local processes: no lab image ({', '.join(tags)}) is built "
            f"(`invoke build` makes one; --local skips the check)")
    runner = ImageRunner(cli, img, frozen=frozen, gpus=device == "cuda",
                         results_dir=results_dir, data_dir=data_dir)
    return runner, runner.describe()
