"""The CPU lab image, for real: a Docker engine runs containers of the image that
`invoke build` made, and jobs run inside them with the lab's worker. Every container
carries a label and is removed in a finally, so a failed test leaks nothing.
Skipped, with the reason, where no engine or no image is there (CI builds both)."""
import json
import os
import uuid

import pytest

from lab import results
from lab.images import IMAGE_REPO, LABEL_PREFIX
from tests.conftest import make_mnist_like

IMAGE = f"{IMAGE_REPO}:cpu"
TEST_LABEL = LABEL_PREFIX + "test"


def _client():
    try:
        import docker
        c = docker.from_env(timeout=300)
        c.ping()
        return c, None
    except Exception as e:
        return None, f"no Docker engine reachable ({type(e).__name__})"


@pytest.fixture(scope="module")
def image():
    client, why = _client()
    if client is None:
        pytest.skip(why)
    try:
        img = client.images.get(IMAGE)
    except Exception:
        pytest.skip(f"{IMAGE} is not built (invoke build --flavor cpu)")
    yield client, img
    leaked = client.containers.list(all=True, filters={"label": TEST_LABEL})
    for c in leaked:
        c.remove(force=True)
    assert not leaked, f"containers left behind: {[c.name for c in leaked]}"


def run_in_image(image, command, tmp_path, timeout=300):
    client, img = image
    res = tmp_path / "results"
    data = tmp_path / "data"
    res.mkdir(exist_ok=True)
    if not data.exists():
        make_mnist_like(data, train=768, test=256)
    for d in (res, data):
        os.chmod(d, 0o777)
    name = f"lab-test-{uuid.uuid4().hex[:8]}"
    container = client.containers.run(
        img.id, ["bash", "-c", command], name=name, detach=True, labels={TEST_LABEL: "1"},
        shm_size="1g", volumes={str(res): {"bind": "/results", "mode": "rw"},
                                str(data): {"bind": "/data", "mode": "ro"}},
        environment={"LAB_IMAGE_ID": img.id, "LAB_IMAGE_LABELS": json.dumps(img.labels)})
    try:
        status = container.wait(timeout=timeout)
        logs = container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)
    return status["StatusCode"], logs, res


WORKER = ("python -m lab.train --data mnist --data-dir /data --epochs 2 --batch-size 32 "
          "--warmup-steps 2 --results-dir /results --run-id img --expected-np 2")


@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_horovodrun_two_ranks_in_the_image(image, tmp_path, controller):
    rc, logs, res = run_in_image(
        image, f"horovodrun -np 2 -H localhost:2 --{controller} {WORKER} --framework horovod "
               f"--backend {controller}", tmp_path)
    assert rc == 0, logs[-3000:]
    recs, _ = results.read_records(res / "img" / results.RESULTS_FILE)
    r = recs[-1]
    assert r["world"]["np"] == 2 and r["world"]["controller"] == controller
    assert r["epochs"][-1]["train_loss"] < r["epochs"][0]["train_loss"]
    assert r["manifest"]["image"]["id"] == image[1].id
    assert json.loads(r["manifest"]["image"]["labels"])[LABEL_PREFIX + "horovod_version"]


def test_ddp_over_gloo_in_the_image(image, tmp_path):
    rc, logs, res = run_in_image(
        image, f"python -m torch.distributed.run --nproc-per-node=2 --standalone -m {WORKER[10:]} "
               f"--framework ddp", tmp_path)
    assert rc == 0, logs[-3000:]
    recs, _ = results.read_records(res / "img" / results.RESULTS_FILE)
    assert recs[-1]["world"]["np"] == 2 and recs[-1]["world"]["controller"] == "gloo"


def test_image_runs_jobs_as_an_unprivileged_user_and_holds_no_keys(image, tmp_path):
    rc, logs, _ = run_in_image(image, "id -u; ls /etc/ssh/ | grep -c ssh_host_ || true; "
                                      "ls ~/.ssh 2>/dev/null | wc -l", tmp_path)
    uid, host_keys, user_keys = logs.split()[:3]
    assert rc == 0 and uid != "0" and host_keys == "0" and user_keys == "0"
