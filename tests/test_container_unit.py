"""What a job's container gets (pure: no engine needed)."""
import json

import pytest

from lab.common.docker_api import MANAGED_BY
from lab.common.kit import REPO_ROOT
from lab.host import places as where
from lab.host.images import choice as images
from lab.host.places import image as container


def spec(**kw):
    args = dict(results_dir="results", data_dir=None, frozen=False, gpus=False,
                host_uid=1234, host_gid=5678, image_id="sha256:ab", image_labels={"a": "1"})
    args.update(kw)
    return container.job_spec("dl-lab-kit:cpu", ["python", "-m", "lab.worker.train"], **args)


def test_results_mounted_read_write_data_read_only_and_the_checkout_on_the_path(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    s = spec(results_dir=str(tmp_path / "res"), data_dir=str(data))
    assert s.mounts[str(tmp_path / "res")] == ("/results", "rw")
    assert s.mounts[str(data)] == ("/data", "ro")
    assert s.mounts[str(REPO_ROOT / "lab")] == ("/opt/lab-src/lab", "ro")
    assert s.environment["PYTHONPATH"] == "/opt/lab-src"
    assert s.environment["LAB_IMAGE_ID"] == "sha256:ab"
    assert json.loads(s.environment["LAB_IMAGE_LABELS"]) == {"a": "1"}
    assert s.labels == {MANAGED_BY: container.LABEL_VALUE}


def test_frozen_leaves_the_checkout_out():
    s = spec(frozen=True)
    assert "PYTHONPATH" not in s.environment
    assert all(not inside.startswith("/opt/lab-src") for inside, _ in s.mounts.values())


def test_a_missing_data_folder_is_not_mounted(tmp_path):
    assert "/data" not in [b for b, _ in spec(data_dir=str(tmp_path / "none")).mounts.values()]


def test_ranks_write_as_the_user_who_runs_bench_and_root_becomes_the_image_user():
    assert spec().user == "1234:5678" and spec().environment["HOME"] == "/tmp"
    assert spec(host_uid=0, host_gid=0).user is None        # the image's USER (lab, 1000)


def test_gpus_bring_device_requests_and_unlimited_memlock(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    kw = container.run_kwargs(spec(gpus=True))
    assert kw["device_requests"][0]["Capabilities"] == [["gpu"]]
    assert kw["device_requests"][0]["Count"] == -1
    assert kw["ulimits"][0]["Name"] == "memlock" and kw["ulimits"][0]["Hard"] == -1
    kw = container.run_kwargs(spec())
    assert "device_requests" not in kw and "ulimits" not in kw
    assert kw["shm_size"] == container.SHM_SIZE and kw["init"] is True


def test_a_hosts_cuda_visible_devices_picks_the_containers_gpus(monkeypatch):
    """moby's DeviceRequest: DeviceIDs for some GPUs (docker run --gpus '"device=1,3"'),
    Count -1 for all; the variable itself stays outside (inside, GPUs count from 0)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1, 3")
    s = spec(gpus=True)
    [req] = container.run_kwargs(s)["device_requests"]
    assert req["DeviceIDs"] == ["1", "3"] and req["Count"] == 0     # moby refuses both set
    assert "CUDA_VISIBLE_DEVICES" not in s.environment
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8f6c1a2e-0000-1111-2222-333344445555,-1,2")
    assert spec(gpus=True).gpu_ids == ["GPU-8f6c1a2e-0000-1111-2222-333344445555"]
    assert spec(gpus=False).gpu_ids is None        # CPU runs get no GPU at all
    for hidden in ("", "-1"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
        with pytest.raises(images.RunnerError, match="hides every GPU"):
            spec(gpus=True)


def test_which_image_fits_the_run():
    assert images.candidate_images("cpu", "ddp", "gloo")[0] == "dl-lab-kit:cpu"
    # Horovod on GPUs: only the image whose GPU operations carry the back end.
    assert images.candidate_images("cuda", "horovod", "nccl") == ["dl-lab-kit:gpu-nccl"]
    assert images.candidate_images("cuda", "horovod", "gloo") == ["dl-lab-kit:gpu-nccl"]
    assert images.candidate_images("cuda", "horovod", "mpi") == ["dl-lab-kit:gpu-mpi"]
    assert images.candidate_images("cuda", "ddp", "nccl") == [
        "dl-lab-kit:gpu-nccl", "dl-lab-kit:gpu-mpi"]


def test_where_must_be_known():
    with pytest.raises(images.RunnerError, match="local, image, auto"):
        where.choose_runner(where="cloud")
    runner, note = where.choose_runner(where="local")
    assert runner.kind == "local" and note is None


def test_an_image_demanded_without_an_engine_is_one_sentence(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(images.RunnerError, match="no Docker engine is reachable.*--local"):
        where.choose_runner(where="image")
    runner, note = where.choose_runner(where="auto")
    assert runner.kind == "local" and note.startswith("running as local processes: no Docker engine")


def test_the_engine_client_leaves_no_connection_open_behind_it():
    """docker_api.client() pings with a client of its own before returning another: the
    ping's must be closed, or every call leaves a socket to the engine open."""
    import os

    from lab.common import docker_api
    try:
        docker_api.client().close()
    except docker_api.DockerUnavailable as e:
        pytest.skip(str(e))

    def sockets():
        found = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                found += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
            except FileNotFoundError:       # the listing's own descriptor, closed by now
                pass
        return found
    before = sockets()
    for _ in range(5):
        docker_api.client().close()
    assert sockets() == before


class _BusyContainer:
    """A container whose first forced removal the engine refuses as moby does while it is
    still killing it (409, daemon/delete.go: "removal of container ... is already in
    progress") and which stays listed until the second."""
    short_id = "5c03dbc5a53f"

    def __init__(self, refusals):
        self.refusals, self.removed = refusals, False

    def remove(self, force=False):
        import docker
        assert force
        if self.refusals:
            self.refusals -= 1
            raise docker.errors.APIError("409 Conflict", explanation=(
                f"removal of container {self.short_id} is already in progress"))
        self.removed = True

    def reload(self):
        import docker
        if self.removed:
            raise docker.errors.NotFound("No such container")


def test_a_container_the_engine_is_busy_removing_is_waited_for_and_one_never_gone_is_named():
    from lab.common.docker_api import remove_container
    busy = _BusyContainer(refusals=2)
    assert remove_container(busy, wait_s=10) is None and busy.removed
    stuck = _BusyContainer(refusals=10**6)
    left = remove_container(stuck, wait_s=0.6)
    assert "5c03dbc5a53f could not be removed (removal of container" in left
    assert "invoke clean --jobs-only" in left
